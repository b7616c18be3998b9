#!/usr/bin/env bash
# The GPU measurements still missing for issue 27, as one device call that ends inside its limit:
#   run(command="bash benchmarks/gpu_lease.sh", carry=[".gpu"], timeout_s=600)
# after `bash benchmarks/gpu_carry.sh` here. (1) a paired f32/bf16 learning run of lm_fl:paper at
# the eps-18.71 noise (same seed: same cohorts and noise; 400 rounds) for each seed of SEEDS
# (default 0; every run of the pairs at once on the one GPU), (2) benchmarks.round on the
# Transformer f32/bf16 with XLA's default autotuning, LSTM cohorts 16 / 1000, while time is left
# (BENCH="" skips them). Everything lands in $OUT (log.txt, table.md, runs.tgz without checkpoints).
set -u
T0=$(date +%s); DEADLINE=${DEADLINE:-575}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
export PYTHONUNBUFFERED=1 FEDPRIV_CACHE=$PWD/.gpu/cache PYTHONPATH=$PWD/.gpu/site:$PWD
PY=${PY:-python3}
W=/tmp/g; mkdir -p $W/bench
LOG=$OUT/log.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; $PY -c 'import jax,flax,optax;print("jax",jax.__version__,"flax",flax.__version__,"optax",optax.__version__,jax.devices())'; git rev-parse HEAD 2>/dev/null; } >> $LOG 2>&1
# 1. paired learning runs: same seed (same cohorts, same noise draws), client compute f32 vs bf16,
#    run side by side on the one GPU (each with 0.8 / (2 x seeds) of its memory): their wall times
#    are shared.
SEEDS=${SEEDS:-0}; NS=$(echo $SEEDS | wc -w)
CFG="configs/lm_fl.py:paper,rounds=${PAIR_ROUNDS:-400},eval_every=200,checkpoint_every=1000,noise_multiplier=1.13"
for s in $SEEDS; do for p in float32 bfloat16; do
  n=pair_$p; [ "$SEEDS" = 0 ] || n=pair_s${s}_$p
  XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.8 / (2 * $NS), 2))") \
    timeout $(( $(left) - ${BENCH_RESERVE:-275} )) $PY -m experiments.lm_fl \
    --config "$CFG,client_compute=$p,seed=$s" --workdir $W/$n > $W/$n.log 2>&1 &
done; done
wait
echo "pair done at $(( $(date +%s) - T0 )) s" >> $LOG
tail -n 3 $W/pair_*.log >> $LOG
# 2. benchmarks (sequential, the GPU to themselves)
for c in ${BENCH-tf_c100_f32 tf_c100_bf16 lstm_c16_f32 lstm_c1000_f32}; do
  l=$(left); [ $l -lt 60 ] && { echo "skip $c: $l s left" >> $LOG; continue; }
  ct=$(( l - 15 )); [ $ct -gt 200 ] && ct=200
  CASE_TIMEOUT=$ct EXTRA="--batching padded" OUT=$W/bench PY=$PY bash benchmarks/gpu_suite.sh $c
done
cat $W/bench/log.txt >> $LOG
cp $W/bench/table.md $OUT/ 2>/dev/null
tar czf $OUT/runs.tgz --exclude=checkpoints -C $W . 2>> $LOG
echo "total $(( $(date +%s) - T0 )) s" >> $LOG
