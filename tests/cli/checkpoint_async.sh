#!/usr/bin/env bash
# checkpoint.async_save (docs/FAILURES.md "Background checkpoint saves"): the shards an async save writes
# are byte for byte the sync save's; training while the writer runs is bitwise the run without
# saves; its checkpoint resumes bitwise on the same layout (DP 2, distributed optimizer) and loads
# on another (TP 2, and PP 2 x CP 2) exactly as the sync save's does; an injected write error on one
# rank is a warning, the previous checkpoint stays the latest and the next save is written; the
# same error in the last save exits 2; a full disk (a small tmpfs) likewise (skipped when tmpfs
# cannot be mounted). The kills during a background write: checkpoint_async_kill.sh.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
source "$TPTRAIN_SRC/tests/cli/checkpoint_lib.sh"

# --- the references: no save, a sync save at 4; an async save at 4 and 8 ---------------------
tpt 2 ref "${L1[@]}" --set training.train_iters=12 --set logging.metrics_file="$W/ref.jsonl" || bad "ref"
tpt 2 sync "${L1[@]}" --set training.train_iters=4 --set checkpoint.save="$W/sync" || bad "sync"
# the writer starts each file 300 ms late: training goes on meanwhile, the save of 8 waits for it
TPTRAIN_TEST_WRITE_DELAY_MS=300 tpt 2 async "${L1[@]}" --set training.train_iters=8 --set checkpoint.save="$W/async" \
  --set checkpoint.async_save=true --set logging.metrics_file="$W/async.jsonl"
rc=$?
done_at=$(grep -o "saved checkpoint at iteration 4 to .*completed at iteration [0-9]*" "$W/async.log" | grep -o "[0-9]*$")
if [ $rc -eq 0 ] && grep -q "saving checkpoint at iteration 4 to $W/async/iter_0000004 in the background" "$W/async.log" &&
   [ "${done_at:-0}" -gt 4 ] && grep -q "saved checkpoint at iteration 8 to .*completed at iteration 8" "$W/async.log" &&
   [ "$(cat "$W/async/latest_checkpointed_iteration.txt")" = 8 ] && ! ls "$W/async" | grep -q partial; then
  ok "async save: started at 4, completed at iteration $done_at, latest 8, no .partial left"
else bad "async save: exit $rc, completed at '${done_at:-}'"; grep -E "checkpoint|rror" "$W/async.log" | head -8; fi
grep -q "waited .* s for the background save of iteration" "$W/async.log" && ok "a save while one is pending waits (logged)" ||
  bad "no 'waited' line"
why=$(same_as "$W/ref.jsonl" async 1 8) && ok "training during background saves: bitwise the run without saves" ||
  bad "async run differs: $why"
# a save that completes at a later iteration boundary, without a wait: its write takes ~25 ms, the 50
# iterations after it far longer (a save is never completed at its own iteration)
TPTRAIN_TEST_WRITE_DELAY_MS=10 tpt 2 late "${L1[@]}" --set training.train_iters=100 --set checkpoint.save="$W/late" \
  --set checkpoint.async_save=true --set checkpoint.save_interval=50 --set logging.metrics_file="$W/late.jsonl" ||
  bad "late: exit status $?"
# metrics: the stall on the line of the iteration that started the save; the write time and GB/s on
# the line of the one that completed it
$PY - "$W/async.jsonl" "$W/late.jsonl" <<'PY' && ok "metrics: save_checkpoint_time where a save starts, write time and GB/s where it completes" || bad "metrics"
import json, sys
load = lambda p: {j["iteration"]: j for j in map(json.loads, filter(str.strip, open(p)))}
rows, late = load(sys.argv[1]), load(sys.argv[2])
assert rows[4]["save_checkpoint_time"] > 0 and "save_checkpoint_time" not in rows[3], rows[4]
assert rows[8]["save_checkpoint_iteration"] == 8 and rows[8]["save_checkpoint_write_time"] > 0.6, rows[8]
done = [it for it, j in late.items() if j.get("save_checkpoint_iteration") == 50]
assert len(done) == 1 and 50 < done[0] < 100 and late[done[0]]["save_checkpoint_write_time"] > 0.02, done
assert late[done[0]]["save_checkpoint_write_gbps"] > 0 and late[50]["save_checkpoint_time"] > 0
print(f"  the save of 50 completed at iteration {done[0]}")
PY
same=0; n=0
for f in "$W/sync/iter_0000004"/*.safetensors; do
  n=$((n + 1)); cmp -s "$f" "$W/async/iter_0000004/$(basename "$f")" && same=$((same + 1))
done
[ "$n" -gt 0 ] && [ "$same" = "$n" ] && [ "$(ls "$W/async/iter_0000004" | grep -c safetensors)" = "$n" ] &&
  ok "the async save's $n shard files are byte for byte the sync save's" || bad "shards differ: $same of $n equal"

# --- resume: bitwise on the same layout; on others exactly like the sync save's checkpoint ------
resumes async_resume 2 "$W/async/iter_0000004" 4 12 "" "$W/ref.jsonl" "${L1[@]}"
for lay in L2 L3; do
  eval "args=(\"\${$lay[@]}\")"
  np=2; [ "$lay" = L3 ] && np=4
  tpt $np "sync_on_$lay" "${args[@]}" --set checkpoint.load="$W/sync" --set training.train_iters=8 \
    --set logging.metrics_file="$W/sync_on_$lay.jsonl" || bad "sync_on_$lay"
  resumes "async_on_$lay" $np "$W/async/iter_0000004" 4 8 "" "$W/sync_on_$lay.jsonl" "${args[@]}"
  TOL=1e-5 same_as "$W/ref.jsonl" "sync_on_$lay" 5 8 > /dev/null || bad "sync_on_$lay: not within 1e-5 of the reference"
done

# --- an injected write error on rank 1: a warning, training goes on, the next save is written -----
TPTRAIN_TEST_WRITE_ERROR=1/@4 tpt 2 werr "${L1[@]}" --set training.train_iters=8 --set checkpoint.save="$W/werr" \
  --set checkpoint.async_save=true --set checkpoint.save_interval=2 --set logging.metrics_file="$W/werr.jsonl"
rc=$?
if [ $rc -eq 0 ] && grep -q "WARNING: checkpoint: rank 1: the background save of iteration 4 failed: .*injected error" "$W/werr.log" &&
   grep -q "WARNING: checkpoint: the save of iteration 4 is abandoned" "$W/werr.log" && [ ! -e "$W/werr/iter_0000004" ] &&
   [ -d "$W/werr/iter_0000006" ] && [ "$(cat "$W/werr/latest_checkpointed_iteration.txt")" = 8 ] &&
   same_as "$W/ref.jsonl" werr 1 8; then ok "write error on rank 1: warning, iteration 4 abandoned, 6 and 8 saved"
else bad "write error: exit $rc"; grep -E "WARNING|rror" "$W/werr.log" | head -5; fi
resumes werr_resume 2 "$W/werr" 8 12 "" "$W/ref.jsonl" "${L1[@]}"
# ... in the save at exit: exit 2 naming it; the save before stays the latest
TPTRAIN_TEST_WRITE_ERROR=1/@8 tpt 2 werr_last "${L1[@]}" --set training.train_iters=8 --set checkpoint.save="$W/werr_last" \
  --set checkpoint.async_save=true --set checkpoint.save_interval=2
rc=$?
if [ $rc -eq 2 ] && grep -q "the save of iteration 8 failed: .*injected error" "$W/werr_last.log" &&
   [ "$(cat "$W/werr_last/latest_checkpointed_iteration.txt")" = 6 ] && ! ls "$W/werr_last" | grep -q partial; then
  ok "write error in the last save: exit 2 naming it, latest 6"
else bad "write error in the last save: exit $rc, latest $(cat "$W/werr_last/latest_checkpointed_iteration.txt")"; fi

# --- a full disk: a tmpfs that holds one checkpoint but not two ---------------------------------
ck_bytes=$(du -sb "$W/sync/iter_0000004" | cut -f1)
mkdir -p "$W/tmpfs"
if mount -t tmpfs -o size=$((ck_bytes * 3 / 2 / 1024))k tmpfs "$W/tmpfs" 2>/dev/null; then
  tpt 2 full "${L1[@]}" --set training.train_iters=6 --set checkpoint.save="$W/tmpfs/ck" --set checkpoint.async_save=true \
    --set checkpoint.save_interval=2 --set checkpoint.keep_last=1
  rc=$?
  latest=$(cat "$W/tmpfs/ck/latest_checkpointed_iteration.txt" 2>/dev/null)
  left=$(ls "$W/tmpfs/ck" | grep -c partial)
  cp -r "$W/tmpfs/ck" "$W/full_ck"; umount "$W/tmpfs"
  if [ $rc -eq 2 ] && grep -q "WARNING: checkpoint: .*background save of iteration 4 failed: .*No space left on device" "$W/full.log" &&
     grep -q "the save of iteration 6 failed: .*No space left on device" "$W/full.log" && [ "$latest" = 2 ] && [ "$left" = 0 ]; then
    ok "full disk: the save of 4 abandoned with a warning, the last one exits 2, latest 2, no .partial left"
  else bad "full disk: exit $rc, latest '$latest', $left partial"; grep -E "WARNING|rror" "$W/full.log" | head -5; fi
  resumes full_resume 2 "$W/full_ck" 2 6 "" "$W/ref.jsonl" "${L1[@]}"
else
  echo "SKIPPED: full disk: cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)"
fi

# --- plan = allocation: the staging the plan counts is what the run held (the trainer checks) ----
"$TPTRAIN" plan --config "$W/cfg.yaml" "${L1[@]}" --set checkpoint.async_save=true --world-size 2 > "$W/plan.log" 2>&1
grep -q "host memory: stage 0: .* per writing rank of checkpoint.async_save staging" "$W/plan.log" &&
  ok "plan: $(grep -o 'host memory: stage 0: [^(]*' "$W/plan.log")" || bad "plan: no staging line"
finish
