#!/usr/bin/env bash
# Build the three folders the `device` tool carries for the GPU items of issue 50 (run here, once,
# after `make setup`): the public LLM's GGUF (98 MB) exceeds one call's 64 MiB (with the ~12 MB
# working tree), so it travels in parts over three calls to one warm machine:
#   .gpuA/  the GGUF's first SPLIT bytes                  (call 1: benchmarks/gpu_issue50.sh stash A)
#   .gpuB/  the rest and its sha256                       (call 2: benchmarks/gpu_issue50.sh stash B)
#   .gpuC/  sc.tar.xz: site/ (the pure-Python packages the GPU image lacks: dp_accounting, gguf,
#           chitchat_dataset, popquotes, gensim's two public-pool files under a stub that refuses
#           import) and cache/ (FEDPRIV_CACHE: the parsed corpora, so the GPU machine never needs
#           gensim)                                        (call 3: benchmarks/gpu_issue50.sh run)
# A call carrying 66.1 MB in all was refused, 62.1 MB passed (2026-11-30).
# Then a preflight: a 2-round public_training `paper` Transformer run and a 16-message synthetic
# pool with the packages the GPU image lacks refused at import (benchmarks/gpu_preflight.py).
set -eu
SPLIT=${SPLIT:-50000000}  # bytes of the GGUF in .gpuA
SP=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
G=$(.venv/bin/python -c 'from fedpriv.models.gguf import find_teacher_gguf; print(find_teacher_gguf())')
rm -rf .gpuA .gpuB .gpuC; mkdir -p .gpuA .gpuC/site/gensim/test/test_data .gpuC/cache .gpuB
for d in A B C; do grep -qx "/.gpu$d/" .git/info/exclude 2>/dev/null || echo "/.gpu$d/" >> .git/info/exclude; done
head -c $SPLIT "$G" > .gpuA/gguf.part
tail -c +$((SPLIT + 1)) "$G" > .gpuB/gguf.part
sha256sum "$G" | cut -d' ' -f1 > .gpuB/gguf.sha256
cp -r "$SP"/{dp_accounting,gguf,chitchat_dataset,popquotes} .gpuC/site/
cp "$SP"/gensim/test/test_data/{enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2,lee_background.cor} \
   .gpuC/site/gensim/test/test_data/
echo 'raise ImportError("gensim stub: only its test data travels to the GPU machine")' > .gpuC/site/gensim/__init__.py
find .gpuC -name __pycache__ -prune -exec rm -rf {} +
W=$(mktemp -d)
CFG="configs/public_training.py:paper,arch=transformer,archs=transformer,student_server_lrs=0.02,server_lr=0.02,epsilons=1.77,rows=none,seeds=0,rounds=2,cohort_size=4,noise_cohort_size=100,eval_every=2,checkpoint_every=2,max_eval_examples=200,pool_size=64,teacher_batch_size=64"
# fill the cache with the venv's own packages, then run as on the GPU image (gguf travels: allowed)
FEDPRIV_CACHE=$PWD/.gpuC/cache .venv/bin/python -m experiments.public_training --config "$CFG" --workdir "$W/fill" > /dev/null
FEDPRIV_CACHE=$PWD/.gpuC/cache PYTHONPATH=$PWD/.gpuC/site:$PWD GPU_PREFLIGHT_ALLOW=gguf .venv/bin/python \
  benchmarks/gpu_preflight.py -m experiments.public_training --config "$CFG,teacher_path=$G" --workdir "$W/preflight" > /dev/null
FEDPRIV_CACHE=$PWD/.gpuC/cache PYTHONPATH=$PWD/.gpuC/site:$PWD GPU_PREFLIGHT_ALLOW=gguf .venv/bin/python \
  benchmarks/gpu_preflight.py -m fedpriv.public.synthetic --out "$W/pool.txt" --messages 16 --chunk 16 \
  --batch-size 16 --max-new 8 --teacher "$G" > /dev/null
git checkout -q experiments/results/summaries/public_training.json experiments/results/wang-table2-public_training.png
rm -rf "$W" .gpuC/cache/gguf .gpuC/cache/xla
tar -cJf .gpuC/sc.tar.xz -C .gpuC site cache
rm -rf .gpuC/site .gpuC/cache
du -sh .gpuA .gpuB .gpuC; echo "working tree bytes: $(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s | awk "{s+=\$1} END {print s}")"
