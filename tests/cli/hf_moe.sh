#!/usr/bin/env bash
# Hugging Face Mixture-of-Experts checkpoints in and out (interop/hf/moe.cpp; docs/MOE.md "Hugging
# Face checkpoints"; README). Random checkpoints from tests/reference/make_hf_moe.py (2 layers, hidden
# 64, 4 heads / 2 KV heads, byte-level vocabulary 257, weights of std 0.15, router std 0.6):
#   mx  MixtralForCausalLM, 4 experts of width 48, top 2, bf16, 3 shards + index;
#   qw  Qwen2MoeForCausalLM, decoder_sparse_step 2 (layer 0 a dense MLP of 96, layer 1 MoE), 4
#       experts of 32, top 2, norm_topk_prob false, a gated shared expert of 64, q/k/v biases, fp32,
#       2 shards;
#   qn  Qwen2-MoE with norm_topk_prob true and mlp_only_layers [1] (layer 0 MoE, layer 1 dense), bf16;
#   q3  Qwen3MoeForCausalLM (q/k RMSNorm: model.qk_layernorm), decoder_sparse_step 2, norm_topk_prob
#       false, bf16, 2 shards; q3n the same with norm_topk_prob true, every layer MoE, fp32.
# They must
#  (a) train from model.init_from with the per-step losses (within 1e-5, fp32) of the PyTorch reference
#      initialised from the same files (gpt_ref.py --init; its own loader hf_moe_ref.py) on 1 rank and
#      on TP2 (sequence parallel) x EP2 x PP2 x DP2 (Mixtral also with ETP 2); Qwen3-MoE with rotary_interleaved (q/k rows and
#      norm weights permuted at import) = its rotate-half run;
#  (b) round trip: imported on TP2 x EP2 x PP2 x DP2 (each rank reading only its experts; Mixtral also
#      with ETP 2, each rank reading its part of their width), one step at
#      lr 0, exported with --max-shard-size (several shards + index): every tensor's bytes and dtype
#      equal the input's, config.json's MoE keys equal;
#  (c) tptrain generate on the imported-then-trained Qwen2-MoE and Qwen3-MoE: every greedy token the argmax
#      of transformers' forward (hf_moe_ref.HFMoEModel, greedy.load) on the exported directory;
#  (d) exit 2 naming the problem: a missing, an extra and a duplicated (index) expert tensor, a shape
#      that disagrees with config.json, router_jitter_noise != 0, a sigmoid router, norm_topk_prob
#      against moe_router_pre_softmax, the MoE layers against moe_layer_freq, Qwen3-MoE without
#      model.qk_layernorm, an MoE checkpoint for a dense model.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1
REF=$TPTRAIN_SRC/tests/reference
source "$TPTRAIN_SRC/tests/cli/hf_lib.sh"
source "$TPTRAIN_SRC/tests/cli/ref_lib.sh"  # ref_py: the reference runs forked from one Python
TOL=(--loss-abs 1e-5 --gradnorm-rel 1e-4 --lr-rel 1e-6 --min-iters 6)
COMMON=(--layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --experts 4 --topk 2)

$PY "$REF/make_hf_moe.py" --arch mixtral --out "$W/mx" "${COMMON[@]}" --expert-ffn 48 --dtype bf16 --shards 3 \
  --seed 3 > "$W/make.log" 2>&1 &&
$PY "$REF/make_hf_moe.py" --arch qwen2_moe --out "$W/qw" "${COMMON[@]}" --expert-ffn 32 --shared-ffn 64 \
  --sparse-step 2 --dtype f32 --shards 2 --seed 4 >> "$W/make.log" 2>&1 &&
$PY "$REF/make_hf_moe.py" --arch qwen2_moe --out "$W/qn" "${COMMON[@]}" --expert-ffn 32 --shared-ffn 64 \
  --mlp-only-layers 1 --norm-topk-prob --dtype bf16 --seed 6 >> "$W/make.log" 2>&1 &&
$PY "$REF/make_hf_moe.py" --arch qwen3_moe --out "$W/q3" "${COMMON[@]}" --expert-ffn 32 --sparse-step 2 \
  --dtype bf16 --shards 2 --seed 7 >> "$W/make.log" 2>&1 &&
$PY "$REF/make_hf_moe.py" --arch qwen3_moe --out "$W/q3n" "${COMMON[@]}" --expert-ffn 32 --norm-topk-prob \
  --dtype f32 --seed 8 >> "$W/make.log" 2>&1 &&
$PY "$REF/make_tokens.py" --vocab 257 --tokens 1400 --docs 7 --pattern markov --seed 1 --megatron "$W/tokens" \
  >> "$W/make.log" 2>&1 || { cat "$W/make.log"; echo "FAIL inputs"; echo "0 passed, 1 failed"; exit 1; }
sed 's/^/     /' "$W/make.log"

# the model configs of the five config.json files (seq 16 of their 64 positions)
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, ffn_hidden_size: 96, seq_length: 16,
        max_position_embeddings: 64, vocab_size: 257, make_vocab_size_divisible_by: 64, layernorm_epsilon: 1.0e-5,
        normalization: RMSNorm, swiglu: true, position_embedding_type: rope, rotary_base: 10000,
        group_query_attention: true, num_query_groups: 2, untie_embeddings_and_output_weights: true,
        add_bias_linear: false, init_from: $W/mx, num_moe_experts: 4, moe_ffn_hidden_size: 48, moe_router_topk: 2}
training: {micro_batch_size: 8, global_batch_size: 8, train_iters: 6, precision: fp32, seed: 5, cpu_threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, lr_decay_style: cosine, lr_decay_iters: 6,
            weight_decay: 0.1, adam_beta1: 0.9, adam_beta2: 0.95, adam_eps: 1.0e-8, clip_grad: 1.0}
data: {path: $W/tokens, shuffle: false, split: [1, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML
QWEN="add_qkv_bias: true, moe_shared_expert_intermediate_size: 64, moe_shared_expert_gate: true, moe_ffn_hidden_size: 32"
sed -e "s|init_from: $W/mx,|init_from: $W/qw, moe_layer_freq: [0, 1], moe_router_pre_softmax: true, $QWEN,|" \
    -e 's/moe_ffn_hidden_size: 48, //' "$W/cfg.yaml" > "$W/cfg_qw.yaml"
sed -e "s|init_from: $W/mx,|init_from: $W/qn, moe_layer_freq: [1, 0], $QWEN,|" -e 's/moe_ffn_hidden_size: 48, //' \
    "$W/cfg.yaml" > "$W/cfg_qn.yaml"
sed -e "s|init_from: $W/mx,|init_from: $W/q3, moe_layer_freq: [0, 1], moe_router_pre_softmax: true, qk_layernorm: true,|" \
    -e 's/moe_ffn_hidden_size: 48/moe_ffn_hidden_size: 32/' "$W/cfg.yaml" > "$W/cfg_q3.yaml"
sed -e "s|init_from: $W/mx,|init_from: $W/q3n, qk_layernorm: true,|" -e 's/moe_ffn_hidden_size: 48/moe_ffn_hidden_size: 32/' \
    "$W/cfg.yaml" > "$W/cfg_q3n.yaml"
GRID=(--set parallel.tensor_model_parallel_size=2 --set parallel.sequence_parallel=true
      --set parallel.pipeline_model_parallel_size=2 --set parallel.expert_model_parallel_size=2
      --set parallel.expert_tensor_parallel_size=1 --set training.micro_batch_size=2)
# the same with the experts split over TP (ETP = TP 2): each rank reads its rows of w1 / w3 and its
# columns of w2
GRID_ETP2=("${GRID[@]/expert_tensor_parallel_size=1/expert_tensor_parallel_size=2}")

# --- (a) training from init_from = the reference from the same files --------------------------------
for n in mx qw qn q3 q3n; do
  c=$W/cfg_$n.yaml; [ $n = mx ] && c=$W/cfg.yaml
  REF_TIMEOUT=120 ref_py "$W/ref_$n.log" "$REF/gpt_ref.py" --config "$c" --out "$W/ref_$n.jsonl" --threads 1 &&
    grep -q "Hugging Face .* weights from $W/$n" "$W/ref_$n.log" || { bad "reference gpt_ref.py --init $W/$n"; tail -3 "$W/ref_$n.log"; }
done
tptrain mx1 1 && compare mx1 ref_mx "Mixtral (bf16, 3 shards), 1 rank = reference" "${TOL[@]}"
grep -q "init_from: Hugging Face Mixtral $W/mx/model.safetensors.index.json (3 shards, BF16; .*4 experts top-2)" \
  "$W/mx1.log" && ok "the start-up log names Mixtral, the index, 3 shards, 4 experts top-2" || { bad "start-up log"; grep init_from "$W/mx1.log"; }
tptrain mxg 8 "${GRID[@]}" && compare mxg ref_mx "Mixtral on TP2 (SP) x EP2 x PP2 x DP2 = reference" "${TOL[@]}"
tptrain mxe 8 "${GRID_ETP2[@]}" && compare mxe ref_mx "Mixtral on TP2 (SP) x EP2 x PP2 x DP2, ETP 2 = reference" "${TOL[@]}"
CFG=$W/cfg_qw.yaml tptrain qw1 1 --set checkpoint.save="$W/ck_qw1" &&
  compare qw1 ref_qw "Qwen2-MoE (dense + MoE layer, gated shared expert, q/k/v biases, norm_topk_prob false), 1 rank = reference" "${TOL[@]}"
CFG=$W/cfg_qw.yaml tptrain qwg 8 "${GRID[@]}" && compare qwg ref_qw "Qwen2-MoE on TP2 (SP) x EP2 x PP2 x DP2 = reference" "${TOL[@]}"
CFG=$W/cfg_qn.yaml tptrain qn1 1 && compare qn1 ref_qn "Qwen2-MoE norm_topk_prob true, mlp_only_layers [1], 1 rank = reference" "${TOL[@]}"
CFG=$W/cfg_q3.yaml tptrain q31 1 --set checkpoint.save="$W/ck_q31" &&
  compare q31 ref_q3 "Qwen3-MoE (q/k norms, dense + MoE layer, norm_topk_prob false), 1 rank = reference" "${TOL[@]}"
CFG=$W/cfg_q3.yaml tptrain q3g 8 "${GRID[@]}" && compare q3g ref_q3 "Qwen3-MoE on TP2 (SP) x EP2 x PP2 x DP2 = reference" "${TOL[@]}"
CFG=$W/cfg_q3.yaml tptrain q3i 1 --set model.rotary_interleaved=true &&
  compare q3i q31 "Qwen3-MoE with rotary_interleaved (q/k rows and norms permuted at import) = rotate-half run" "${TOL[@]}"
CFG=$W/cfg_q3n.yaml tptrain q3n1 1 && compare q3n1 ref_q3n "Qwen3-MoE norm_topk_prob true, every layer MoE, 1 rank = reference" "${TOL[@]}"

# --- (b) round trips from TP2 x EP2 x PP2 x DP2 -----------------------------------------------------
tptrain rt_mx 8 "${GRID[@]}" --set training.precision=bf16 --set checkpoint.save="$W/ck_mx" "${ZERO[@]}" &&
  RT_KEYS=num_local_experts,num_experts_per_tok,router_jitter_noise,sliding_window roundtrip mx "$W/mx" --max-shard-size 60KB
tptrain rt_mxe 8 "${GRID_ETP2[@]}" --set training.precision=bf16 --set checkpoint.save="$W/ck_mxe" "${ZERO[@]}" &&
  RT_KEYS=num_local_experts,num_experts_per_tok,router_jitter_noise,sliding_window roundtrip mxe "$W/mx" --max-shard-size 60KB
QK=num_experts,num_experts_per_tok,moe_intermediate_size,shared_expert_intermediate_size,norm_topk_prob,decoder_sparse_step,mlp_only_layers,qkv_bias,use_sliding_window
CFG=$W/cfg_qw.yaml tptrain rt_qw 8 "${GRID[@]}" --set checkpoint.save="$W/ck_qw" "${ZERO[@]}" &&
  RT_KEYS=$QK roundtrip qw "$W/qw" --max-shard-size 100KB
CFG=$W/cfg_qn.yaml tptrain rt_qn 4 --set parallel.expert_model_parallel_size=4 --set training.micro_batch_size=2 \
  --set checkpoint.save="$W/ck_qn" "${ZERO[@]}" && RT_KEYS=$QK roundtrip qn "$W/qn" --dtype bf16
Q3K=num_experts,num_experts_per_tok,moe_intermediate_size,norm_topk_prob,decoder_sparse_step,mlp_only_layers,use_sliding_window
CFG=$W/cfg_q3.yaml tptrain rt_q3 8 "${GRID[@]}" --set training.precision=bf16 --set checkpoint.save="$W/ck_q3" \
  "${ZERO[@]}" && RT_KEYS=$Q3K roundtrip q3 "$W/q3" --max-shard-size 80KB
CFG=$W/cfg_q3.yaml tptrain rt_q3i 1 --set model.rotary_interleaved=true --set checkpoint.save="$W/ck_q3i" "${ZERO[@]}" &&
  RT_KEYS=$Q3K roundtrip q3i "$W/q3" --dtype bf16 --max-shard-size 80KB
echo "     $(ls "$W/out_mx" | tr '\n' ' ')"

# --- (c) generate on the imported-then-trained Qwen2-MoE = transformers' forward on its export ----------
timeout 60 "$TPTRAIN" export --checkpoint "$W/ck_qw1" --output "$W/out_qw1" > "$W/export_qw1.log" 2>&1 ||
  { bad "export of the trained checkpoint"; cat "$W/export_qw1.log"; }
greedy_check "generate on the imported-then-trained Qwen2-MoE = transformers' forward (hf_moe_ref.HFMoEModel)" \
  "$W/ck_qw1" "$W/out_qw1" 30
timeout 60 "$TPTRAIN" export --checkpoint "$W/ck_q31" --output "$W/out_q31" > "$W/export_q31.log" 2>&1 ||
  { bad "export of the trained Qwen3-MoE"; cat "$W/export_q31.log"; }
greedy_check "generate on the imported-then-trained Qwen3-MoE = transformers' forward" "$W/ck_q31" "$W/out_q31" 30

# --- (d) bad input: exit 2, naming the problem ----------------------------------------------------------
# edit SRC DST PY-STATEMENTS: a copy of checkpoint SRC whose tensors t ({name: array}) and index wm
# ({name: shard}) the statements change, each shard rewritten in its dtype
edit() {
  rm -rf "$W/$2"; cp -r "$W/$1" "$W/$2"
  $PY - "$REF" "$W/$2" "$3" <<'PY'
import json, os, sys
sys.path.insert(0, sys.argv[1])
import gpt_ref, make_hf_weights
d = sys.argv[2]
wm = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
t = {}
for s in sorted(set(wm.values())):
    t.update(gpt_ref.read_safetensors(os.path.join(d, s)))
exec(sys.argv[3])
dt = "bf16" if json.load(open(os.path.join(d, "config.json")))["torch_dtype"] == "bfloat16" else "f32"
for s in sorted(set(wm.values())):
    make_hf_weights.write_safetensors(os.path.join(d, s), {n: t[n] for n in t if wm[n] == s}, dt,
                                      metadata={"format": "pt"})
json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=1)
PY
}
ONE=(timeout 60 "$TPTRAIN" --config "$W/cfg.yaml" --set training.train_iters=1)
E3=model.layers.1.block_sparse_moe.experts.3
edit mx missing "del t['$E3.w2.weight']; del wm['$E3.w2.weight']"
expect2 "a missing expert tensor" "tensor '$E3.w2.weight' is missing" "${ONE[@]}" --set model.init_from="$W/missing"
edit mx extra "t['${E3%3}4.w1.weight'] = t['$E3.w1.weight']; wm['${E3%3}4.w1.weight'] = wm['$E3.w1.weight']"
expect2 "an extra expert tensor" "unexpected tensor '${E3%3}4.w1.weight' (config.json: MixtralForCausalLM, 2 layers, 4 experts" \
  "${ONE[@]}" --set model.init_from="$W/extra"
rm -rf "$W/twice"; cp -r "$W/mx" "$W/twice"
$PY - "$W/twice/model.safetensors.index.json" "$E3.w1.weight" <<'PY'
import sys
p, name = sys.argv[1], sys.argv[2]
lines = open(p).read().split("\n")
i = next(k for k, l in enumerate(lines) if f'"{name}"' in l)
lines.insert(i, lines[i].rstrip(",") + ",")  # the same entry again
open(p, "w").write("\n".join(lines))
PY
expect2 "an expert named twice in the index" "weight_map names tensor '$E3.w1.weight' twice" \
  "${ONE[@]}" --set model.init_from="$W/twice"
rm -rf "$W/shape"; cp -r "$W/mx" "$W/shape"; sed -i 's/"intermediate_size": 48/"intermediate_size": 40/' "$W/shape/config.json"
expect2 "an expert shape that disagrees with config.json" \
  "tensor 'model.layers.0.block_sparse_moe.experts.0.w1.weight' has shape [48, 64], but config.json implies [40, 64]" \
  "${ONE[@]}" --set model.init_from="$W/shape" --set model.moe_ffn_hidden_size=40
rm -rf "$W/jitter"; cp -r "$W/mx" "$W/jitter"; sed -i 's/"router_jitter_noise": 0.0/"router_jitter_noise": 0.01/' "$W/jitter/config.json"
expect2 "router_jitter_noise != 0" "router_jitter_noise is 0.01: tptrain's router has no jitter" \
  "${ONE[@]}" --set model.init_from="$W/jitter"
expect2 "a sigmoid router" "MixtralForCausalLM cannot hold this model: model.moe_router_score_function is sigmoid" \
  "${ONE[@]}" --set model.moe_router_score_function=sigmoid
expect2 "norm_topk_prob against moe_router_pre_softmax" \
  "norm_topk_prob is false but model.moe_router_pre_softmax is false" \
  timeout 60 "$TPTRAIN" --config "$W/cfg_qw.yaml" --set training.train_iters=1 --set model.moe_router_pre_softmax=false
expect2 "decoder_sparse_step against moe_layer_freq" \
  "decoder_sparse_step / mlp_only_layers make the MoE layers [0, 1] but model.moe_layer_freq makes them [1, 1]" \
  timeout 60 "$TPTRAIN" --config "$W/cfg_qw.yaml" --set training.train_iters=1 --set model.moe_layer_freq=1
expect2 "Qwen3-MoE without model.qk_layernorm" \
  "Qwen3MoeForCausalLM normalises q and k per head (self_attn.q_norm, k_norm) but model.qk_layernorm is false" \
  timeout 60 "$TPTRAIN" --config "$W/cfg_q3.yaml" --set training.train_iters=1 --set model.qk_layernorm=false
sed 's/, num_moe_experts: 4, moe_ffn_hidden_size: 48, moe_router_topk: 2//' "$W/cfg.yaml" > "$W/cfg_dense.yaml"
expect2 "an MoE checkpoint for a dense model" "a Mixture-of-Experts MixtralForCausalLM but model.num_moe_experts is null" \
  timeout 60 "$TPTRAIN" --config "$W/cfg_dense.yaml" --set training.train_iters=1

finish
