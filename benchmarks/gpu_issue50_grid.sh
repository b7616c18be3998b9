#!/usr/bin/env bash
# Issue 50, the GPU lease's last minutes: does a lower server lr stop the divergence of Wang Table 2's
# `paper` students at the full vocabulary (benchmarks/results/gpu_h200.md)? Four 200-round runs of
# row none at eps 1.77 at once on the one GPU (shared: no timings), after the GGUF's parts reached
# /tmp/fp in earlier calls to this warm machine (`bash benchmarks/gpu_issue50.sh stash A`, then
# `stash B`) and with .gpuC/sc.tar.xz carried. Per run: metrics.jsonl (update norms, non-finite clients, evaluations) in $OUT/grid.tgz.
set -u
K=/tmp/fp; cd "$(dirname "$0")/.."
cat $K/a.part $K/b.part > $K/teacher.gguf
echo "$(cat $K/gguf.sha256)  $K/teacher.gguf" | sha256sum -c || exit 4
tar -xJf .gpuC/sc.tar.xz -C $K
export PYTHONUNBUFFERED=1 FEDPRIV_CACHE=$K/cache PYTHONPATH=$K/site:$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.2
B="configs/public_training.py:paper,epsilons=1.77,rows=none,seeds=0,rounds=${ROUNDS:-200},eval_every=100,checkpoint_every=100,teacher_path=$K/teacher.gguf,teacher_batch_size=512"
run() { timeout ${T:-215} python3 -m experiments.public_training --config "$B,$2" --workdir $K/g/$1 > $K/$1.log 2>&1; echo "$1 exit $?"; }
run tf_s005_c01 "arch=transformer,archs=transformer,student_server_lrs=0.005,server_lr=0.005,client_lr=0.1" &
run tf_s002_c01 "arch=transformer,archs=transformer,student_server_lrs=0.002,server_lr=0.002,client_lr=0.1" &
run lstm_s001_c05 "arch=lstm,archs=lstm,student_server_lrs=0.01,server_lr=0.01,client_lr=0.5" &
run lstm_s0005_c05 "arch=lstm,archs=lstm,student_server_lrs=0.005,server_lr=0.005,client_lr=0.5" &
wait
find $K/g -name metrics.jsonl -o -name summary.json | tar czf $OUT/grid.tgz -T - 2>/dev/null
tail -n 2 $K/*.log > $OUT/tails.txt 2>&1
