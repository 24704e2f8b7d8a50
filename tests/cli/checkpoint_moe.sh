#!/usr/bin/env bash
# Checkpoints of a Mixture-of-Experts model (docs/MOE.md "Parameters"): the experts are saved by their
# global expert index, so 8 + a resume of 8 iterations is bitwise equal to 16 straight on the same
# layout (EP 2 x DP 4 with the distributed optimizer, the expert bias's state included), and a checkpoint saved at EP 2 resumes at
# EP 1 (1 rank), EP 4 (DP 4) and EP 2 x TP 2 (sequence parallelism, ETP 1 and ETP 2) within 1e-6 of
# the uninterrupted run, the distributed optimizer's shards included; one saved at EP 2 x TP 2 with ETP
# 2 (experts split over TP) resumes on one rank within 1e-6.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
CMP="$TPTRAIN_SRC/tests/tools/compare_runs.py"
$PY "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 40000 --docs 50 --seed 3 \
  --megatron "$W/data" >/dev/null 2>&1 || { echo "FAIL: make_tokens.py"; echo "0 passed, 1 failed"; exit 1; }
# sigmoid scores with the expert bias (its state must come back), aux loss, z-loss, a dense first layer
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 97,
        make_vocab_size_divisible_by: 8, num_moe_experts: 4, moe_ffn_hidden_size: 24, moe_router_topk: 2,
        moe_router_score_function: sigmoid, moe_router_enable_expert_bias: true, moe_router_bias_update_rate: 1.0e-2,
        moe_aux_loss_coeff: 1.0e-2, moe_z_loss_coeff: 1.0e-3, moe_layer_freq: [0, 1]}
training: {micro_batch_size: 2, global_batch_size: 16, train_iters: 16, cpu_threads: 1, seed: 7}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, lr_decay_iters: 16, weight_decay: 0.1, clip_grad: 0.5}
data: {path: $W/data, shuffle: true, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML

# np name [--set ...]: tptrain on np ranks, metrics in $W/<name>.jsonl, log in $W/<name>.log
run() {
  local np=$1 name=$2; shift 2
  timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/cfg.yaml" --set logging.metrics_file="$W/$name.jsonl" "$@" \
    > "$W/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { echo "  $name: tptrain exited $rc"; tail -15 "$W/$name.log"; }
  return $rc
}
# compare REF OTHER REL NAME: OTHER (resumed at iteration 8) against REF's iterations 9..16
compare() {
  local ref=$1 other=$2 rel=$3 name=$4
  $PY - "$ref" "$other" "$W/$name.ref.jsonl" <<'PY'
import json, sys
want = {json.loads(l)["iteration"] for l in open(sys.argv[2]) if l.strip()}
with open(sys.argv[3], "w") as out:
    for l in open(sys.argv[1]):
        if l.strip() and json.loads(l)["iteration"] in want:
            out.write(l)
PY
  if out=$($PY "$CMP" "$W/$name.ref.jsonl" "$other" --rel "$rel" --min-iters 8 \
      --keys lm_loss,grad_norm,load_balancing_loss,z_loss); then ok "$name"; else bad "$name"; fi
  echo "$out"
}
EP2=(--set parallel.expert_model_parallel_size=2 --set parallel.distributed_optimizer=true)

run 4 straight "${EP2[@]}" || bad "straight EP 2 x DP 4"
run 4 first "${EP2[@]}" --set training.train_iters=8 --set checkpoint.save="$W/ck" &&
  run 4 resume "${EP2[@]}" --set checkpoint.load="$W/ck"
compare "$W/straight.jsonl" "$W/resume.jsonl" 0 "EP 2 x DP 4 (distributed optimizer): 8 + resume 8 bitwise equal to 16 straight"
if grep -rqa "h.1.mlp.router.expert_bias" "$W/ck"; then ok "the expert bias is in the checkpoint"
else bad "the checkpoint has no h.1.mlp.router.expert_bias"; fi

if grep -q "saved on TP 1 x PP 1 x DP 4, EP 2" "$W/resume.log"; then ok "the load names the saving layout (TP 1 x PP 1 x DP 4, EP 2)"
else bad "the load's log line does not name EP 2"; grep "loaded checkpoint" "$W/resume.log"; fi

run 1 ep1 --set checkpoint.load="$W/ck" && compare "$W/straight.jsonl" "$W/ep1.jsonl" 1e-6 "EP 2 checkpoint resumed at EP 1 (1 rank)"
run 4 ep4 --set checkpoint.load="$W/ck" --set parallel.expert_model_parallel_size=4 &&
  compare "$W/straight.jsonl" "$W/ep4.jsonl" 1e-6 "EP 2 checkpoint resumed at EP 4 x DP 4"
run 4 tp2 --set checkpoint.load="$W/ck" --set parallel.expert_model_parallel_size=2 --set parallel.tensor_model_parallel_size=2 \
  --set parallel.sequence_parallel=true --set parallel.expert_tensor_parallel_size=1 &&
  compare "$W/straight.jsonl" "$W/tp2.jsonl" 1e-6 "EP 2 checkpoint resumed at EP 2 x TP 2 (SP, ETP 1)"
# experts split over TP (ETP = TP 2): each rank's box of an expert is also a box along its width; an
# ETP 1 checkpoint resumes there, and one saved there resumes with whole experts on one rank
ETP2=(--set parallel.tensor_model_parallel_size=2 --set parallel.sequence_parallel=true
      --set parallel.expert_tensor_parallel_size=2)
run 4 etp2 --set checkpoint.load="$W/ck" "${EP2[@]}" "${ETP2[@]}" &&
  compare "$W/straight.jsonl" "$W/etp2.jsonl" 1e-6 "EP 2 checkpoint (ETP 1) resumed at EP 2 x TP 2 with ETP 2"
run 4 first_etp2 "${EP2[@]}" "${ETP2[@]}" --set training.train_iters=8 --set checkpoint.save="$W/ck_etp2" &&
  run 1 from_etp2 --set checkpoint.load="$W/ck_etp2" &&
  compare "$W/straight.jsonl" "$W/from_etp2.jsonl" 1e-6 "EP 2 x TP 2 ETP 2 checkpoint resumed at EP 1 (1 rank, ETP 1)"
finish
