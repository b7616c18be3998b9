#!/usr/bin/env bash
# The GPU measurements of issue 27 (run by the `device` tool on a lent H100/H200; CI never runs
# it): benchmarks.round at cohorts 16 / 100 / 1000 and 100 x 256 full clients, LSTM and
# Transformer, float32 and bfloat16 client compute. Each case writes $OUT/<name>.json; a summary
# table is printed at the end (benchmarks/gpu_table.py). Usage:
#   OUT=/tmp/gpu bash benchmarks/gpu_suite.sh [case ...]     (default: every case, in order)
# EXTRA="--batching padded" appends flags to every case (argparse keeps the last value).
set -u
OUT=${OUT:-runs/bench/gpu}
mkdir -p "$OUT"
PY=${PY:-python3}
declare -A CASES=(
  [lstm_c16_f32]="--clients 16 --rounds 3"
  [lstm_c100_f32]="--clients 100 --rounds 3 --no-ceiling"
  [lstm_c100_bf16]="--clients 100 --rounds 3 --no-ceiling --compute-dtype bfloat16"
  [lstm_c100x256_f32]="--clients 100 --client-size 256 --rounds 2 --batching padded"
  [lstm_c100x256_bf16]="--clients 100 --client-size 256 --rounds 2 --batching padded --compute-dtype bfloat16"
  [tf_c100_f32]="--arch transformer --clients 100 --rounds 3 --no-ceiling"
  [tf_c100_bf16]="--arch transformer --clients 100 --rounds 3 --no-ceiling --compute-dtype bfloat16"
  [lstm_c1000_f32]="--clients 1000 --population 5000 --rounds 2 --no-ceiling --batching padded"
  [tf_c16_f32]="--arch transformer --clients 16 --rounds 3"
  [tf_c100x256_f32]="--arch transformer --clients 100 --client-size 256 --rounds 2 --batching padded"
  [tf_c100x256_bf16]="--arch transformer --clients 100 --client-size 256 --rounds 2 --batching padded --compute-dtype bfloat16"
  [tf_c1000_f32]="--arch transformer --clients 1000 --population 5000 --rounds 2 --no-ceiling --batching padded"
)
ORDER=(lstm_c16_f32 lstm_c100_f32 lstm_c100x256_f32 lstm_c100_bf16 lstm_c100x256_bf16 tf_c100_f32
       tf_c100_bf16 lstm_c1000_f32 tf_c16_f32 tf_c100x256_f32 tf_c100x256_bf16 tf_c1000_f32)
[ $# -gt 0 ] && ORDER=("$@")
for name in "${ORDER[@]}"; do
  echo "=== $name: ${CASES[$name]} ${EXTRA:-} XLA_FLAGS=${XLA_FLAGS:-}" | tee -a "$OUT/log.txt"
  start=$(date +%s)
  timeout "${CASE_TIMEOUT:-240}" $PY -m benchmarks.round --workload so --packing-cohorts 100 \
      ${CASES[$name]} ${EXTRA:-} --json > "$OUT/$name.json" 2>> "$OUT/log.txt" \
    || echo "$name: exit $?" | tee -a "$OUT/log.txt"
  echo "$name: $(( $(date +%s) - start )) s wall" | tee -a "$OUT/log.txt"
done
$PY -m benchmarks.gpu_table "$OUT"/*.json | tee "$OUT/table.md"
