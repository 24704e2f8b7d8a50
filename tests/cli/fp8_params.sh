#!/usr/bin/env bash
# FP8 parameters (training.fp8_param_gather, docs/FP8.md "FP8 parameters"): the FP8 layers' linear
# weights (experts' too) kept as FP8 codes only, cast from the master weights on the ranks that own them and all-gathered
# as codes. Their codes are those the weights' own quantization makes (of the master weights rounded as
# the 16-bit copy holds them, with the same scale), so the losses are those without FP8 parameters bit for
# bit -- where the gradient norm does not enter the step: with optimizer.clip_grad 0. (FP8 parameters
# have a span of their own after every 16-bit tensor, so the distributed optimizer's blocks, and with them
# the order in which the gradient norm is summed, change: the norms differ in their last bits (4e-16
# measured), which can move the clip factor by an ulp; with clipping the losses were equal bit for bit in
# every run measured here (GPT tensorwise and delayed on DP 2, on TP 2 + SP x DP 2), asserted within 2e-3.)
#  - bad combinations exit 2 naming the keys;
#  - bit for bit with clip_grad 0: GPT delayed (history 4, max) on DP 2 with the overlapped gradient
#    reduction and parameter gathers (small buckets: the codes' gather waited for layer by layer); the
#    Llama shape tensorwise on TP 2 + SP x DP 2 (the weight's amax over its TP shards and its owners) and
#    on PP 2 zb-h1 x CP 2 with the first layer in bf16; an MoE GPT with a shared expert (every expert's
#    weights FP8 parameters too, a span of their own over EDP) delayed on EP 2 x DP 4 and on TP 2 + SP
#    with expert TP 2 x DP 2 (overlapped gathers); with evaluations between steps;
#  - blockwise (each 128 x 128 block's amax from its owners' parts, reduced over DP x CP, the experts' over
#    EDP; hidden 256): the Llama shape on TP 2 + SP x DP 2, an MoE GPT on TP 2 + SP x DP 2 with expert TP 1
#    (EDP 4), bit for bit;
#  - with clipping (1.0): within 2e-3 of the run without (measured: equal);
#  - checkpoints hold the master weights, not codes: a run saved at step 4 resumes with FP8 parameters
#    and without them, both the uninterrupted run's losses bit for bit;
#  - the memory: allocated as planned (plan = allocation), less than without.
set -u
source "$TPTRAIN_SRC/tests/cli/lib.sh"
source "$TPTRAIN_SRC/tests/cli/fp8_lib.sh"
cd "$W" || exit 1

BASE="$TPTRAIN_SRC/tests/cli/bad_configs/base_valid.yaml"
F8=(--set training.precision=bf16 --set training.fp8_format=hybrid --set parallel.distributed_optimizer=true)
expect_exit2 pg_no_fp8 "training.fp8_param_gather: FP8 parameters need FP8 training" \
  timeout 20 "$TPTRAIN" --config "$BASE" --set training.fp8_param_gather=true
expect_exit2 pg_no_dist "needs parallel.distributed_optimizer: true" \
  timeout 20 "$TPTRAIN" --config "$BASE" "${F8[@]}" --set parallel.distributed_optimizer=false --set training.fp8_param_gather=true
expect_exit2 pg_remainders "optimizer.store_param_remainders" \
  timeout 20 "$TPTRAIN" --config "$BASE" "${F8[@]}" --set optimizer.store_param_remainders=true --set training.fp8_param_gather=true
expect_exit2 pg_fp16_states "optimizer.exp_avg_dtype: fp16" \
  timeout 20 "$TPTRAIN" --config "$BASE" "${F8[@]}" --set optimizer.use_precision_aware_optimizer=true \
  --set optimizer.exp_avg_dtype=fp16 --set training.fp8_param_gather=true

fp8_setup "FP8 parameters"
LLAMA=(--set model.normalization=RMSNorm --set model.swiglu=true --set model.ffn_hidden_size=128 --set model.position_embedding_type=rope
       --set model.group_query_attention=true --set model.num_query_groups=2
       --set model.untie_embeddings_and_output_weights=true --set model.add_bias_linear=false)
TW=(--set training.fp8_format=hybrid --set training.fp8_recipe=tensorwise)
DL=(--set training.fp8_format=hybrid --set training.fp8_recipe=delayed --set training.fp8_margin=18
    --set training.fp8_amax_history_len=4 --set training.fp8_amax_compute_algo=max)
DIST=(--set parallel.distributed_optimizer=true --set optimizer.clip_grad=0)
PG=(--set training.fp8_param_gather=true)
export MIN_STEPS=20
# pair NAME NP ARGS...: NAME (without) and NAME_pg (with FP8 parameters)
pair() {
  local name=$1 np=$2
  shift 2
  tpt "$name" "$np" "$@" && tpt "${name}_pg" "$np" "$@" "${PG[@]}"
}
pair dp2 2 "${DL[@]}" "${DIST[@]}" --set parallel.data_parallel_size=2 --set parallel.overlap_grad_reduce=true \
  --set parallel.overlap_param_gather=true --set parallel.ddp_bucket_size=2000 --set data.split=[90,10,0] \
  --set data.eval_iters=2 --set data.eval_interval=5
if grep -q "FP8 parameters" "$W/dp2_pg.log" && within dp2_pg dp2 0 &&
   diff <(grep "validation loss" "$W/dp2.log") <(grep "validation loss" "$W/dp2_pg.log") >/dev/null &&
   [ "$(grep -c "validation loss" "$W/dp2_pg.log")" -ge 3 ]; then
  ok "GPT delayed on DP 2, overlapped gathers, evaluations: the losses without FP8 parameters bit for bit"
else bad "GPT delayed on DP 2 with FP8 parameters"; fi
pair tp2 4 "${TW[@]}" "${LLAMA[@]}" "${DIST[@]}" --set parallel.tensor_model_parallel_size=2 \
  --set parallel.sequence_parallel=true --set parallel.data_parallel_size=2
within tp2_pg tp2 0 && ok "Llama tensorwise on TP 2 + SP x DP 2: bit for bit" || bad "Llama tensorwise on TP 2 + SP x DP 2"
pair zbcp 4 "${TW[@]}" "${LLAMA[@]}" "${DIST[@]}" --set parallel.pipeline_model_parallel_size=2 \
  --set parallel.pipeline_schedule=zb-h1 --set parallel.context_parallel_size=2 --set training.first_last_layers_bf16=true \
  --set training.num_layers_at_end_in_bf16=0
within zbcp_pg zbcp 0 && ok "Llama tensorwise on PP 2 zb-h1 x CP 2, the first layer bf16: bit for bit" || bad "Llama on PP 2 zb-h1 x CP 2"
CFG="$W/moe.yaml"
sed 's/make_vocab_size_divisible_by: 8}/make_vocab_size_divisible_by: 8, num_moe_experts: 4, moe_router_topk: 2, moe_ffn_hidden_size: 64, moe_shared_expert_intermediate_size: 32}/' \
  "$W/cfg.yaml" > "$CFG"
pair moe 4 "${DL[@]}" "${DIST[@]}" --set parallel.data_parallel_size=4 --set parallel.expert_model_parallel_size=2
within moe_pg moe 0 && ok "MoE GPT (shared expert) delayed on EP 2 x DP 4: bit for bit" || bad "MoE GPT on EP 2"
pair moe_etp 4 "${TW[@]}" "${DIST[@]}" --set parallel.data_parallel_size=2 --set parallel.tensor_model_parallel_size=2 \
  --set parallel.sequence_parallel=true --set parallel.expert_tensor_parallel_size=2 --set parallel.overlap_param_gather=true \
  --set parallel.overlap_grad_reduce=true --set parallel.ddp_bucket_size=3000
within moe_etp_pg moe_etp 0 && ok "MoE GPT tensorwise on TP 2 + SP, expert TP 2 x DP 2: bit for bit" || bad "MoE GPT on expert TP 2"
# expert TP 1 under TP 2 with the experts' biases: a 16-bit experts' span padded over EDP 4 before the FP8
# parameters' spans, where DP x CP is 2 (every span starts at a multiple of both units: an expert width of
# 40 once failed here); and `tptrain plan`'s suggestion of the key for that layout
sed 's/moe_ffn_hidden_size: 64/moe_ffn_hidden_size: 40/' "$W/moe.yaml" > "$W/moe40.yaml"
CFG="$W/moe40.yaml"
M40=("${TW[@]}" "${DIST[@]}" --set parallel.data_parallel_size=2 --set parallel.tensor_model_parallel_size=2
     --set parallel.sequence_parallel=true --set parallel.expert_tensor_parallel_size=1)
pair moe40 4 "${M40[@]}"
within moe40_pg moe40 0 && ok "MoE GPT with expert biases, expert TP 1 under TP 2 (EDP 4): bit for bit" || bad "MoE GPT, EDP 4, width 40"
if timeout 60 "$TPTRAIN" plan --config "$CFG" --world-size 4 "${M40[@]}" --device-memory-gib 0.001 > "$W/plan40.log" 2>&1 &&
   grep -q "^  training.fp8_param_gather=true " "$W/plan40.log"; then ok "plan suggests training.fp8_param_gather=true there"
else bad "plan's suggestion for the EDP 4 layout"; sed 's/^/    /' "$W/plan40.log" | tail -3; fi
unset CFG
# blockwise scaling: every 128 x 128 block's amax from its owners' parts (a part cuts blocks and rows), so
# every linear width a multiple of 128 per TP rank: hidden 256, 2 layers, 10 steps (fp8.sh's blockwise shape)
sed -e 's/num_layers: 4, hidden_size: 64/num_layers: 2, hidden_size: 256/' -e 's/train_iters: 20/train_iters: 10/' \
  "$W/cfg.yaml" > "$W/cfgb.yaml"
export MIN_STEPS=10
BW=(--set training.fp8_format=hybrid --set training.fp8_recipe=blockwise --set training.fp8_margin=18)
CFG="$W/cfgb.yaml"
pair bw_tp2 4 "${BW[@]}" "${LLAMA[@]}" --set model.ffn_hidden_size=512 "${DIST[@]}" --set parallel.tensor_model_parallel_size=2 \
  --set parallel.sequence_parallel=true --set parallel.data_parallel_size=2 --set parallel.overlap_param_gather=true
within bw_tp2_pg bw_tp2 0 && ok "Llama blockwise on TP 2 + SP x DP 2: bit for bit" || bad "Llama blockwise on TP 2 + SP x DP 2"
CFG="$W/moeb.yaml"
sed 's/make_vocab_size_divisible_by: 8}/make_vocab_size_divisible_by: 8, num_moe_experts: 4, moe_router_topk: 2, moe_ffn_hidden_size: 128, moe_shared_expert_intermediate_size: 256}/' \
  "$W/cfgb.yaml" > "$CFG"
# expert TP 1 under TP 2: the experts' replicas (EDP 4) span both TP ranks, where DP x CP is 2 (reduced
# over DP x CP instead, measured 7.2e-3 apart)
pair bw_moe 4 "${BW[@]}" "${DIST[@]}" --set parallel.data_parallel_size=2 --set parallel.tensor_model_parallel_size=2 \
  --set parallel.sequence_parallel=true --set parallel.expert_tensor_parallel_size=1
within bw_moe_pg bw_moe 0 && ok "MoE GPT blockwise on TP 2 + SP x DP 2, expert TP 1 (the experts' blocks over EDP 4): bit for bit" ||
  bad "MoE GPT blockwise"
unset CFG
export MIN_STEPS=20
CL=("${TW[@]}" --set parallel.distributed_optimizer=true --set parallel.data_parallel_size=2)
pair clip 2 "${CL[@]}"
within clip_pg clip 2e-3 && ok "with clipping: within 2e-3 of the losses without FP8 parameters" || bad "with clipping"

# checkpoints: the master weights; resumed with and without FP8 parameters
R=("${DL[@]}" "${DIST[@]}" --set parallel.data_parallel_size=2 --set training.train_iters=8 --set optimizer.lr_decay_iters=8)
tpt full8 2 "${R[@]}" "${PG[@]}"
tpt first4 2 "${R[@]}" "${PG[@]}" --set training.train_iters=4 --set checkpoint.save="$W/ck" --set checkpoint.save_interval=4
tpt res 2 "${R[@]}" "${PG[@]}" --set checkpoint.load="$W/ck"
tpt res_off 2 "${R[@]}" --set checkpoint.load="$W/ck"
resumed() {  # A B: B's iterations are 5..8, A's losses bit for bit
  "$PY" - "$W/$1.jsonl" "$W/$2.jsonl" <<'PYEOF'
import json, sys
a, b = ({json.loads(l)["iteration"]: json.loads(l)["lm_loss"] for l in open(p)} for p in sys.argv[1:3])
print(f"  {sys.argv[2].rsplit('/', 1)[-1]}: iterations {sorted(b)}, max |d| {max(abs(a[k] - b[k]) for k in b):.2e}")
sys.exit(0 if sorted(b) == [5, 6, 7, 8] and all(a[k] == b[k] for k in b) else 1)
PYEOF
}
if resumed full8 res && resumed full8 res_off; then
  ok "resumed at step 4 with and without FP8 parameters: the uninterrupted run's losses bit for bit"
else bad "resume with FP8 parameters"; fi

# memory: as planned, and less than without (the 16-bit copy and the kept rowwise codes of the FP8 layers'
# dense weights replaced by their codes)
alloc() { sed -n 's/^memory: allocated .* (\([0-9]*\) bytes) on rank 0 (plan: .* (\([0-9]*\) bytes).*/\1 \2/p' "$W/$1.log"; }
for r in dp2 tp2 zbcp moe moe_etp moe40 bw_tp2 bw_moe; do
  read -r a_pg p_pg <<< "$(alloc ${r}_pg)"
  read -r a_x _ <<< "$(alloc $r)"
  if [ -n "${a_pg:-}" ] && [ "$a_pg" = "$p_pg" ] && [ "$a_pg" -lt "$a_x" ]; then
    ok "memory of $r on rank 0: allocated $a_pg bytes as planned, $a_x without FP8 parameters"
  else bad "memory of $r: allocated ${a_pg:-?} (plan ${p_pg:-?}), without ${a_x:-?}"; fi
done
finish
