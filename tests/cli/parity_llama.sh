#!/usr/bin/env bash
# End-to-end parity of the LLaMA family's options (docs/ARCHITECTURE.md "Model"): tptrain against the
# independent PyTorch reference tests/reference/gpt_ref.py (model_ref.py), step by step (lm loss,
# grad norm, learning rate), both starting from tptrain's own counter-based init (init_from: null;
# the reference reproduces it with tests/reference/init_ref.py).
#
# Environment (set by ctest) as tests/cli/parity_torch.sh: TPTRAIN (binary), TPTRAIN_SRC (source dir),
# TPTRAIN_WORK (scratch dir, created), PYTHON (/usr/bin/python3, which has torch). Optional:
# PARITY_LOSS_ABS (1e-4), PARITY_GRADNORM_REL (1e-3), PARITY_LR_REL (1e-6), PARITY_TIMEOUT_S (300 per
# program run), PARITY_BF16_LOSS_ABS (2e-2, tests/cli/precision.sh's bf16-vs-fp32 bound),
# PARITY_BF16_GRADNORM_REL (5e-2). Runs by hand too:
#   TPTRAIN=build/tptrain TPTRAIN_SRC=. TPTRAIN_WORK=/tmp/parity_llama bash tests/cli/parity_llama.sh
#
# Cases, on a tiny GPT (2 layers, hidden 64, 8 heads, ffn 96, seq 16, vocab 97 padded to 128, 10
# iterations, clipping on some steps, warmup then cosine): the reference's LLaMA self-checks; (a)
# GPT-2 from tptrain's init; each option alone on GPT-2: (b) RMSNorm, (c) SwiGLU, (d) RoPE,
# (e) interleaved RoPE on half of each head with Llama 3.1 scaling (one frequency interpolated, one
# divided), (f) GQA with 2 groups and kv_channels 16 != 64/8, (g) untied output layer, (h) no linear
# biases, (i) a QKV bias only; (j) the whole Llama shape (RMSNorm + SwiGLU + RoPE + GQA 2 + untied +
# no bias) on 1 rank, (k) with data.reset_position_ids, (l) on TP 2 x PP 2 x DP 2 with the distributed
# optimizer and sequence parallelism, (m) GQA + SwiGLU + interleaved RoPE with biases on TP 2 (the
# grouped QKV and [gate; up] shards with their biases); (n) the Llama shape in bf16 against the fp32
# reference with precision.sh's bf16 bound (the reference computes in fp32 only), and not bitwise
# equal to tptrain's fp32 run; model.qk_layernorm (Qwen3's q/k norms, kv_channels 16): (o) on the
# Llama shape (RMSNorm), (p) on GPT-2 (LayerNorm), (q) the Llama shape on TP 2 x PP 2 with zb-h1 and
# selective recompute (the norms' weight gradients summed over TP without sequence parallelism), and with the
# layernorm and mlp recompute modules, (r) on
# TP 2 with sequence parallelism and the distributed optimizer, (s) on TP 2 x CP 2 x PP 2 with full
# recompute.
set -u -o pipefail

NAME=parity_llama
source "$(dirname "${BASH_SOURCE[0]}")/parity_lib.sh"

# ---------------------------------------------------------------------------------------------
# Inputs: a GPT-2 config the cases change key by key, tokens.
cat > cfg.yaml <<'EOF'
model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 8
  ffn_hidden_size: 96
  seq_length: 16
  max_position_embeddings: 16
  vocab_size: 97                  # odd: padded to 128, padded logits must not matter
  make_vocab_size_divisible_by: 128
  layernorm_epsilon: 1.0e-5
  init_method_std: 0.05            # > 0.02: attention far enough from uniform that a RoPE or GQA mistake shows
  hidden_dropout: 0.0
  attention_dropout: 0.0
  init_from: null                 # tptrain's init from training.seed, reproduced by the reference
parallel:
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 1
training:
  micro_batch_size: 8
  global_batch_size: 8
  train_iters: 10
  precision: fp32
  recompute: none
  seed: 1234
  device: cpu
optimizer:
  lr: 3.0e-3                      # as parity_torch.sh: lr and weight_decay large enough that a
  min_lr: 3.0e-4                  # decay-group or eps mistake moves the loss by > loss-abs
  lr_warmup_iters: 2
  lr_decay_style: cosine
  lr_decay_iters: 10
  weight_decay: 0.3
  adam_beta1: 0.9
  adam_beta2: 0.95
  adam_eps: 1.0e-8
  clip_grad: 2.2                  # grad norms here are 1.4-3.3: clipped on 1-8 of 10 steps (Llama: all)
data:
  # path: set per case
  shuffle: false
  split: [1, 0, 0]
  eval_interval: 1000             # no evaluation: no valid split, interval past train_iters
  eval_iters: 0
checkpoint:
  save: null
  load: null
logging:
  log_interval: 1
EOF

if ! "$PY" "$REF/make_tokens.py" --vocab 97 --tokens 1225 --docs 7 --pattern markov --seed 1 \
    --megatron tokens > setup.log 2>&1; then
  show setup.log
  echo "parity_llama: could not make inputs"
  echo "0 passed, 1 failed"
  exit 1
fi
cat setup.log

# ---------------------------------------------------------------------------------------------
# The reference's own checks of what these cases use (the rest: parity_torch.sh runs them all):
# numpy forward on the global tensors for every option, gradcheck, RoPE's two forms, the Philox init
# against core/rng.h compiled here, the init rules, the CLI from tptrain's init.
parity_selftest reference_selftest_llama --only llama,rope,philox,tptrain_init

# run_case NAME [extra --set overrides...]; NP=N: N ranks under mpirun; TOLS=bf16: the bf16 bounds
run_case() {
  local name=$1
  shift
  local sets=(--set "data.path=$WORK/tokens")
  local extra
  for extra in "$@"; do sets+=(--set "$extra"); done
  parity_case "$name" "${sets[@]}"
}

ROPE=model.position_embedding_type=rope
# base 10000 on 4 rotated channels: wavelengths 6.3 and 628 against 64/16 = 4 and 64/1 = 64, so one
# frequency is interpolated and the other divided by the factor
ROPE_HALF=(model.position_embedding_type=rope model.rotary_interleaved=true model.rotary_percent=0.5
  "model.rope_scaling={factor: 4.0, low_freq_factor: 1.0, high_freq_factor: 16.0, original_max_position_embeddings: 64}")
GQA=(model.group_query_attention=true model.num_query_groups=2)
LLAMA=(model.normalization=RMSNorm model.swiglu=true "$ROPE" "${GQA[@]}"
  model.untie_embeddings_and_output_weights=true model.add_bias_linear=false)

run_case a_gpt2_tptrain_init
run_case b_rmsnorm            model.normalization=RMSNorm
run_case c_swiglu             model.swiglu=true
run_case d_rope               "$ROPE"
run_case e_rope_interleaved_half_scaled "${ROPE_HALF[@]}"
run_case f_gqa2_kv16          "${GQA[@]}" model.kv_channels=16
run_case g_untied             model.untie_embeddings_and_output_weights=true
run_case h_no_bias            model.add_bias_linear=false
run_case i_qkv_bias_only      model.add_bias_linear=false model.add_qkv_bias=true
run_case j_llama              "${LLAMA[@]}"
# positions restarting after each end of document (the stream's most frequent token plays it, so
# most sequences hold several): RoPE's angles follow the per-document positions
EOD=$("$PY" -c "
import numpy as np
t = np.fromfile('tokens.bin', dtype=np.uint16)
v, c = np.unique(t[:8 * 10 * 16 + 1], return_counts=True)
print(int(v[np.argmax(c)]))
")
NEOD=$("$PY" -c "import numpy as np; print(int((np.fromfile('tokens.bin', dtype=np.uint16) == $EOD).sum()))")
echo
echo "end of document for the positions: token $EOD ($NEOD of 1225 tokens)"
if [ "$NEOD" -lt 30 ]; then fail k_llama_reset_positions "only $NEOD end-of-document tokens in the stream"
else run_case k_llama_reset_positions "${LLAMA[@]}" data.reset_position_ids=true data.eod_token_id="$EOD"; fi
NP=8 run_case l_llama_3d_distopt_sp "${LLAMA[@]}" parallel.tensor_model_parallel_size=2 \
  parallel.pipeline_model_parallel_size=2 training.micro_batch_size=2 parallel.distributed_optimizer=true \
  parallel.sequence_parallel=true parallel.overlap_grad_reduce=true parallel.ddp_bucket_size=1 \
  parallel.overlap_param_gather=true
NP=2 run_case m_tp2_gqa_swiglu_rope_biases "${GQA[@]}" model.kv_channels=16 model.swiglu=true "${ROPE_HALF[@]}" \
  parallel.tensor_model_parallel_size=2
# bf16 (tests/cli/precision.sh: within 2e-2 of fp32 at every step, and not bitwise the fp32 run)
TOLS=bf16 run_case n_llama_bf16 "${LLAMA[@]}" training.precision=bf16
if [ -s n_llama_bf16.tptrain.jsonl ] && [ -s j_llama.tptrain.jsonl ]; then
  if "$PY" - j_llama.tptrain.jsonl n_llama_bf16.tptrain.jsonl <<'PYEOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if "lm_loss" in l]
b = [json.loads(l) for l in open(sys.argv[2]) if "lm_loss" in l]
same = sum(x["lm_loss"] == y["lm_loss"] for x, y in zip(a, b))
print(f"    tptrain bf16 vs fp32: {same} of {min(len(a), len(b))} losses bitwise equal, max |d| "
      f"{max(abs(x['lm_loss'] - y['lm_loss']) for x, y in zip(a, b)):.2e}")
sys.exit(0 if same < min(len(a), len(b)) and len(a) == len(b) else 1)
PYEOF
  then pass n_llama_bf16_is_not_fp32
  else fail n_llama_bf16_is_not_fp32 "tptrain's bf16 losses are bitwise its fp32 losses: bf16 did not run"; fi
fi
QK=(model.qk_layernorm=true model.kv_channels=16)
run_case o_llama_qk_norm "${LLAMA[@]}" "${QK[@]}"
run_case p_gpt2_qk_layernorm "${QK[@]}"
NP=4 run_case q_llama_qk_tp2_pp2_zb_selective "${LLAMA[@]}" "${QK[@]}" parallel.tensor_model_parallel_size=2 \
  parallel.pipeline_model_parallel_size=2 training.micro_batch_size=2 parallel.pipeline_schedule=zb-h1 \
  training.recompute=selective
# the layernorm recompute module (ln1 / ln2 rerun in backward, and again in ZB-H1's W): the case
# above with it, bitwise; GPT-2's LayerNorm (mean and rstd) on TP 2 with sequence parallelism
NP=4 run_case q2_llama_qk_tp2_pp2_zb_selective_layernorm "${LLAMA[@]}" "${QK[@]}" parallel.tensor_model_parallel_size=2 \
  parallel.pipeline_model_parallel_size=2 training.micro_batch_size=2 parallel.pipeline_schedule=zb-h1 \
  training.recompute=selective "training.recompute_modules=[core_attn, layernorm]"
same_bits layernorm_recompute_bitwise q_llama_qk_tp2_pp2_zb_selective q2_llama_qk_tp2_pp2_zb_selective_layernorm
NP=2 run_case q3_gpt2_tp2_sp_layernorm_recompute parallel.tensor_model_parallel_size=2 parallel.sequence_parallel=true \
  training.recompute=selective "training.recompute_modules=[core_attn, layernorm]"
# the mlp recompute module (fc1's output and SwiGLU's rerun in backward from the rerun ln2, gathered over
# TP again): the Llama shape on TP 2 with sequence parallelism (tests/cli/recompute_modules.sh: bit for bit)
NP=2 run_case q4_llama_tp2_sp_mlp_recompute "${LLAMA[@]}" parallel.tensor_model_parallel_size=2 \
  parallel.sequence_parallel=true training.recompute=selective "training.recompute_modules=[core_attn, layernorm, mlp]"
NP=2 run_case r_llama_qk_tp2_sp_distopt "${LLAMA[@]}" "${QK[@]}" parallel.tensor_model_parallel_size=2 \
  parallel.sequence_parallel=true parallel.distributed_optimizer=true training.micro_batch_size=4
NP=8 run_case s_llama_qk_tp2_cp2_pp2_full "${LLAMA[@]}" "${QK[@]}" parallel.tensor_model_parallel_size=2 \
  parallel.context_parallel_size=2 parallel.pipeline_model_parallel_size=2 training.micro_batch_size=2 \
  training.recompute=full

parity_finish
