#!/usr/bin/env bash
# One Wang et al. run end to end, before vs after (issue 27's end-to-end figure, paired):
#   bash benchmarks/wang_run_ab.sh [BEFORE=025f75c] [AFTER=HEAD]      (~40 min on 2 cores: 4 min of
#   warm-up, two pairs of ~14 min)
# Regenerating the Wang artefacts from empty is 168 runs like these (run_store/wang2: 32,756 s
# of one-core wall at the new code); this times two of them (`none` and `pretrain_distill`: LSTM,
# eps 1.77, seed 0, 800 rounds, cohort 16, the store's config but for `simulated_population`,
# which the old code refused beside the noise cohort: it sets only the noise multiplier, not the
# computation's cost) at both commits, each in a detached worktree
# of the commit, run with this checkout's .venv. The two sides run at once, pinned to one core
# each (`taskset`), then again with the cores swapped: two pairs. An untimed 2-round run of each
# side first fills that commit's data caches (~/.cache/fedpriv), so corpus preparation is not
# part of the difference; each side's teacher passes are (each workdir scores the teacher anew,
# as a lane does). Prints one line per run: pair, commit, core, exit code, wall seconds, user+sys
# CPU seconds. A figure, not a test; results: benchmarks/results/cpu_2core/wang_run_ab_*.md.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BEFORE=$(git -C "$ROOT" rev-parse --short "${1:-025f75c}^{commit}") || { echo "no commit ${1:-025f75c}"; exit 2; }
AFTER=$(git -C "$ROOT" rev-parse --short "${2:-HEAD}^{commit}") || { echo "no commit ${2:-HEAD}"; exit 2; }
W=$(mktemp -d /tmp/wang_run_ab.XXXX)
# the worktrees go on any exit (a failed warm-up too); logs and workdirs stay in $W
trap 'for c in "$BEFORE" "$AFTER"; do git -C "$ROOT" worktree remove --force "$W/wt_$c" 2> /dev/null; done' EXIT
for c in "$BEFORE" "$AFTER"; do
  git -C "$ROOT" worktree add --detach "$W/wt_$c" "$c" > /dev/null && ln -s "$ROOT/.venv" "$W/wt_$c/.venv" || exit 1
done
CFG="configs/public_training.py:small,clip_norm=1.0,seeds=0,epsilons=1.77,server_lr=0.05,arch=lstm,rows=none/pretrain_distill"
for c in "$BEFORE" "$AFTER"; do
  (cd "$W/wt_$c" && .venv/bin/python -m experiments.public_training \
     --config "$CFG,rounds=2,eval_every=2,checkpoint_every=2" --workdir "$W/warm_$c" > "$W/warm_$c.log" 2>&1) \
    || { echo "warm-up at $c failed: $W/warm_$c.log"; exit 1; }
done
run() {  # commit core pair
  local s; s=$(date +%s.%N)
  (cd "$W/wt_$1" && /usr/bin/time -f "%U %S" -o "$W/time_$3_$1" taskset -c "$2" .venv/bin/python \
     -m experiments.public_training --config "$CFG,rounds=800,eval_every=100,checkpoint_every=100" \
     --workdir "$W/run_$3_$1" > "$W/run_$3_$1.log" 2>&1)
  local rc=$? e; e=$(date +%s.%N)
  echo "pair $3 $1 core $2 rc=$rc wall $(python3 -c "print(round($e - $s, 1))") s cpu $(awk '{print $1 + $2}' "$W/time_$3_$1") s"
}
run "$BEFORE" 0 1 & run "$AFTER" 1 1 & wait
run "$BEFORE" 1 2 & run "$AFTER" 0 2 & wait
echo "logs and workdirs: $W"
