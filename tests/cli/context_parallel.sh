#!/usr/bin/env bash
# Context parallelism (parallel.context_parallel_size; docs/ARCHITECTURE.md "Context parallelism")
# trains as one rank does: per-step lm loss and grad norm, and the final parameters (the saved
# checkpoint's boxes as global tensors), of CP 2, CP 4, CP 2 x DP 2 with the distributed optimizer
# and TP 2 x CP 2 x PP 2 within 1e-5 of the one-rank run (GPT-2 with biases: grad norm and parameters
# within 3e-5, see below), for the GPT-2 model and the Llama shape (RoPE, GQA with 2 groups, SwiGLU,
# RMSNorm) in fp32; in bf16 CP 2 and TP 2 x CP 2 x PP 2 losses within 2e-3 of bf16 on one rank;
# with sequence parallelism, the interleaved / zb-h1 / gpipe schedules, selective and full recompute,
# fp16, and document masks (data.reset_position_ids, data.eod_mask_loss: global positions). A checkpoint
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

# compare_params REF OTHER REL: the final parameters (checkpoint boxes assembled) within REL
# (Frobenius, per tensor), except the attention's key bias: its exact gradient is 0 (a shift of every
# key of a query's row), so what is trained into it is rounding noise, which differs with the split of
# the attention; it stays near 0 and is compared absolutely (1e-5)
compare_params() {
  $PY - "$1" "$2" "$3" <<'PYEOF'
import sys
import numpy as np
sys.path.insert(0, __import__("os").environ["TPTRAIN_SRC"] + "/tests/tools")
import checkpoint_tensors as ct
a, b, rel = ct.read_checkpoint(sys.argv[1]), ct.read_checkpoint(sys.argv[2]), float(sys.argv[3])
assert sorted(a) == sorted(b), "tensor names differ"
worst = (0.0, "")
for name in a:
    x, y = a[name].astype(np.float64), b[name].astype(np.float64)
    if name.endswith("attn.qkv.bias") and x.shape[0] == 3:  # GPT-2: [q; k; v]
        assert np.abs(x[1] - y[1]).max() <= 1e-5 and np.abs(x[1]).max() <= 1e-4, (name, "key bias")
        x, y = x[[0, 2]], y[[0, 2]]
    r = np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30)
    worst = max(worst, (r, name))
print(f"  parameters: {len(a)} tensors, max relative difference {worst[0]:.2e} ({worst[1]})")
sys.exit(0 if worst[0] <= rel else 1)
PYEOF
}

# run MODEL NAME NP "section.key=value ..." [REF [REL [GREL]]]: trains MODEL.yaml on NP ranks (metrics
# in $W/NAME.jsonl, checkpoint in $W/ckpt_NAME), then compares the lm losses within REL, the grad
# norms and the final parameters within GREL (default REL) with run REF (no REF: a
# reference run; PARAMS=no: losses and grad norms only)
run() {
  local model=$1 name=$2 np=$3 sets=() kv ref=${5:-} rel=${6:-1e-5} grel=${7:-${6:-1e-5}}
  for kv in $4; do sets+=(--set "$kv"); done
  if ! timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/$model.yaml" "${sets[@]}" \
      --set logging.metrics_file="$W/$name.jsonl" --set checkpoint.save="$W/ckpt_$name" > "$W/$name.log" 2>&1; then
    bad "$name: tptrain exited non-zero (np $np: $4)"; tail -20 "$W/$name.log"; return
  fi
  if [ -z "$ref" ]; then ok "$name (reference run; np $np $4)"; return; fi
  local out what="loss within $rel, grad norm within $grel"
  [ "${PARAMS:-yes}" = yes ] && what+=", parameters within $grel"
  if out=$($PY "$CMP" "$W/$ref.jsonl" "$W/$name.jsonl" --keys lm_loss --rel "$rel" &&
           $PY "$CMP" "$W/$ref.jsonl" "$W/$name.jsonl" --keys grad_norm --rel "$grel" &&
           { [ "${PARAMS:-yes}" != yes ] || compare_params "$W/ckpt_$ref" "$W/ckpt_$name" "$grel"; }); then
    ok "$name vs $ref: $what (np $np: $4)"
  else
    bad "$name vs $ref: $what (np $np: $4)"
  fi
  echo "$out"
}
CP=parallel.context_parallel_size
TP=parallel.tensor_model_parallel_size
PP=parallel.pipeline_model_parallel_size
# GPT-2's grad norm and parameters within 3e-5: its attention key bias gets rounding noise as gradient
# (above), which Adam's first steps scale up, and ln_1.bias reaches the keys through the QKV weight
# too; without linear biases GPT-2 matches within 1e-5 as the Llama shape does
for m in gpt llama; do
  g=1e-5; [ $m = gpt ] && g=3e-5
  run $m ${m}_single 1 ""
  run $m ${m}_cp2 2 "$CP=2" ${m}_single 1e-5 $g
  run $m ${m}_cp4 4 "$CP=4 training.micro_batch_size=8" ${m}_single 1e-5 $g
  run $m ${m}_cp2_dp2_distopt 4 "$CP=2 parallel.distributed_optimizer=true parallel.overlap_grad_reduce=true parallel.ddp_bucket_size=1" ${m}_single 1e-5 $g
  run $m ${m}_tp2_cp2_pp2 8 "$TP=2 $CP=2 $PP=2 training.micro_batch_size=2" ${m}_single 1e-5 $g
  # bf16: the ring's fp32 merge against one rank's attention, both stored in bf16
  run $m ${m}_bf16 1 "training.precision=bf16"
  PARAMS=no run $m ${m}_cp2_bf16 2 "$CP=2 training.precision=bf16" ${m}_bf16 2e-3 5e-2
  PARAMS=no run $m ${m}_tp2_cp2_pp2_bf16 8 "$TP=2 $CP=2 $PP=2 training.micro_batch_size=2 training.precision=bf16" ${m}_bf16 2e-3 5e-2
done
run gpt gpt_nobias 1 "model.add_bias_linear=false"
run gpt gpt_nobias_cp4 4 "$CP=4 training.micro_batch_size=8 model.add_bias_linear=false" gpt_nobias
run gpt gpt_cp2_pp2_v2_full 4 "$CP=2 $PP=2 parallel.virtual_pipeline_model_parallel_size=2 training.micro_batch_size=2 training.recompute=full" gpt_single 1e-5 3e-5
run llama llama_fp16 1 "training.precision=fp16 optimizer.initial_loss_scale=1024"
PARAMS=no run llama llama_cp2_gpipe_fp16 4 "$CP=2 $PP=2 parallel.pipeline_schedule=gpipe training.micro_batch_size=2 training.precision=fp16 optimizer.initial_loss_scale=1024" llama_fp16 2e-3 5e-2
run gpt gpt_tp2_cp2_sp_zb 4 "$TP=2 $CP=2 parallel.sequence_parallel=true parallel.pipeline_schedule=zb-h1 training.recompute=selective" gpt_single 1e-5 3e-5
# document masks: positions restart per document (global positions within the sequence), EOD targets masked
masks="data.reset_position_ids=true data.eod_mask_loss=true"
run llama llama_masks 1 "$masks"
run llama llama_masks_cp2 2 "$CP=2 $masks" llama_masks
run gpt gpt_masks 1 "$masks"
run gpt gpt_masks_cp4 4 "$CP=4 training.micro_batch_size=8 $masks" gpt_masks 1e-5 3e-5

# resume across CP: saved at CP 2 after 4 iterations, continued at CP 1 and CP 4 to 8; iterations 5..8
# as the uninterrupted CP 2 run's (the one-rank run's within 1e-5)
run gpt gpt_cp2_half 2 "$CP=2 training.train_iters=4 optimizer.lr_decay_iters=8"  # the 8-iteration schedule
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
    for key, rel in (("lm_loss", 1e-5), ("grad_norm", 3e-5)):  # GPT-2's grad norm: see run's note
        assert abs(j[key] - ref[k][key]) <= rel * abs(ref[k][key]), (k, key, j[key], ref[k][key])
PYEOF
  then ok "a checkpoint saved at CP 2 resumes at CP $cp (iterations 5..8 as the CP 2 run's: loss 1e-5, grad norm 3e-5)"
  else bad "resume at CP $cp of a CP 2 checkpoint"; tail -5 "$W/resume$cp.log"; fi
done
if grep -q "saved on TP 1 x CP 2 x PP 1 x DP 1)" "$W/resume1.log"; then ok "the load names the saving layout (TP 1 x CP 2 x PP 1 x DP 1)"
else bad "the load's log line does not name CP 2"; grep "loaded checkpoint" "$W/resume1.log"; fi

# plan = allocation on rank 0, with CP (bytes of the trainer's start-up line = tptrain plan's stage 0)
alloc_vs_plan() {  # name np sets...
  local name=$1 np=$2; shift 2
  local sets=() s
  for s in "$@"; do sets+=(--set "$s"); done
  timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/gpt.yaml" --set training.train_iters=2 "${sets[@]}" \
    > "$W/$name.log" 2>&1 || { bad "$name: training exited non-zero"; return; }
  local allocated planned
  allocated=$(sed -nE 's/^memory: allocated [0-9.]+ MiB \(([0-9]+) bytes\).*/\1/p' "$W/$name.log")
  # CPU ranks: the plan's tensors, without the GPU backend's own buffers
  planned=$("$TPTRAIN" plan --config "$W/gpt.yaml" --world-size "$np" "${sets[@]}" --json |
            $PY -c "import json, sys; print(json.load(sys.stdin)['stages'][0]['tensor_bytes'])")
  if [ -n "$allocated" ] && [ "$allocated" = "$planned" ]; then ok "$name: allocated = plan = $planned bytes (np $np $*)"
  else bad "$name: allocated '$allocated', plan '$planned' (np $np $*)"; fi
  grep -q "^memory: no device allocation or free in iterations 2..2" "$W/$name.log" ||
    bad "$name: the allocator was called in iteration 2"
}
alloc_vs_plan plan_cp2 2 $CP=2
alloc_vs_plan plan_tp2_cp2_pp2_bf16 8 $TP=2 $CP=2 $PP=2 training.micro_batch_size=2 training.precision=bf16
alloc_vs_plan plan_cp2_dp2_distopt_selective 4 $CP=2 parallel.distributed_optimizer=true training.recompute=selective

# Llama 3 8B at seq 32768 on 64 GPUs: TP 2 does not fit 80 GB at CP 1 (the activations), the plan
# suggests a CP that fits and says why; with that CP configured the plan fits and shows the CP axis
L8=("$TPTRAIN_SRC/configs/llama3-8b.yaml" --world-size 64 --set model.seq_length=32768 --set parallel.data_parallel_size=null
    --set training.micro_batch_size=1)
if "$TPTRAIN" plan --config "${L8[@]}" --json > "$W/l8.json" 2> "$W/l8.err" &&
   "$TPTRAIN" plan --config "${L8[@]}" > "$W/l8.txt" 2>&1 &&
   $PY - "$W/l8.json" <<'PYEOF'
import json, sys
p = json.load(open(sys.argv[1]))
assert not p["fits"] and p["cp"] == 1, "CP 1 fits"
cp = [s for s in p["suggestions"] if s["change"].startswith("parallel.context_parallel_size=") and s["fits"]]
assert cp and "at CP 1" in cp[0]["note"] and "only CP splits the sequence" in cp[0]["note"], p["suggestions"]
print("  suggested:", cp[0]["change"], "--", cp[0]["note"])
PYEOF
then ok "plan: Llama 3 8B at seq 32768 on 64 GPUs suggests a CP that fits 80 GB and says why CP 1 does not"
else bad "plan: Llama 3 8B at seq 32768 suggests CP"; cat "$W/l8.err"; fi
if "$TPTRAIN" plan --config "${L8[@]}" --set $CP=2 > "$W/l8cp.txt" 2>&1 && grep -q "^fits: yes" "$W/l8cp.txt" &&
   grep -q "^grid: TP 2 x CP 2 x PP 1 x DP 16 = 64 ranks" "$W/l8cp.txt" && grep -q "^context parallel: CP 2" "$W/l8cp.txt" &&
   grep -q "on GPUs its blocks run cuDNN's SDPA (where libcudnn.so.9 loads): forward one call per ring step, backward one per pair of token chunks" "$W/l8cp.txt" &&
   "$TPTRAIN" plan --config "${L8[@]}" --set $CP=2 --set training.deterministic=false > "$W/l8cpn.txt" 2>&1 &&
   grep -q "its blocks run cuDNN's SDPA (where libcudnn.so.9 loads): one call per ring step, forward and backward" "$W/l8cpn.txt" &&
   "$TPTRAIN" plan --config "${L8[@]}" --set $CP=2 --set training.precision=fp32 > "$W/l8cp32.txt" 2>&1 &&
   grep -q "its blocks run the fallback kernel" "$W/l8cp32.txt"
then ok "plan: Llama 3 8B at seq 32768 with CP 2 fits, shows the CP axis and the ring blocks' kernel (cuDNN in bf16, the fallback in fp32)"
else bad "plan with CP 2"; head -20 "$W/l8cp.txt"; fi
# the step time prices the fallback's blocks at its measured slowdown (300x cuDNN's flash attention)
if "$TPTRAIN" plan --config "${L8[@]}" --set $CP=2 --json > "$W/l8cp.json" 2>/dev/null &&
   "$TPTRAIN" plan --config "${L8[@]}" --set $CP=2 --set training.precision=fp32 --json > "$W/l8cp32.json" 2>/dev/null &&
   $PY - "$W/l8cp.json" "$W/l8cp32.json" <<'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert (a["cp_attention_kernel"], b["cp_attention_kernel"]) == ("cudnn", "fallback")
r = b["time"]["attention_s"] / a["time"]["attention_s"]
print("  attention: fallback %.4g s, cuDNN %.4g s (%.1fx)" % (b["time"]["attention_s"], a["time"]["attention_s"], r))
assert 290 < r < 301, r
PYEOF
then ok "plan: the ring's fallback blocks priced at 300x flash attention's time"
else bad "plan: the fallback's price"; fi

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
  "$TPTRAIN" plan --config "$W/gpt.yaml" --world-size 8 --set $CP=2 --set $TP=4 --set parallel.sequence_parallel=true \
  --set model.seq_length=8
expect2 world_not_divisible "parallel.context_parallel_size (4)" \
  timeout 120 mpirun -np 2 "$TPTRAIN" --config "$W/gpt.yaml" --set $CP=4
expect2 cp_zero "parallel.context_parallel_size" "$TPTRAIN" plan --config "$W/gpt.yaml" --set $CP=0
finish
