#!/usr/bin/env bash
# Checkpoint faults (docs/ARCHITECTURE.md "Checkpoint format"): a crash at any moment of a save leaves the
# previous checkpoint loadable; SIGTERM saves and exits 0 (with an async save pending too); damaged checkpoints fall back to an
# older one with a warning naming the file, or exit 2 with a clear message -- never a crash or a
# hang. Every resumed run must continue bitwise exactly like an uninterrupted run.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
source "$TPTRAIN_SRC/tests/cli/checkpoint_lib.sh"  # the data, cfg.yaml, tpt, same_as, resumes
LAYOUT8=(--set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2)
# fails NAME NP PATTERN [args]: exit status 2 and a message matching PATTERN
fails() {
  local name=$1 np=$2 pat=$3; shift 3
  tpt "$np" "$name" "$@"
  local rc=$?
  if [ $rc -eq 2 ] && grep -Eq "$pat" "$W/$name.log"; then ok "$name (exit 2: $(grep -Eo "$pat" "$W/$name.log" | head -1))"
  else bad "$name: exit status $rc, want 2 and /$pat/"; tail -5 "$W/$name.log"; fi
}
copy() { rm -rf "$W/$2"; cp -r "$W/$1" "$W/$2"; }
flip_byte() { $PY -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(-100,2); b=f.read(1); f.seek(-100,2); f.write(bytes([b[0]^1]))" "$1"; }

# --- references and base checkpoints (iterations 4 and 8) --------------------------------------
tpt 1 ref1 --set training.train_iters=12 --set logging.metrics_file="$W/ref1.jsonl" || bad "ref1"
tpt 8 ref8 "${LAYOUT8[@]}" --set training.train_iters=12 --set logging.metrics_file="$W/ref8.jsonl" || bad "ref8"
tpt 1 base1 --set checkpoint.save="$W/base1" || bad "base1"
tpt 8 base8 "${LAYOUT8[@]}" --set checkpoint.save="$W/base8" || bad "base8"
M=model_tp00_pp000.safetensors; O=optim_tp00_pp000_dp000.safetensors

# --- damaged checkpoints: fallback with a warning naming the file --------------------------------
copy base1 flip; flip_byte "$W/flip/iter_0000008/$M"
resumes flipped_byte 1 "$W/flip" 4 12 "$M: checksum mismatch" "$W/ref1.jsonl"
copy base1 trunc; truncate -s -1000 "$W/trunc/iter_0000008/$O"
resumes truncated_shard 1 "$W/trunc" 4 12 "$O has .* bytes" "$W/ref1.jsonl"
copy base1 del; rm "$W/del/iter_0000008/$M"
resumes deleted_shard 1 "$W/del" 4 12 "$M is missing" "$W/ref1.jsonl"
copy base1 garbled; echo '{"format": "tptrain-checkpoint", "iteration": 8, "fil' > "$W/garbled/iter_0000008/meta.json"
resumes garbled_meta 1 "$W/garbled" 4 12 "meta.json is not valid JSON" "$W/ref1.jsonl"
copy base1 nowhere; echo 999 > "$W/nowhere/latest_checkpointed_iteration.txt"
resumes latest_pointing_nowhere 1 "$W/nowhere" 8 12 "names iteration 999 but iter_0000999 does not exist" "$W/ref1.jsonl"
# long latest files (issue 17: a recursive std::regex overflowed the stack on them)
copy base1 spaces; { printf '%*s' 30000 ''; echo 8; } > "$W/spaces/latest_checkpointed_iteration.txt"
resumes latest_after_30000_spaces 1 "$W/spaces" 8 12 "" "$W/ref1.jsonl"
copy base1 newlines; $PY -c "print('\n' * 100000, end='')" > "$W/newlines/latest_checkpointed_iteration.txt"
resumes latest_of_100000_newlines 1 "$W/newlines" 8 12 "does not hold an iteration number" "$W/ref1.jsonl"
# FIFOs where a checkpoint's text files should be: never opened (they would block), the checkpoint
# is damaged (issue 17 item 6)
copy base1 fifolatest; rm "$W/fifolatest/latest_checkpointed_iteration.txt"; mkfifo "$W/fifolatest/latest_checkpointed_iteration.txt"
resumes latest_is_a_fifo 1 "$W/fifolatest" 8 12 "does not hold an iteration number" "$W/ref1.jsonl"
copy base1 fifometa; rm "$W/fifometa/iter_0000008/meta.json"; mkfifo "$W/fifometa/iter_0000008/meta.json"
resumes meta_is_a_fifo 1 "$W/fifometa" 4 12 "meta.json" "$W/ref1.jsonl"
fails load_names_a_file 1 "checkpoint.load: .* is not a directory" --set checkpoint.load="$W/ref1.jsonl"
copy base1 nolatest; rm "$W/nolatest/latest_checkpointed_iteration.txt"
resumes no_latest_file 1 "$W/nolatest" 8 12 "no latest_checkpointed_iteration.txt" "$W/ref1.jsonl"
copy base1 partial; mkdir "$W/partial/iter_0000012.partial"; echo junk > "$W/partial/iter_0000012.partial/$M"
resumes partial_dir_ignored 1 "$W/partial" 8 12 "ignoring incomplete checkpoint .*iter_0000012.partial" "$W/ref1.jsonl"
# 8 ranks: a shard that only some ranks read; every rank must fall back together
copy base8 flip8; flip_byte "$W/flip8/iter_0000008/model_tp01_pp001.safetensors"
resumes flipped_byte_8_ranks 8 "$W/flip8" 4 12 "model_tp01_pp001.safetensors: checksum mismatch" "$W/ref8.jsonl" "${LAYOUT8[@]}"
# ... and the same checkpoint read on another layout (TP4): other ranks read the bad file
TOL=1e-5 resumes flipped_byte_8_ranks_tp4 8 "$W/flip8" 4 12 "model_tp01_pp001.safetensors: checksum mismatch" \
  "$W/ref8.jsonl" --set parallel.tensor_model_parallel_size=4

# --- nothing usable: exit 2 naming the problems; mismatches: exit 2 naming the tensor ------------
copy base1 allbad; flip_byte "$W/allbad/iter_0000008/$M"; rm "$W/allbad/iter_0000004/$O"
fails all_checkpoints_bad 1 "no usable checkpoint in .*iter_0000008: $M: checksum mismatch.*iter_0000004: $O is missing" \
  --set checkpoint.load="$W/allbad"
copy base8 allbad8; flip_byte "$W/allbad8/iter_0000008/model_tp01_pp001.safetensors"
flip_byte "$W/allbad8/iter_0000004/optim_tp01_pp000_dp000.safetensors"
fails all_checkpoints_bad_8_ranks 8 "no usable checkpoint in .*optim_tp01_pp000_dp000.safetensors: checksum mismatch" \
  "${LAYOUT8[@]}" --set checkpoint.load="$W/allbad8"
copy base1 onlylatest; rm -r "$W/onlylatest"/iter_*
fails latest_but_no_checkpoint 1 "no usable checkpoint.*names iteration 8" --set checkpoint.load="$W/onlylatest"
fails hidden_size_mismatch 1 "tensor 'wte.weight' has global shape \[97, 32\] in the checkpoint and \[97, 64\] in the model" \
  --set checkpoint.load="$W/base1" --set model.hidden_size=64
fails layers_mismatch_8_ranks 8 "checkpoint has tensor 'h.2.attn.proj.bias' \[32\] that the model does not have" \
  "${LAYOUT8[@]}" --set checkpoint.load="$W/base8" --set model.num_layers=2
fails vocab_mismatch 1 "tensor 'wte.weight' has global shape \[97, 32\] in the checkpoint and \[101, 32\] in the model" \
  --set checkpoint.load="$W/base1" --set model.vocab_size=101
touch "$W/afile"
fails unwritable_save_dir 1 "checkpoint.save: cannot create directory '$W/afile/ck'" --set checkpoint.save="$W/afile/ck"
tpt 1 no_checkpoint --set checkpoint.load="$W/does_not_exist" --set logging.metrics_file="$W/no_checkpoint.jsonl"
if [ $? -eq 0 ] && grep -q "no checkpoint in $W/does_not_exist; training from scratch" "$W/no_checkpoint.log" &&
   same_as "$W/ref1.jsonl" no_checkpoint 1 8; then ok "load dir without checkpoints: trains from scratch"
else bad "load dir without checkpoints"; fi

# --- kill -9 at chosen points of a save (TPTRAIN_TEST_KILL=<point>@<iteration>) ---------------
# save_interval 2; the save of iteration 6 dies at POINT; the next start resumes from FROM.
for spec in shards:4 meta:4 rename:4 latest:6; do
  point=${spec%:*} from=${spec#*:} d="$W/kill_$point"
  TPTRAIN_TEST_KILL="$point@6" tpt 1 "kill_$point" --set checkpoint.save="$d" --set checkpoint.save_interval=2
  rc=$?
  [ $rc -eq 137 ] || bad "kill at $point: exit status $rc, want 137 (SIGKILL)"
  resumes "kill_${point}_resume" 1 "$d" "$from" 10 "" "$W/ref1.jsonl" --set checkpoint.save="$d" --set checkpoint.save_interval=2
  # the resumed run re-saved iteration 6 (replacing a complete iter_0000006 after 'rename') and 8, 10
  resumes "kill_${point}_resume_again" 1 "$d" 10 12 "" "$W/ref1.jsonl"
done
# the same with 8 ranks: every rank dies after writing its shards of iteration 6
TPTRAIN_TEST_KILL="shards@6" tpt 8 kill8 "${LAYOUT8[@]}" --set checkpoint.save="$W/kill8" --set checkpoint.save_interval=2
resumes kill8_resume 8 "$W/kill8" 4 12 "ignoring incomplete checkpoint .*iter_0000006.partial" "$W/ref8.jsonl" "${LAYOUT8[@]}"

# --- kill -9 at random moments of a run that saves every iteration ---------------------------
RANDOM=6; K="$W/kill_random"; maxn=0; results=()
for trial in 1 2 3 4; do
  delay=$(printf "0.%03d" $((300 + RANDOM % 700)))
  "$TPTRAIN" --config "$W/cfg.yaml" --set training.train_iters=100000 --set checkpoint.save="$K" \
    --set checkpoint.load="$K" --set checkpoint.save_interval=1 > "$W/kill_random_$trial.log" 2>&1 &
  pid=$!
  # the random delay counts from the first trained iteration, so a slow start-up (a loaded
  # machine) cannot make every kill land before the first save
  for _ in $(seq 600); do grep -q "^iteration" "$W/kill_random_$trial.log" 2>/dev/null && break; sleep 0.1; done
  sleep "$delay"; kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  n=$(cat "$K/latest_checkpointed_iteration.txt" 2>/dev/null || echo 0)
  results+=("$trial:$n:$delay")
  [ "$n" -gt "$maxn" ] && maxn=$n
done
tpt 1 ref_long --set training.train_iters=$((maxn + 3)) --set logging.metrics_file="$W/ref_long.jsonl"
n=${results[-1]#*:}; n=${n%%:*}
echo "  random kills (trial:latest:delay): ${results[*]}"
if [ "$n" -gt 0 ]; then
  resumes kill_random_resume 1 "$K" "$n" $((n + 3)) "" "$W/ref_long.jsonl"
else bad "kill_random: no checkpoint after 4 trials"; fi

# --- exit signal: checkpoint, exit 0, exact continuation ------------------------------------
# wait_lines FILE N: until FILE has N lines (at most 60 s)
wait_lines() {
  for _ in $(seq 600); do [ -f "$1" ] && [ "$(wc -l < "$1")" -ge "$2" ] && return 0; sleep 0.1; done; return 1
}
signal_case() {  # name np SIGNAL target(self|rank|mpirun) [args]
  local name=$1 np=$2 sig=$3 target=$4; shift 4
  local d="$W/$name" m="$W/$name.jsonl"
  local cmd=("$TPTRAIN" --config "$W/cfg.yaml" --set training.train_iters=100000 --set checkpoint.save="$d"
             --set checkpoint.save_interval=100000 --set checkpoint.exit_signal="$sig" --set logging.metrics_file="$m" "$@")
  if [ "$np" = 1 ]; then "${cmd[@]}" > "$W/$name.log" 2>&1 &
  else mpirun -np "$np" "${cmd[@]}" > "$W/$name.log" 2>&1 &
  fi
  local pid=$! victim
  wait_lines "$m" 6
  victim=$pid
  [ "$target" = rank ] && victim=$(pgrep -P "$pid" | tail -1)  # one rank only: the ranks agree (MAX)
  kill -"${sig#SIG}" "$victim"
  local t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt 60 ]; do sleep 0.1; done
  kill -9 "$pid" 2>/dev/null
  wait "$pid"; local rc=$?
  local n; n=$(cat "$d/latest_checkpointed_iteration.txt" 2>/dev/null || echo none)
  if [ "$n" != none ] && [ $rc -eq 0 ] && grep -q "exiting program after receiving $sig at iteration $n" "$W/$name.log"; then
    ok "$name: $sig to $target -> checkpoint at iteration $n, exit status 0"
    tpt "$np" "${name}_ref" "$@" --set training.train_iters=$((n + 4)) --set logging.metrics_file="$W/${name}_ref.jsonl"
    resumes "${name}_resume" "$np" "$d" "$n" $((n + 4)) "" "$W/${name}_ref.jsonl" "$@"
  else
    bad "$name: $sig to $target: exit status $rc, latest '$n'"; tail -5 "$W/$name.log"
  fi
}
signal_case sigterm_single 1 SIGTERM self
# as SLURM delivers it (srun signals the tasks): here to one rank only
signal_case sigterm_one_rank 4 SIGTERM rank --set parallel.tensor_model_parallel_size=2
# Open MPI's mpirun answers SIGTERM by killing the job at once, but forwards SIGUSR1/SIGUSR2
signal_case sigusr1_mpirun 4 SIGUSR1 mpirun --set parallel.pipeline_model_parallel_size=2
# checkpoint.async_save (issue 43): the signal arrives while the background save of iteration 5 is
# still writing (each file 200 ms late); the exit waits for it, saves, commits, exits 0
TPTRAIN_TEST_WRITE_DELAY_MS=200 signal_case sigusr1_async_pending 2 SIGUSR1 mpirun --set parallel.data_parallel_size=2 \
  --set checkpoint.async_save=true --set checkpoint.save_interval=5
grep -q "saving checkpoint at iteration 5 to .* in the background" "$W/sigusr1_async_pending.log" &&
  grep -q "saved checkpoint at iteration 5 to " "$W/sigusr1_async_pending.log" &&
  ok "sigusr1_async_pending: the background save of iteration 5 was completed before the exit's" ||
  bad "sigusr1_async_pending: no background save of iteration 5 completed"

# A save that fails for lack of space (here: a file size limit, ulimit -f, with SIGXFSZ ignored so a
# write past it fails with EFBIG as on a full disk) exits 2 naming the file, leaves no
# iter_N.partial holding the space, and the previous checkpoint stays the latest and loadable.
# Hidden 256: a 12.6 MB model shard, past the 8 MiB limit (MPI's start-up needs a few MiB).
d=$W/ck_space
H=(--set model.hidden_size=256)
if tpt 1 space_first "${H[@]}" --set checkpoint.save="$d" --set training.train_iters=4; then
  (trap '' XFSZ; ulimit -f 8192; tpt 1 space_full "${H[@]}" --set checkpoint.save="$d" --set checkpoint.load="$d" \
     --set training.train_iters=8)
  rc=$?
  left=$(ls "$d" | grep -c partial)
  if [ $rc -eq 2 ] && grep -q "iter_0000008.partial/" "$W/space_full.log" && [ "$left" = 0 ] &&
     [ "$(cat "$d/latest_checkpointed_iteration.txt")" = 4 ] &&
     tpt 1 space_after "${H[@]}" --set checkpoint.load="$d" --set training.train_iters=5 &&
     grep -q "loaded checkpoint $d/iter_0000004 at iteration 4" "$W/space_after.log"; then
    ok "save past the space limit: exit 2 naming the file, no .partial left, iteration 4 still loads"
  else
    bad "save past the space limit: exit $rc, $left partial dir(s), latest $(cat "$d/latest_checkpointed_iteration.txt")"
    tail -3 "$W/space_full.log"
  fi
else
  bad "space_first: exit status $?"
fi

finish
