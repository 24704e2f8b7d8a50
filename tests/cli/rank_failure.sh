#!/usr/bin/env bash
# A failure on one rank mid-step ends the whole job promptly with that rank's message (issue 20):
# TPTRAIN_FAULT=RANK:ITERATION makes RANK throw in the last backward of ITERATION, while its peers
# wait in pipeline and tensor-parallel exchanges with it. 4 CPU ranks (TP 2 x PP 2), the failing
# rank on either stage; and a single process, which must exit 1 without tearing anything down.
# A stopped (hung) rank ends the job through the watchdog (parallel.distributed_timeout_minutes).
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
$PYTHON "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 30000 --docs 20 --seed 5 --megatron "$W/data" >/dev/null 2>&1
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4, seq_length: 32, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
parallel: {tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2}
training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 6, cpu_threads: 1, seed: 3, precision: bf16}
data: {path: $W/data, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML
expect_failure() {  # name np fault launcher...
  local name=$1 np=$2 fault=$3; shift 3
  local t0=$SECONDS
  TPTRAIN_FAULT=$fault timeout 120 "$@" > "$W/$name.log" 2>&1
  local rc=$? dt=$((SECONDS - t0)) rank=${fault%%:*}
  if [ $rc -eq 1 ] && [ $dt -le 60 ] && grep -q "tptrain: internal error: rank $rank: injected fault (TPTRAIN_FAULT)" "$W/$name.log" &&
     ! grep -q "^iteration *${fault##*:}/" "$W/$name.log"; then
    ok "$name: exit 1 after ${dt} s with rank $rank's message"
  else
    bad "$name: exit status $rc after ${dt} s (want 1 within 60 s and rank $rank's message)"; tail -5 "$W/$name.log"
  fi
}
expect_failure last_stage_rank 4 3:3 mpirun -np 4 "$TPTRAIN" --config "$W/cfg.yaml"
expect_failure first_stage_rank 4 0:2 mpirun -np 4 "$TPTRAIN" --config "$W/cfg.yaml"
expect_failure single_process 1 0:2 "$TPTRAIN" --config "$W/cfg.yaml" --set parallel.tensor_model_parallel_size=1 \
  --set parallel.pipeline_model_parallel_size=1

# A hung peer (issue 17 item 7): SIGSTOP one of 4 ranks once training runs; with
# parallel.distributed_timeout_minutes 0.5 the others give up after 30 s in their wait, naming it,
# and the job ends with exit 1 -- not the hang of before.
hung() {  # name rank-to-stop
  local name=$1 victim=$2 t0=$SECONDS
  timeout 180 mpirun -np 4 "$TPTRAIN" --config "$W/cfg.yaml" --set parallel.distributed_timeout_minutes=0.5 \
    --set training.train_iters=100000 > "$W/$name.log" 2>&1 &
  local job=$!
  for _ in $(seq 600); do grep -q "^iteration *2/" "$W/$name.log" 2>/dev/null && break; sleep 0.1; done
  # the ranks are mpirun's children; the victim is the one whose environment says its rank
  local pid=""
  for p in $(pgrep -f "tptrain --config $W/cfg.yaml"); do
    [ "$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -c "^OMPI_COMM_WORLD_RANK=$victim\$")" = 1 ] && pid=$p
  done
  if [ -z "$pid" ]; then bad "$name: could not find rank $victim"; kill $job; return; fi
  kill -STOP "$pid"
  wait $job; local rc=$? dt=$((SECONDS - t0))
  kill -KILL "$pid" 2>/dev/null
  if [ $rc -eq 1 ] && [ $dt -le 120 ] && grep -q "no progress for [0-9]* s in .*waiting for world ranks" "$W/$name.log"; then
    ok "$name: rank $victim stopped; the job ended with exit 1 after ${dt} s: $(grep -o "rank [0-9]*: no progress for [0-9]* s in [^;]*" "$W/$name.log" | head -1)"
  else bad "$name: exit status $rc after ${dt} s"; grep -E "error|progress" "$W/$name.log" | head -5; fi
}
hung hung_peer_stage1 3
# a healthy run never fires with the same short timeout
if timeout 120 mpirun -np 4 "$TPTRAIN" --config "$W/cfg.yaml" --set parallel.distributed_timeout_minutes=0.5 > "$W/healthy.log" 2>&1 &&
   grep -q "^iteration *6/" "$W/healthy.log"; then ok "healthy run with a 30 s timeout completes"
else bad "healthy run with a 30 s timeout"; tail -3 "$W/healthy.log"; fi

finish
