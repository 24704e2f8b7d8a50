#!/usr/bin/env bash
# kill -9 of one rank during a background checkpoint write (checkpoint.async_save), at 20 points drawn
# with a fixed seed: a byte offset into a rank's shard files (part of a file on disk), the moment its
# writer is done but the checkpoint not yet committed, and rank 0's commit steps (shards, meta,
# rename, latest); 6 in a 2-rank job (DP 2, distributed optimizer: both write), 14 in a 1-rank one
# (an mpirun's teardown after a kill costs ~1.5 s). Each trial resumes from what the one before left
# (so every latest file must load), saves at +2 (completed before the next save starts) and is
# killed in the save at +4, whose writer starts each file 10 ms late while training goes on. The
# latest must be +2 (+4 when killed after the latest file), never a partial checkpoint, and every
# iteration any trial trained is bitwise the uninterrupted run's.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
source "$TPTRAIN_SRC/tests/cli/checkpoint_lib.sh"
# chain NAME NP TRIALS [layout args]: TRIALS kills in a row on NP ranks (the victim: rank NP-1 for a
# byte offset or "written", rank 0 for the commit's steps). exit_signal SIGUSR2: mpirun's SIGTERM to
# the other ranks then ends them at once.
chain() {
  local name=$1 np=$2 trials=$3; shift 3
  local victim=$((np - 1)) D=$W/$name latest=2 points=() trial spec kill_at want got rc why
  tpt "$np" "${name}_ref" "$@" --set training.train_iters=$((4 * trials + 8)) --set logging.metrics_file="$W/${name}_ref.jsonl" ||
    bad "${name}_ref"
  tpt "$np" "${name}_first" "$@" --set training.train_iters=2 --set checkpoint.save="$D" --set checkpoint.save_interval=2 ||
    bad "${name}_first"
  for trial in $(seq "$trials"); do
    # one point in four a named one, else a byte offset into the victim's shards (~330 KB on 2 ranks)
    case $((RANDOM % 8)) in
      0) spec="$victim/written" ;; 1) spec="0/shards" ;; 2) spec="0/meta" ;; 3) spec="0/rename" ;; 4) spec="0/latest" ;;
      *) spec="$victim/bytes:$(( (RANDOM * 32768 + RANDOM) % (660000 / np) ))" ;;
    esac
    kill_at=$((latest + 4))
    TPTRAIN_TEST_KILL="$spec@$kill_at" TPTRAIN_TEST_WRITE_DELAY_MS=10 tpt "$np" "$name$trial" "$@" \
      --set checkpoint.load="$D" --set checkpoint.save="$D" --set checkpoint.async_save=true \
      --set checkpoint.save_interval=2 --set training.train_iters=$((kill_at + 2)) --set checkpoint.exit_signal=SIGUSR2 \
      --set logging.metrics_file="$W/$name$trial.jsonl"
    rc=$?
    want=$((latest + 2)); [ "$spec" = 0/latest ] && want=$kill_at
    got=$(cat "$D/latest_checkpointed_iteration.txt" 2>/dev/null)
    why=""
    { [ $rc -eq 0 ] || [ $rc -eq 2 ]; } && why="exit status $rc, not killed"
    [ -z "$why" ] && ! grep -q "loaded checkpoint $D/iter_$(printf %07d "$latest") at iteration $latest" "$W/$name$trial.log" &&
      why="did not load iteration $latest"
    [ -z "$why" ] && [ "$got" != "$want" ] && why="latest '$got', want $want"
    [ -z "$why" ] && [ ! -f "$D/iter_$(printf %07d "$got")/meta.json" ] && why="latest names an incomplete checkpoint"
    [ -z "$why" ] && { why=$(same_as "$W/${name}_ref.jsonl" "$name$trial" $((latest + 1)) "") || true; }
    if [ -n "$why" ]; then
      bad "$name trial $trial (kill at $spec@$kill_at): $why"; grep -E "rror|WARNING" "$W/$name$trial.log" | head -3; return
    fi
    points+=("$spec@$kill_at")
    latest=$got
  done
  ok "$name: $trials kills (${points[*]}): each left the checkpoint before as the latest, and it loaded"
  resumes "${name}_after" "$np" "$D" "$latest" $((latest + 4)) "" "$W/${name}_ref.jsonl" "$@"
}
RANDOM=43
# 6 kills of one of 2 ranks (DP 2, the distributed optimizer: both write shards), 14 of a 1-rank job
chain dp2 2 6 "${L1[@]}"
chain single 1 14
finish
