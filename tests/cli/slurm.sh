#!/usr/bin/env bash
# scripts/slurm/tptrain.sbatch under a real one-node SLURM (scripts/slurm/start_local_slurm.sh:
# Debian's slurm-wlm + munge on localhost, installed when missing): a 4-rank CPU job (TP2 x PP2) is
# submitted with sbatch, signalled with `scancel --signal=TERM --batch` after a few iterations,
# must save, requeue itself, resume from its checkpoint (SLURM_RESTART_COUNT=1) and finish with
# per-iteration losses bitwise equal to an uninterrupted run -- once with the srun launcher and once
# with mpirun. When SLURM cannot run here (or TPTRAIN_SLURM_FAKE=1) the script's logic is tested
# instead with a faked SLURM environment (SLURM_* variables, a fake scontrol), and it says so.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
# 4 ranks on a 2-core machine that SLURM believes has 8 CPUs: Open MPI does not see the
# oversubscription and busy-polls, 10x slower; yielding ranks keep iterations at ~0.2 s.
export OMPI_MCA_mpi_yield_when_idle=1
W=$TPTRAIN_WORK; rm -rf "$W"; mkdir -p "$W/logs"
SB=$TPTRAIN_SRC/scripts/slurm/tptrain.sbatch
ITERS=40
finish() { echo "$pass passed, $fail failed (${SECONDS} s)"; [ "$fail" -eq 0 ]; exit; }

$PY "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 40000 --docs 50 --seed 3 \
  --megatron "$W/data" >/dev/null 2>&1 || { bad "make_tokens.py"; finish; }
# ~150 ms per iteration on 4 ranks of a 2-core machine: slow enough to signal it mid-run.
# lr_decay_iters fixed: the schedule does not depend on where the run is cut.
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4, seq_length: 32, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
parallel: {tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2}
training: {micro_batch_size: 4, global_batch_size: 32, train_iters: $ITERS, cpu_threads: 1, seed: 7}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, lr_decay_iters: $ITERS, weight_decay: 0.1, clip_grad: 0.5}
data: {path: $W/data, shuffle: true, split: [100, 0, 0], eval_iters: 0}
checkpoint: {save_interval: 4}
logging: {log_interval: 1}
YAML

# The uninterrupted reference run, same layout.
if ! timeout 120 mpirun -np 4 "$TPTRAIN" --config "$W/cfg.yaml" --set logging.metrics_file="$W/ref.jsonl" \
     > "$W/ref.log" 2>&1; then
  bad "reference run"; tail -5 "$W/ref.log"; finish
fi

# wait_until SECONDS COMMAND...: polls COMMAND every 0.2 s; false after SECONDS
wait_until() {
  local end=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -ge $end ] && return 1; sleep 0.2; done
}
trained_some() { grep -Eq '^iteration +([5-9]|[1-9][0-9]+)/' "$1" 2>/dev/null; }

# check NAME LOG CKPT METRICS_PREFIX: what a signalled, requeued and resumed job must show
check() {
  local name=$1 log=$2 ck=$3 m=$4 k
  k=$(grep -Eo 'exiting program after receiving SIG[A-Z0-9]+ at iteration [0-9]+' "$log" | grep -Eo '[0-9]+$' | head -1)
  if [ -n "$k" ] && [ "$k" -lt "$ITERS" ] && grep -q "saved checkpoint at iteration $k to $ck/iter_" "$log"; then
    ok "$name: the signal stopped training at iteration $k of $ITERS, every rank saved, exit 0"
  else bad "$name: no signal-triggered save before iteration $ITERS"; grep -E "saved|exiting|error" "$log" | head -5; return; fi
  if grep -q "SLURM_RESTART_COUNT=0" "$log" && grep -q "requeueing job" "$log" && grep -q "SLURM_RESTART_COUNT=1" "$log"
  then ok "$name: the script requeued the job; it ran again with SLURM_RESTART_COUNT=1"
  else bad "$name: no requeue / no restart with SLURM_RESTART_COUNT=1"; grep "tptrain.sbatch" "$log" | head -12; fi
  if grep -q "loaded checkpoint $ck/iter_$(printf %07d "$k") at iteration $k" "$log"; then ok "$name: resumed from iteration $k"
  else bad "$name: did not resume from $ck/iter_$(printf %07d "$k")"; grep -E "loaded|WARNING" "$log" | head -3; fi
  if grep -q "tptrain.sbatch: .* training finished" "$log" && [ "$(cat "$ck/latest_checkpointed_iteration.txt" 2>/dev/null)" = "$ITERS" ]
  then ok "$name: finished (latest checkpoint: iteration $ITERS)"
  else bad "$name: did not finish"; tail -5 "$log"; fi
  cat "$m.restart0.jsonl" "$m.restart1.jsonl" > "$m.all.jsonl" 2>/dev/null
  local lines; lines=$(grep -c . "$m.all.jsonl")
  if out=$($PY "$TPTRAIN_SRC/tests/tools/compare_runs.py" "$W/ref.jsonl" "$m.all.jsonl" --rel 0 --min-iters "$ITERS") &&
     [ "$lines" = "$ITERS" ]; then ok "$name: losses and grad norms of iterations 1..$ITERS bitwise equal to the uninterrupted run"
  else bad "$name: metrics differ from the uninterrupted run ($lines lines)"; fi
  echo "$out"
}

# --- a faked SLURM: the batch script run by hand, SIGTERM to it as --signal=B:TERM does ----------
fake_slurm() {
  echo "NOTE: testing tptrain.sbatch with a faked SLURM environment (SLURM_* variables, a fake scontrol), not a real SLURM"
  mkdir -p "$W/fakebin"
  cat > "$W/fakebin/scontrol" <<EOF
#!/bin/sh
echo "\$*" >> "$W/scontrol.calls"
[ "\$1" = show ] && echo "JobId=\$4 JobName=fake JobState=\${FAKE_JOB_STATE:-RUNNING} Restarts=0"
exit 0
EOF
  chmod +x "$W/fakebin/scontrol"
  local log=$W/logs/fake-4242.out rc pid
  run_fake() {  # RESTART_COUNT: one run of the "job"; returns the script's exit status
    env PATH="$W/fakebin:$PATH" SLURM_JOB_ID=4242 SLURM_JOB_NAME=fake SLURM_NTASKS=4 SLURM_JOB_NODELIST=localhost \
      SLURM_SUBMIT_DIR="$W" SLURM_RESTART_COUNT="$1" TPTRAIN_LAUNCHER=mpirun TPTRAIN_CKPT_DIR="$W/ck_fake" \
      TPTRAIN_METRICS="$W/fake" bash "$SB" "$W/cfg.yaml" >> "$log" 2>&1 &
    pid=$!
  }
  cd "$W" || return
  run_fake 0
  if wait_until 60 trained_some "$log"; then kill -TERM "$pid"; else bad "fake: no training within 60 s"; fi
  wait "$pid"; rc=$?
  [ "$rc" -eq 0 ] || bad "fake: first run exited $rc"
  if grep -qx "requeue 4242" "$W/scontrol.calls" 2>/dev/null; then ok "fake: the script called 'scontrol requeue 4242'"
  else bad "fake: no 'scontrol requeue 4242'"; fi
  run_fake 1
  wait "$pid"; rc=$?
  [ "$rc" -eq 0 ] || bad "fake: second run exited $rc"
  [ "$(grep -c requeue "$W/scontrol.calls")" = 1 ] || bad "fake: the finished run requeued again"
  check fake "$log" "$W/ck_fake" "$W/fake"
  # the same signal while SLURM is ending the job (plain `scancel JOB`): save, but no requeue
  log=$W/logs/fake-4243.out
  env PATH="$W/fakebin:$PATH" SLURM_JOB_ID=4243 SLURM_JOB_NAME=fake SLURM_NTASKS=4 SLURM_JOB_NODELIST=localhost \
    SLURM_SUBMIT_DIR="$W" TPTRAIN_LAUNCHER=mpirun TPTRAIN_CKPT_DIR="$W/ck_fake2" FAKE_JOB_STATE=COMPLETING \
    bash "$SB" "$W/cfg.yaml" >> "$log" 2>&1 &
  pid=$!
  if wait_until 60 trained_some "$log"; then kill -TERM "$pid"; else bad "fake cancelled: no training within 60 s"; fi
  wait "$pid"; rc=$?
  if [ "$rc" -eq 0 ] && ! grep -q "requeue 4243" "$W/scontrol.calls" && grep -q "not requeueing" "$log"; then
    ok "fake cancelled: a job that SLURM is ending (JobState=COMPLETING) saves and is not requeued"
  else bad "fake cancelled: exit $rc, or requeued"; grep tptrain.sbatch "$log" | tail -3; fi
}

if [ "${TPTRAIN_SLURM_FAKE:-0}" = 1 ]; then fake_slurm; finish; fi

# --- a real SLURM --------------------------------------------------------------------------------
# One user of the host's one SLURM at a time (another build's ctest may run this test too): whoever
# started the daemons stops them at the end.
exec 9> /tmp/tptrain-slurm.lock
if ! flock -w 240 9; then
  echo "NOTE: the local SLURM stayed busy with another run of this test for 240 s"
  fake_slurm; finish
fi
t0=$SECONDS
if ! conf=$(bash "$TPTRAIN_SRC/scripts/slurm/start_local_slurm.sh" 2> "$W/start.err" 9>&-); then
  echo "SLURM cannot run here: $(tail -1 "$W/start.err")"
  fake_slurm; finish
fi
eval "$conf"
started_here=1
grep -q "already running" "$W/start.err" && started_here=0
cleanup() {
  if [ "$started_here" = 1 ]; then bash "$TPTRAIN_SRC/scripts/slurm/stop_local_slurm.sh" 2>/dev/null
  else for j in "${jobs_here[@]}"; do scancel "$j" 2>/dev/null; done; fi
}
jobs_here=()
trap cleanup EXIT
trap 'exit 1' TERM INT  # (a ctest timeout) still runs cleanup
ok "local SLURM up in $((SECONDS - t0)) s ($(sed 's/^start_local_slurm: //' "$W/start.err" | tr '\n' ' '))"

job_field() { scontrol show job -o "$1" 2>/dev/null | grep -Eo "(^| )$2=[^ ]*" | cut -d= -f2; }
job_is() { [ "$(job_field "$1" JobState)" = "$2" ]; }
# requeued, and pending (usually, BeginTime) or already started again
requeued() { [ "$(job_field "$1" Restarts)" = 1 ] && [[ "$(job_field "$1" JobState)" =~ ^(PENDING|RUNNING|COMPLETED)$ ]]; }

real_job() {  # NAME LAUNCHER
  local name=$1 launcher=$2 jid log ts
  cd "$W" || return
  jid=$(TPTRAIN_LAUNCHER=$launcher TPTRAIN_CKPT_DIR="$W/ck_$name" TPTRAIN_METRICS="$W/$name" \
        sbatch --parsable -J "$name" --ntasks-per-node=4 --gpus-per-task=0 "$SB" "$W/cfg.yaml" 2>&1)
  [[ "$jid" =~ ^[0-9]+$ ]] || { bad "$name: sbatch failed: $jid"; return; }
  jobs_here+=("$jid")
  log=$W/logs/$name-$jid.out
  echo "  $name: job $jid, log $log"
  ts=$SECONDS
  if ! wait_until 60 trained_some "$log"; then bad "$name: job $jid trained nothing within 60 s"; tail -5 "$log"; return; fi
  scancel --signal=TERM --batch "$jid"
  echo "  $name: scancel --signal=TERM --batch $jid after $((SECONDS - ts)) s"
  if ! wait_until 60 requeued "$jid"; then
    bad "$name: job $jid not pending with Restarts=1 within 60 s ($(job_field "$jid" JobState))"; tail -5 "$log"; return
  fi
  echo "  $name: requeued after $((SECONDS - ts)) s: $(job_field "$jid" JobState), Reason=$(job_field "$jid" Reason)"
  if job_is "$jid" PENDING; then
    # Not in the second the old run ended: slurmd would refuse the start ("Job credential revoked")
    # and the job would end FAILED.
    sleep 2
    echo "  $name: scontrol update jobid=$jid StartTime=now"; scontrol update jobid="$jid" StartTime=now
  fi
  if ! wait_until 90 job_is "$jid" COMPLETED; then
    bad "$name: job $jid not COMPLETED within 90 s ($(job_field "$jid" JobState))"; tail -5 "$log"; return
  fi
  echo "  $name: COMPLETED after $((SECONDS - ts)) s, ExitCode=$(job_field "$jid" ExitCode)"
  check "$name" "$log" "$W/ck_$name" "$W/$name"
}
# A plain `scancel JOB` ends the job for good: no requeue (the ranks may still save).
cancelled_job() {
  local jid log ts
  cd "$W" || return
  jid=$(TPTRAIN_LAUNCHER=srun TPTRAIN_CKPT_DIR="$W/ck_cancel" sbatch --parsable -J cancel --ntasks-per-node=4 \
        --gpus-per-task=0 "$SB" "$W/cfg.yaml" 2>&1)
  [[ "$jid" =~ ^[0-9]+$ ]] || { bad "cancel: sbatch failed: $jid"; return; }
  jobs_here+=("$jid")
  log=$W/logs/cancel-$jid.out
  if ! wait_until 60 trained_some "$log"; then bad "cancel: job $jid trained nothing within 60 s"; return; fi
  scancel "$jid"
  ts=$SECONDS
  wait_until 60 job_is "$jid" CANCELLED || true
  sleep 2
  local state restarts; state=$(job_field "$jid" JobState); restarts=$(job_field "$jid" Restarts)
  if [ "$state" = CANCELLED ] && [ "$restarts" = 0 ]; then
    ok "cancel: 'scancel $jid' ended the job for good in $((SECONDS - ts - 2)) s (CANCELLED, not requeued; $(grep -Eo 'exiting program.*|not requeueing' "$log" | tr '\n' ' '))"
  else bad "cancel: after 'scancel $jid': JobState=$state Restarts=$restarts"; grep tptrain.sbatch "$log" | tail -3; fi
}
real_job srun srun
real_job mpirun mpirun
cancelled_job
finish
