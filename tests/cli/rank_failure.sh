#!/usr/bin/env bash
# A failure on one rank mid-step ends the whole job promptly with that rank's message (issue 20):
# TPTRAIN_FAULT=RANK:ITERATION makes RANK throw in the last backward of ITERATION, while its peers
# wait in pipeline and tensor-parallel exchanges with it. 4 CPU ranks (TP 2 x PP 2), the failing
# rank on either stage; and a single process, which must exit 1 without tearing anything down.
set -uo pipefail
source "$TPTRAIN_SRC/scripts/env.sh"
W=$TPTRAIN_WORK; rm -rf "$W"; mkdir -p "$W"
pass=0; fail=0
ok() { echo "ok   $1"; pass=$((pass+1)); }
bad() { echo "FAIL $1"; fail=$((fail+1)); }
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
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
