#!/usr/bin/env bash
# Build the folder the `device` tool carries to a lent GPU machine (issue 27), whose image has
# jax/flax/optax/orbax/sentencepiece but not dp-accounting, the data-only packages or gensim, and
# no network. Run here, once, after `make setup`:
#   bash benchmarks/gpu_carry.sh            # -> .gpu/ (ignored), ~58 MiB; the device limit is 64
# It holds: site/ (dp_accounting, chitchat_dataset, popquotes, and gensim's two public-pool test
# files under a gensim stub that refuses import), cache/ (FEDPRIV_CACHE: the parsed corpora and the
# SentencePiece-32K model of lm_fl:paper, so the GPU machine never needs gensim). Then a preflight:
# 2 rounds of lm_fl:paper with the packages the GPU image lacks refused at import
# (benchmarks/gpu_preflight.py). On the device: run(command="bash benchmarks/gpu_lease.sh",
# carry=[".gpu"]).
set -eu
C=$(realpath -m "${CARRY:-.gpu}")
SP=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$C/site" "$C/cache"; mkdir -p "$C/site/gensim/test/test_data" "$C/cache"
cp -r "$SP"/{dp_accounting,chitchat_dataset,popquotes} "$C/site/"
cp "$SP"/gensim/test/test_data/{enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2,lee_background.cor} \
   "$C/site/gensim/test/test_data/"
echo 'raise ImportError("gensim stub: only its test data travels to the GPU machine")' > "$C/site/gensim/__init__.py"
find "$C" -name __pycache__ -prune -exec rm -rf {} +
ARGS=(--config "configs/lm_fl.py:paper,rounds=2,cohort_size=4,noise_cohort_size=100,eval_every=2,checkpoint_every=2,max_eval_examples=200")
W=$(mktemp -d)
FEDPRIV_CACHE=$C/cache .venv/bin/python -m experiments.lm_fl "${ARGS[@]}" --workdir "$W/fill" > /dev/null
FEDPRIV_CACHE=$C/cache PYTHONPATH=$C/site:$PWD .venv/bin/python benchmarks/gpu_preflight.py \
  -m experiments.lm_fl "${ARGS[@]}" --workdir "$W/preflight" > /dev/null
rm -rf "$W" "$C/cache/xla"
du -sh "$C"
