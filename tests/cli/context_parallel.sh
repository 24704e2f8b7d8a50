#!/usr/bin/env bash
# Context parallelism (parallel.context_parallel_size; docs/ARCHITECTURE.md "Context parallelism")
# trains as one rank does: per-step lm loss and grad norm, and the final parameters (the saved
# checkpoint's boxes as global tensors), of CP 2, CP 4, CP 2 x DP 2 with the distributed optimizer
# and TP 2 x CP 2 x PP 2 within 1e-5 of the one-rank run, for the GPT-2 model and the Llama shape
# (RoPE, GQA with 2 groups, SwiGLU, RMSNorm) in fp32; in bf16 CP 2 within 2e-3 of bf16 on one rank;
# with document masks (data.reset_position_ids, data.eod_mask_loss: global positions). A checkpoint
# saved at CP 2 resumes at CP 1 and CP 4. The plan counts CP's memory to the byte (allocation on
# rank 0 = tptrain plan), and bad combinations exit 2 naming the keys.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1
CMP="$TPTRAIN_SRC/tests/tools/compare_runs.py"
CKT="$TPTRAIN_SRC/tests/tools/checkpoint_tensors.py"
$PY "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 40000 --docs 50 --seed 3 \
  --megatron "$W/data" >/dev/null 2>&1 || { echo "FAIL: make_tokens.py"; echo "0 passed, 1 failed"; exit 1; }
common="training: {micro_batch_size: 4, global_batch_size: 8, train_iters: 8, cpu_threads: 1, seed: 7, device: cpu}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, weight_decay: 0.1, clip_grad: 0.5}
data: {path: $W/data, shuffle: true, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}"
cat > "$W/gpt.yaml" <<YAML
model: {num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
$common
YAML
cat > "$W/llama.yaml" <<YAML
model: {num_layers: 4, hidden_size: 64, num_attention_heads: 8, group_query_attention: true, num_query_groups: 2,
        kv_channels: 8, ffn_hidden_size: 96, swiglu: true, normalization: RMSNorm,
        position_embedding_type: rope, rotary_base: 500000, untie_embeddings_and_output_weights: true,
        add_bias_linear: false, seq_length: 16, max_position_embeddings: 16, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
$common
YAML

# run MODEL NAME NP "section.key=value ..." [REF [REL]]: trains MODEL.yaml on NP ranks (metrics in
# $W/NAME.jsonl, checkpoint in $W/ckpt_NAME), then compares losses, grad norms and the final
# parameters with run REF within REL (no REF: a reference run)
run() {
  local model=$1 name=$2 np=$3 sets=() kv ref=${5:-} rel=${6:-1e-5}
  for kv in $4; do sets+=(--set "$kv"); done
  if ! timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/$model.yaml" "${sets[@]}" \
      --set logging.metrics_file="$W/$name.jsonl" --set checkpoint.save="$W/ckpt_$name" > "$W/$name.log" 2>&1; then
    bad "$name: tptrain exited non-zero (np $np: $4)"; tail -20 "$W/$name.log"; return
  fi
  if [ -z "$ref" ]; then ok "$name (reference run; np $np $4)"; return; fi
  local out
  if out=$($PY "$CMP" "$W/$ref.jsonl" "$W/$name.jsonl" --rel "$rel" &&
           $PY "$CKT" compare "$W/ckpt_$ref" "$W/ckpt_$name" --rel "$rel"); then
    ok "$name vs $ref within $rel (np $np: $4)"
  else
    bad "$name vs $ref within $rel (np $np: $4)"
  fi
  echo "$out"
}
CP=parallel.context_parallel_size
TP=parallel.tensor_model_parallel_size
PP=parallel.pipeline_model_parallel_size
for m in gpt llama; do
  run $m ${m}_single 1 ""
  run $m ${m}_cp2 2 "$CP=2" ${m}_single
  run $m ${m}_cp4 4 "$CP=4 training.micro_batch_size=8" ${m}_single
  run $m ${m}_cp2_dp2_distopt 4 "$CP=2 parallel.distributed_optimizer=true parallel.overlap_grad_reduce=true parallel.ddp_bucket_size=1" ${m}_single
  run $m ${m}_tp2_cp2_pp2 8 "$TP=2 $CP=2 $PP=2 training.micro_batch_size=2" ${m}_single
  run $m ${m}_bf16 1 "training.precision=bf16"
  run $m ${m}_cp2_bf16 2 "$CP=2 training.precision=bf16" ${m}_bf16 2e-3
done
run gpt gpt_tp2_cp2_sp_zb 4 "$TP=2 $CP=2 parallel.sequence_parallel=true parallel.pipeline_schedule=zb-h1 training.recompute=selective" gpt_single
# document masks: positions restart per document (global positions within the sequence), EOD targets masked
masks="data.reset_position_ids=true data.eod_mask_loss=true"
run llama llama_masks 1 "$masks"
run llama llama_masks_cp2 2 "$CP=2 $masks" llama_masks
run gpt gpt_masks 1 "$masks"
run gpt gpt_masks_cp4 4 "$CP=4 training.micro_batch_size=8 $masks" gpt_masks

# resume across CP: saved at CP 2 after 4 iterations, continued at CP 1 and CP 4 to 8; iterations 5..8
# as the uninterrupted CP 2 run's (the one-rank run's within 1e-5)
run gpt gpt_cp2_half 2 "$CP=2 training.train_iters=4"
for cp in 1 4; do
  mkdir -p "$W/resume$cp"; cp -r "$W/ckpt_gpt_cp2_half/." "$W/resume$cp/"
  if timeout 300 mpirun -np $cp "$TPTRAIN" --config "$W/gpt.yaml" --set $CP=$cp --set checkpoint.load="$W/resume$cp" \
      --set checkpoint.save="$W/resume$cp" --set logging.metrics_file="$W/resume$cp.jsonl" > "$W/resume$cp.log" 2>&1 &&
     $PY - "$W/gpt_cp2.jsonl" "$W/resume$cp.jsonl" <<'PYEOF'
import json, sys
ref = {j["iteration"]: j for j in map(json.loads, open(sys.argv[1]))}
got = {j["iteration"]: j for j in map(json.loads, open(sys.argv[2]))}
assert sorted(got) == [5, 6, 7, 8], sorted(got)
for k, j in got.items():
    for key in ("lm_loss", "grad_norm"):
        assert abs(j[key] - ref[k][key]) <= 1e-5 * abs(ref[k][key]), (k, key, j[key], ref[k][key])
PYEOF
  then ok "a checkpoint saved at CP 2 resumes at CP $cp (iterations 5..8 within 1e-5 of the CP 2 run)"
  else bad "resume at CP $cp of a CP 2 checkpoint"; tail -5 "$W/resume$cp.log"; fi
done

# plan = allocation on rank 0, with CP (bytes of the trainer's start-up line = tptrain plan's stage 0)
alloc_vs_plan() {  # name np sets...
  local name=$1 np=$2; shift 2
  local sets=() s
  for s in "$@"; do sets+=(--set "$s"); done
  timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/gpt.yaml" --set training.train_iters=1 "${sets[@]}" \
    > "$W/$name.log" 2>&1 || { bad "$name: training exited non-zero"; return; }
  local allocated planned
  allocated=$(sed -nE 's/^memory: allocated [0-9.]+ MiB \(([0-9]+) bytes\).*/\1/p' "$W/$name.log")
  planned=$("$TPTRAIN" plan --config "$W/gpt.yaml" --world-size "$np" "${sets[@]}" --json |
            $PY -c "import json, sys; print(json.load(sys.stdin)['stages'][0]['total_bytes'])")
  if [ -n "$allocated" ] && [ "$allocated" = "$planned" ]; then ok "$name: allocated = plan = $planned bytes (np $np $*)"
  else bad "$name: allocated '$allocated', plan '$planned' (np $np $*)"; fi
}
alloc_vs_plan plan_cp2 2 $CP=2
alloc_vs_plan plan_tp2_cp2_pp2_bf16 8 $TP=2 $CP=2 $PP=2 training.micro_batch_size=2 training.precision=bf16
alloc_vs_plan plan_cp2_dp2_distopt_selective 4 $CP=2 parallel.distributed_optimizer=true training.recompute=selective

# bad combinations exit 2 naming the keys
expect2() {  # name "expected text" command...
  local name=$1 want=$2; shift 2
  "$@" > "$W/$name.out" 2>&1; local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$want" "$W/$name.out"; then ok "$name exits 2 naming '$want'"
  else bad "$name: exit $rc, wanted 2 and '$want'"; cat "$W/$name.out"; fi
}
expect2 seq_not_divisible "model.seq_length (16) is not divisible by 2 * parallel.context_parallel_size" \
  "$TPTRAIN" plan --config "$W/gpt.yaml" --world-size 3 --set $CP=3
expect2 seq_not_divisible_sp "with parallel.sequence_parallel" \
  "$TPTRAIN" plan --config "$W/gpt.yaml" --world-size 8 --set $CP=2 --set $TP=4 --set parallel.sequence_parallel=true
expect2 world_not_divisible "parallel.context_parallel_size (4)" \
  timeout 120 mpirun -np 2 "$TPTRAIN" --config "$W/gpt.yaml" --set $CP=4
expect2 cp_zero "parallel.context_parallel_size" "$TPTRAIN" plan --config "$W/gpt.yaml" --set $CP=0
finish
