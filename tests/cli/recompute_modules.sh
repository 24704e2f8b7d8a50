#!/usr/bin/env bash
# The mlp and shared_experts recompute modules (training.recompute_modules, Megatron's; README "Activation
# recompute"): with selective recompute a dense layer's fc1 output and activation (mlp), or an MoE layer's
# shared expert's (shared_experts), are not kept but rerun in backward -- the same calls on the same values,
# so every loss and gradient norm equals the run without the module bit for bit -- and the stage allocates
# less, as planned (plan = allocation). mlp pairs on
# the GPT (GELU, biases) and Llama (SwiGLU) shapes: 1 rank; TP 2 + SP (ln2 gathered again); PP 2 zb-h1 x CP 2
# with the layernorm module (W reruns ln2 and the MLP a second time); PP 2 interleaved (pooled slots); with the layernorm module and FP8
# tensorwise on TP 2 + SP (ln2's FP8 codes gathered in the GEMM, the activation's saved codes rewritten by
# fc2's forward); FP8 delayed on PP 2 zb-h1 x TP 2 + SP; FP8 blockwise on TP 2 + SP (hidden 256); FP8
# parameters (the rerun reads the weights' codes) on TP 2 + SP x DP 2; an MoE model's dense layers
# (model.moe_layer_freq) on EP 2. shared_experts pairs: an MoE Llama with a shared expert on 1 rank; on EP 2
# x DP 2 (pooled kept rows) with moe_act and layernorm, PP 2 interleaved; with its gate, FP8 tensorwise on
# TP 2 + SP (its input gathered as codes); GPT FP8 delayed on PP 2 zb-h1.
set -u
source "$TPTRAIN_SRC/tests/cli/lib.sh"
source "$TPTRAIN_SRC/tests/cli/fp8_lib.sh"
cd "$W" || exit 1
fp8_setup "the mlp and shared_experts recompute modules"
export MIN_STEPS=8
LLAMA=(--set model.normalization=RMSNorm --set model.swiglu=true --set model.ffn_hidden_size=128 --set model.position_embedding_type=rope
       --set model.group_query_attention=true --set model.num_query_groups=2
       --set model.untie_embeddings_and_output_weights=true --set model.add_bias_linear=false)
TP2SP=(--set parallel.tensor_model_parallel_size=2 --set parallel.sequence_parallel=true)
SEL=(--set training.recompute=selective --set training.train_iters=8 --set optimizer.lr_decay_iters=8)
# pair NAME NP ARGS...: NAME with the modules $BASE (default [core_attn]), NAME_mod with $MOD (default mlp)
# added; the same losses and gradient norms bit for bit, and NAME_mod allocates less, as planned
pair() {
  local name=$1 np=$2 base=${BASE:-core_attn} mod=${MOD:-mlp}
  shift 2
  tpt "$name" "$np" "$@" "${SEL[@]}" --set "training.recompute_modules=[$base]" &&
    tpt "${name}_mod" "$np" "$@" "${SEL[@]}" --set "training.recompute_modules=[$base, $mod]" || { bad "$name: a run failed"; return; }
  local out
  if out=$("$PY" - "$W/$name" "$W/${name}_mod" 2>&1 <<'PYEOF'
import json, re, sys
runs = [[(json.loads(l)["lm_loss"], json.loads(l)["grad_norm"]) for l in open(p + ".jsonl")] for p in sys.argv[1:3]]
mem = [re.search(r"^memory: allocated .* \((\d+) bytes\) on rank 0 \(plan: .* \((\d+) bytes\)", open(p + ".log").read(), re.M)
       for p in sys.argv[1:3]]
a, b = runs
if not (len(a) == len(b) == 8 and a == b):
    sys.exit("losses / grad norms differ: %r" % [(x[0] - y[0], x[1] - y[1]) for x, y in zip(a, b)])
(alloc0, plan0), (alloc1, plan1) = (map(int, m.groups()) for m in mem)
if not (alloc1 == plan1 and alloc1 < alloc0):
    sys.exit("memory on rank 0: %d allocated, %d planned with the module; %d without" % (alloc1, plan1, alloc0))
print("%d -> %d bytes on rank 0" % (alloc0, alloc1))
PYEOF
); then ok "$name: bit for bit with the $mod module, $out as planned"; else bad "$name: $out"; fi
}
pair gpt 1
pair llama_tp2sp 2 "${LLAMA[@]}" "${TP2SP[@]}"
BASE="core_attn, layernorm" pair llama_zb_cp 4 "${LLAMA[@]}" --set parallel.pipeline_model_parallel_size=2 --set parallel.pipeline_schedule=zb-h1 \
  --set parallel.context_parallel_size=2
pair gpt_interleaved 2 --set parallel.pipeline_model_parallel_size=2 --set parallel.virtual_pipeline_model_parallel_size=2
BASE="core_attn, layernorm" pair llama_ln_fp8_tw 2 "${LLAMA[@]}" "${TP2SP[@]}" --set training.fp8_format=hybrid \
  --set training.fp8_recipe=tensorwise
pair llama_fp8_delayed_zb 4 "${LLAMA[@]}" "${TP2SP[@]}" --set parallel.pipeline_model_parallel_size=2 \
  --set parallel.pipeline_schedule=zb-h1 --set training.fp8_format=hybrid --set training.fp8_recipe=delayed \
  --set training.fp8_amax_history_len=4
pair llama_fp8_blockwise 2 "${LLAMA[@]}" "${TP2SP[@]}" --set model.num_layers=2 --set model.hidden_size=256 \
  --set model.ffn_hidden_size=256 --set model.seq_length=256 --set training.micro_batch_size=1 \
  --set training.global_batch_size=4 --set training.fp8_format=hybrid --set training.fp8_recipe=blockwise
pair llama_fp8_params 4 "${LLAMA[@]}" "${TP2SP[@]}" --set parallel.data_parallel_size=2 \
  --set parallel.distributed_optimizer=true --set training.fp8_format=hybrid --set training.fp8_recipe=tensorwise \
  --set training.fp8_param_gather=true
pair moe_dense_layers 2 "${LLAMA[@]}" --set model.num_moe_experts=4 --set model.moe_ffn_hidden_size=32 \
  --set model.moe_router_topk=2 "--set" "model.moe_layer_freq=[0,1,0,1]" --set parallel.expert_model_parallel_size=2 \
  --set training.fp8_format=hybrid --set training.fp8_recipe=tensorwise
SH=(--set model.num_moe_experts=4 --set model.moe_ffn_hidden_size=32 --set model.moe_router_topk=2
    --set model.moe_shared_expert_intermediate_size=64)
export MOD=shared_experts
pair shared 1 "${LLAMA[@]}" "${SH[@]}"
BASE="core_attn, moe_act, layernorm" pair shared_ep2_interleaved 4 "${LLAMA[@]}" "${SH[@]}" \
  --set parallel.pipeline_model_parallel_size=2 --set parallel.virtual_pipeline_model_parallel_size=2 \
  --set parallel.expert_model_parallel_size=2 --set parallel.data_parallel_size=2
pair shared_gate_fp8_tp2sp 2 "${LLAMA[@]}" "${SH[@]}" "${TP2SP[@]}" --set model.moe_shared_expert_gate=true \
  --set training.fp8_format=hybrid --set training.fp8_recipe=tensorwise
pair shared_gpt_fp8_zb 2 "${SH[@]}" --set parallel.pipeline_model_parallel_size=2 --set parallel.pipeline_schedule=zb-h1 \
  --set training.fp8_format=hybrid --set training.fp8_recipe=delayed
finish
