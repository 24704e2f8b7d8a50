#!/usr/bin/env bash
# FP8 in MoE layers (docs/FP8.md "MoE layers"): each routed expert's fc1 and fc2 and the shared expert's
# GEMMs in FP8 (the router and the shared expert's gate stay bf16), against the emulated-FP8 PyTorch
# reference (tests/reference/gpt_ref.py + moe_ref.py + fp8_train_ref.py: an expert's GEMMs per
# micro-batch on its rows in token order, its own delayed-scaling state), per-step losses. The model:
# GPT, 4 layers of hidden 64, 4 experts (top 2, width 64) and a shared expert of width 32, bf16, hybrid,
# margin 18 (FP8 moves the losses far from bf16's: the comparison sees it). Measured on this machine
# (2026-12-05, the probabilities applied in the experts: fc2 quantizes p x act, in both):
#  (i)   tensorwise: 7.6e-3 from the reference (bound 1e-2; 3.6e-5 at step 1), 0.45 from bf16 (> 0.1);
#  (ii)  delayed, history 4 with max: 3.3e-3 (1e-2), 0.47 from bf16;
#  (iii) blockwise (hidden 256, expert and shared widths 128, 2 layers, 10 steps): 1.9e-3 (1e-2), 1.6e-2
#        from tensorwise's (> 5e-3) and 0.89 from bf16's.
# Layouts against 1 rank. Which are invariant follows from where a scale comes from:
#  - delayed: one step's amax per expert and GEMM input, reduced (max) over TP x DP x CP (which spans
#    EP), so every layout quantizes with 1 rank's scales: PP 2 within 1e-5 (2.6e-6), TP 2 + SP (expert
#    TP 2) and EP 2 within 1e-2 (4.5e-3, 3.3e-3; the first step's loss on EP 2 is 1 rank's bit for bit,
#    then bf16 roundings flip FP8 codes and routing choices: bf16 alone on TP 2 drifts 1.1e-3);
#  - tensorwise: an expert's scales from its rows on the rank, reduced over its expert-TP group only, so
#    PP 2 is bit for bit, DP 2 (each rank's own micro-batches) within 2e-4 (2.3e-5), TP 2 + SP within
#    1e-2 (2.7e-3); with EP 2 an expert's rows are two ranks' micro-batches: other scales, as in
#    Megatron (not asserted beyond 2e-2; measured 8.1e-3);
#  - blockwise: the forward's and input gradient's blocks are within a row, so with fp8_wgrad: false EP 2
#    is 1 rank's up to the gradient sums' order (1e-6; measured 1.1e-7); the weight gradient's 128 x 1
#    blocks run along an expert's rows, which EP regroups (measured 1.4e-3, not asserted).
# Checkpoints: delayed scaling's state of every expert ([E, 3] scales, [E, 3, history] amaxes per fc),
# resumed bit for bit on 1 rank, and on EP 2 within 2e-4 of the 1-rank continuation (measured 6.6e-5; a
# fresh EP 2 run is 6.5e-4 away).
set -u
source "$TPTRAIN_SRC/tests/cli/lib.sh"
source "$TPTRAIN_SRC/tests/cli/fp8_lib.sh"
cd "$W" || exit 1
fp8_setup "FP8 MoE parity" ", num_moe_experts: 4, moe_router_topk: 2, moe_ffn_hidden_size: 64, moe_shared_expert_intermediate_size: 32"
sed -e 's/num_layers: 4, hidden_size: 64/num_layers: 2, hidden_size: 256/' -e 's/train_iters: 20/train_iters: 10/' \
  -e 's/moe_ffn_hidden_size: 64/moe_ffn_hidden_size: 128/' \
  -e 's/moe_shared_expert_intermediate_size: 32/moe_shared_expert_intermediate_size: 128/' "$W/cfg.yaml" > "$W/cfgb.yaml"
CFG=$W/cfg.yaml

TW=(--set training.fp8_format=hybrid --set training.fp8_recipe=tensorwise --set training.fp8_margin=18)
DL=(--set training.fp8_format=hybrid --set training.fp8_recipe=delayed --set training.fp8_margin=18
    --set training.fp8_amax_history_len=4 --set training.fp8_amax_compute_algo=max)
tpt bf16 1
tpt tw 1 "${TW[@]}" && ref tw_ref "${TW[@]}"
if grep -q "FP8: hybrid" "$W/tw.log" && within tw tw_ref 1e-2 bf16 0.1; then
  ok "(i) MoE tensorwise: the reference's losses (1e-2), far from bf16's"
else bad "(i) MoE tensorwise"; fi
tpt dl 1 "${DL[@]}" && ref dl_ref "${DL[@]}"
if within dl dl_ref 1e-2 bf16 0.1; then ok "(ii) MoE delayed, history 4 max: the reference's losses (1e-2), far from bf16's"
else bad "(ii) MoE delayed"; fi

# the FP8 scratch (experts at the dispatch bound's rows) and the delayed state: plan = allocation
plan_ok=1
for r in tw dl; do
  grep -qE "^memory: allocated .* \(([0-9]+) bytes\) on rank 0 \(plan: [0-9.]+ MiB \(\1 bytes\)" "$W/$r.log" || plan_ok=0
done
[ $plan_ok = 1 ] && ok "tensorwise and delayed MoE: the plan's bytes are the allocation's" || bad "plan = allocation"

# ---- layouts against 1 rank
# PP 2 bit for bit needs an untied output layer: the tied embedding's gradient is the embedding's plus
# the LM head's, added in another order when they sit on two stages (last bits of a few rows; the
# clipped and updated weights then drift: 2.4e-3 over 20 steps here, measured 2026-12-04)
UT=(--set model.untie_embeddings_and_output_weights=true)
tpt tw_u 1 "${TW[@]}" "${UT[@]}" && tpt tw_u_pp2 2 "${TW[@]}" "${UT[@]}" --set parallel.pipeline_model_parallel_size=2
within tw_u_pp2 tw_u 0 && ok "tensorwise PP 2 (untied output layer): 1 rank's losses bit for bit" || bad "tensorwise PP 2"
tpt tw_dp2 2 "${TW[@]}" --set parallel.data_parallel_size=2
within tw_dp2 tw 2e-4 && ok "tensorwise DP 2: 1 rank's losses (2e-4)" || bad "tensorwise DP 2"
tpt tw_tp2 2 "${TW[@]}" --set parallel.tensor_model_parallel_size=2 --set parallel.sequence_parallel=true
within tw_tp2 tw 1e-2 && ok "tensorwise TP 2 + SP (expert TP 2): 1 rank's losses (1e-2)" || bad "tensorwise TP 2"
tpt tw_ep2 2 "${TW[@]}" --set parallel.data_parallel_size=2 --set parallel.expert_model_parallel_size=2
within tw_ep2 tw 2e-2 && ok "tensorwise EP 2 (other rows, other scales): near 1 rank's losses (2e-2)" || bad "tensorwise EP 2"
tpt dl_u 1 "${DL[@]}" "${UT[@]}" && tpt dl_u_pp2 2 "${DL[@]}" "${UT[@]}" --set parallel.pipeline_model_parallel_size=2
within dl_u_pp2 dl_u 0 && ok "delayed PP 2 (untied output layer): 1 rank's losses bit for bit" || bad "delayed PP 2"
tpt dl_tp2 2 "${DL[@]}" --set parallel.tensor_model_parallel_size=2 --set parallel.sequence_parallel=true
within dl_tp2 dl 1e-2 && ok "delayed TP 2 + SP (expert TP 2): 1 rank's losses (1e-2)" || bad "delayed TP 2"
tpt dl_ep2 2 "${DL[@]}" --set parallel.data_parallel_size=2 --set parallel.expert_model_parallel_size=2
if within dl_ep2 dl 1e-2 && "$PY" - "$W/dl_ep2.jsonl" "$W/dl.jsonl" <<'PYEOF'
import json, sys
a, b = ([json.loads(l)["lm_loss"] for l in open(p)] for p in sys.argv[1:])
print(f"  step 1: {a[0]!r} and {b[0]!r}")
sys.exit(0 if a[0] == b[0] else 1)
PYEOF
then ok "delayed EP 2: 1 rank's losses (1e-2), step 1 bit for bit (every expert's scales are global)"
else bad "delayed EP 2"; fi

# ---- delayed scaling's expert state in checkpoints: resume bit for bit, and on EP 2
R=("${DL[@]}" --set training.train_iters=8 --set optimizer.lr_decay_iters=8)
tpt full8 1 "${R[@]}"
tpt first4 1 "${R[@]}" --set training.train_iters=4 --set checkpoint.save="$W/ck" --set checkpoint.save_interval=4
tpt resumed 1 "${R[@]}" --set checkpoint.load="$W/ck"
tpt resumed_ep2 2 "${R[@]}" --set checkpoint.load="$W/ck" --set parallel.data_parallel_size=2 \
  --set parallel.expert_model_parallel_size=2
if "$PY" - "$W/ck/iter_0000004/model_tp00_pp000.safetensors" <<'PYEOF'
import json, struct, sys
import numpy as np
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
def get(k):
    s, e = h[k]["data_offsets"]
    return h[k]["shape"], np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32)
shape, v = get("h.0.mlp.experts.fc1.fp8_scale")
hshape, _ = get("h.3.mlp.experts.fc2.fp8_amax_history")
sshape, _ = get("h.1.mlp.shared_experts.fc1.fp8_scale")
rows = v.reshape(4, 3)
print(f"  h.0.mlp.experts.fc1.fp8_scale {shape}: {rows[:, 0]} (inputs); history {hshape}; shared {sshape}")
# each expert its own scales (amaxes of its own rows), none left at the initial 1
sys.exit(0 if shape == [4, 3] and hshape == [4, 3, 4] and sshape == [3] and len(set(rows[:, 0])) > 1
         and (rows != 1).all() else 1)
PYEOF
then ok "checkpoint: every expert's delayed-scaling state ([E, 3] scales, [E, 3, 4] amaxes), the shared expert's"
else bad "checkpoint: the experts' FP8 state"; fi
within resumed full8 0 && ok "delayed MoE resumed at step 4: the uninterrupted run's losses bit for bit" || bad "resume"
within resumed_ep2 resumed 2e-4 && ok "delayed MoE resumed on EP 2: the 1-rank continuation's losses (2e-4)" ||
  bad "resume on EP 2"

# ---- blockwise (every linear dimension a multiple of 128)
CFG=$W/cfgb.yaml
BW=(--set training.fp8_format=hybrid --set training.fp8_recipe=blockwise --set training.fp8_margin=18)
tpt bw 1 "${BW[@]}" && ref bw_ref "${BW[@]}" && tpt bw_tw 1 "${TW[@]}"
if within bw bw_ref 1e-2 bw_tw 5e-3; then ok "(iii) MoE blockwise: the reference's losses (1e-2), far from tensorwise's"
else bad "(iii) MoE blockwise"; fi
tpt bw_nw 1 "${BW[@]}" --set training.fp8_wgrad=false
tpt bw_nw_ep2 2 "${BW[@]}" --set training.fp8_wgrad=false --set parallel.data_parallel_size=2 \
  --set parallel.expert_model_parallel_size=2
within bw_nw_ep2 bw_nw 1e-6 && ok "blockwise, fp8_wgrad false, EP 2: 1 rank's losses (1e-6)" || bad "blockwise EP 2"
finish
