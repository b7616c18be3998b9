#!/usr/bin/env bash
# The GPU items of issue 50, over three device calls to one warm machine (the public LLM's GGUF is
# over one call's 64 MiB; `bash benchmarks/gpu_carry_teacher.sh` here first), each at once after
# the last (a machine idle for 30 s is given back):
#   run(command="bash benchmarks/gpu_issue50.sh stash A", carry=[".gpuA"], timeout_s=30)
#   run(command="bash benchmarks/gpu_issue50.sh stash B", carry=[".gpuB"], timeout_s=30)
#   run(command="bash benchmarks/gpu_issue50.sh run", carry=[".gpuC"], timeout_s=560)
# `run`: (1) one Transformer `paper` run of Wang Table 2 (row none, eps 1.77, full 49,152-id teacher
# vocabulary, cohort 100, 256 examples / 16 local steps per client; client lr 0.1: at the config's
# 0.5 a quarter of fresh clients diverge to NaN in 16 local steps, measured on the CPU) for ROUNDS rounds: s/round from
# the run's own wall clock, peak GPU memory from nvidia-smi; (2) a public pool synthesised by the
# public LLM (fedpriv.public.synthetic, Wu et al. 2024) until the deadline. Everything in $OUT.
set -u
T0=$(date +%s); DEADLINE=${DEADLINE:-530}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
K=${K:-/tmp/fp}; mkdir -p $K
LOG=$OUT/log.txt
if [ "$1" = stash ]; then
  [ "$2" = A ] && cp .gpuA/gguf.part $K/a.part
  [ "$2" = B ] && cp .gpuB/gguf.part $K/b.part && cp .gpuB/gguf.sha256 $K/
  ls -la $K >> $LOG
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c 'import jax;print(jax.__version__, jax.devices())'; } >> $LOG 2>&1
  exit 0
fi
for p in a b; do [ -f $K/$p.part ] || { echo "GGUF part $p missing: not the warm machine of the stash calls" | tee -a $LOG; exit 3; }; done
cat $K/a.part $K/b.part > $K/teacher.gguf
echo "$(cat $K/gguf.sha256)  $K/teacher.gguf" | sha256sum -c >> $LOG 2>&1 || { echo "GGUF sha256 mismatch" | tee -a $LOG; exit 4; }
tar -xJf .gpuC/sc.tar.xz -C $K
export PYTHONUNBUFFERED=1 FEDPRIV_CACHE=$K/cache PYTHONPATH=$K/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c 'import jax,flax,optax;print("jax",jax.__version__,"flax",flax.__version__,"optax",optax.__version__,jax.devices())'; git rev-parse HEAD; git status --short; } >> $LOG 2>&1
echo "setup done at $(( $(date +%s) - T0 )) s" >> $LOG
# 1. the Transformer paper run
ROUNDS=${ROUNDS:-300}
CFG="configs/public_training.py:paper,arch=transformer,archs=transformer,student_server_lrs=0.02,server_lr=0.02,epsilons=1.77,rows=none,seeds=0,rounds=$ROUNDS,eval_every=$((ROUNDS / 2)),checkpoint_every=$((ROUNDS / 2)),teacher_path=$K/teacher.gguf,teacher_batch_size=512,client_lr=${CLIENT_LR:-0.1}${CFG_EXTRA:-}"
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 500 > $OUT/mem_fl.csv &
M=$!
timeout ${FL_TIMEOUT:-280} python3 -m experiments.public_training --config "$CFG" --workdir $K/fl > $OUT/fl.log 2>&1
echo "fl exit $? at $(( $(date +%s) - T0 )) s" >> $LOG
kill $M
tar czf $OUT/fl.tgz --exclude=checkpoints --exclude=teacher_cache -C $K fl 2>> $LOG
# 2. the synthetic public pool, until the deadline (a chunk boundary)
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 1000 > $OUT/mem_gen.csv &
M=$!
D=$(( $(left) - 45 ))
[ $D -gt 30 ] && python3 -m fedpriv.public.synthetic --out $K/pool/smollm2_chat.txt --messages ${MESSAGES:-120000} \
  --batch-size ${GEN_BATCH:-1024} --deadline-s $D --teacher $K/teacher.gguf > $OUT/gen.log 2>&1
echo "gen exit $? at $(( $(date +%s) - T0 )) s" >> $LOG
kill $M
xz -T4 -6 -c $K/pool/smollm2_chat.txt > $OUT/smollm2_chat.txt.xz 2>> $LOG
cp $K/pool/smollm2_chat.txt.json $OUT/ 2>> $LOG
echo "total $(( $(date +%s) - T0 )) s" >> $LOG
