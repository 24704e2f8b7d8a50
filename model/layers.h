// The model's interchangeable parts (docs/ARCHITECTURE.md "Model"), each chosen once from the config
// when the model is built -- as Megatron's layer specs choose submodules -- with its forward and
// backward side by side:
//   Norm          LayerNorm (GPT-2) or RMSNorm (model.normalization), alone or fused with the residual add;
//   MLPActivation fc1 + GELU fused in the GEMM, or fc1 [gate; up] + SwiGLU (model.swiglu);
//   QKVLayout     the QKV GEMM's output as the attention reads it: multi-head (q, k, v of all heads) or
//                 Megatron's grouped layout regrouped per grouped-query attention (model.group_query_attention);
//   Rope          rotary position embedding of q and k (model.position_embedding_type: rope), or none.
// The block (model/block.h) and GPTStage are written once against these.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/ops.h"
#include "model/fp8_linear.h"

namespace tpt {

// A norm's per-token statistics: LayerNorm keeps mean and rstd, RMSNorm rstd only (mean unused).
struct NormStats {
  float* mean = nullptr;
  float* rstd = nullptr;
};

struct Norm {
  bool rms = false;
  float eps = 1e-5f;
  int stats_per_token() const { return rms ? 1 : 2; }  // fp32 values kept per token
  bool has_bias() const { return !rms; }
  // out (N, C) = norm(x) (b: null for RMSNorm)
  void forward(Ops& ops, Buf out, NormStats st, CBuf x, CBuf w, CBuf b, int64_t N, int64_t C) const;
  // res (N, C) = a + y (stored rounded), then out = norm(res as stored); res may alias a
  void residual_forward(Ops& ops, Buf res, Buf out, NormStats st, CBuf a, CBuf y, CBuf w, CBuf b, int64_t N,
                        int64_t C) const;
  // dx (N, C) += ; dw (C) += ; db (C) += (LayerNorm)
  void backward(Ops& ops, Buf dx, Buf dw, Buf db, CBuf dout, CBuf x, CBuf w, NormStats st, int64_t N,
                int64_t C) const;
};

struct MLPActivation {
  bool swiglu = false;
  // fc1's output width for Fl activations: Fl, or 2 Fl ([gate_r; up_r] of this TP rank)
  int64_t fc1_width(int64_t Fl) const { return swiglu ? 2 * Fl : Fl; }
  // fc1 and the activation: pre (N, fc1_width) = x (N, C) @ w^T + b, act (N, Fl) = activation(pre)
  // fp8: the GEMM in FP8 (model/fp8_linear.h), null: Ops's; save: where x's FP8 codes go for fc1's
  // weight gradient (Fp8SavedInput); sp: x is this rank's tokens, gathered as FP8 codes (Fp8TokenGather).
  void forward(Ops& ops, Buf act, Buf pre, CBuf x, CBuf w, CBuf b, int64_t N, int64_t C, int64_t Fl,
               Fp8Linear* fp8 = nullptr, const Fp8SavedInput& save = {}, const Fp8TokenGather* sp = nullptr) const;
  // fc2's backward through its input and the activation: dpre (N, fc1_width) = d pre from dout (N, C);
  // with dw2 (and db2) also fc2's weight (bias) gradient from act, or from act's saved FP8 codes
  // (act then unread). dact (N, Fl): scratch for SwiGLU. dout_sp: dout is this rank's tokens, gathered
  // as FP8 codes; dout_stash: a split backward's B keeps dout's FP8 codes for W (Fp8Linear::backward).
  void backward(Ops& ops, Buf dpre, Buf dact, Buf dw2, Buf db2, CBuf dout, CBuf act, CBuf w2, CBuf pre,
                int64_t N, int64_t Fl, int64_t C, Fp8Linear* fp8 = nullptr, const Fp8SavedInput& saved = {},
                const Fp8TokenGather* dout_sp = nullptr, const Fp8SavedInput& dout_stash = {}) const;
  // GELU: act = gelu(pre) again from the kept pre-activation (as stored), before fc2's weight gradient
  // reads it: a layer keeps only pre, and act lives in one buffer the layers share (llm.c's
  // recompute). SwiGLU keeps its activation: nothing to do.
  void recompute_activation(Ops& ops, Buf act, CBuf pre, int64_t N, int64_t Fl) const;
  // act (N, Fl) = the activation of pre (N, fc1_width), either kind (the experts' moe_act recompute)
  void activation(Ops& ops, Buf act, CBuf pre, int64_t N, int64_t Fl) const;
  // dpre (N, fc1_width) = d pre from dact (N, Fl), either kind (unfused: the experts' weighted activations)
  void activation_backward(Ops& ops, Buf dpre, CBuf dact, CBuf pre, int64_t N, int64_t Fl) const;
};

// Local heads of a rank: H query heads, KV key/value heads (KV = H without grouped-query attention), D
// channels each; the attention reads qkv in the heads layout (N, (H + 2 KV) D) (core/ops.h).
struct QKVLayout {
  bool grouped = false;  // the GEMM writes Megatron's grouped layout (N, KV, H/KV + 2, D): regrouped
  int64_t H = 0, KV = 0, D = 0;
  int64_t width() const { return (H + 2 * KV) * D; }
  // gemm_out -> heads (N, width); a no-op (the same buffer) without grouping
  void to_heads(Ops& ops, Buf heads, CBuf gemm_out, int64_t N) const;
  // d heads -> d gemm_out
  void from_heads(Ops& ops, Buf dgemm_out, CBuf dheads, int64_t N) const;
};

// model.qk_layernorm (Qwen3; Megatron's qk_layernorm): the model's norm over each head's D channels of
// the q and of the k heads of qkv (N, (H + 2 KV) D) in the heads layout, in place, after the regroup
// and before RoPE; q_layernorm's weight (D) for every query head, k_layernorm's for every key head.
// Through the existing row norms on contiguous copies: keep (N (H + KV) D) holds the q heads of all
// tokens as (N H, D) rows, then the k heads as (N KV, D) rows, as they were before the norm; st their
// statistics (N (H + KV) rows: the q rows', then the k rows').
struct QKNorm {
  bool on = false;
  Norm norm;
  explicit operator bool() const { return on; }
  int64_t rows(const QKVLayout& l, int64_t N) const { return N * (l.H + l.KV); }
  // scratch (N H D)
  void forward(Ops& ops, Buf qkv, Buf keep, NormStats st, CBuf wq, CBuf bq, CBuf wk, CBuf bk, Buf scratch,
               const QKVLayout& l, int64_t N) const;
  // dqkv: the q and k heads' gradients after the norm on entry, before it on exit (values untouched);
  // dw, db +=; dout, din: scratch (N H D) each
  void backward(Ops& ops, Buf dqkv, Buf dwq, Buf dbq, Buf dwk, Buf dbk, CBuf keep, CBuf wq, CBuf wk,
                NormStats st, Buf dout, Buf din, const QKVLayout& l, int64_t N) const;
};

struct Rope {
  int64_t rot = 0;               // rotated channels per head; 0: no rotary embedding
  bool interleaved = false;
  const float* inv_freq = nullptr;  // (rot / 2) fp32 on the device
  explicit operator bool() const { return rot > 0; }
  // in place on the q and k heads of qkv (N, (H + 2 KV) D); positions (N) on the device or null (n % S)
  void forward(Ops& ops, Buf qkv, const int32_t* positions, int64_t N, int64_t S, const QKVLayout& l) const;
  void backward(Ops& ops, Buf dqkv, const int32_t* positions, int64_t N, int64_t S, const QKVLayout& l) const;
};

// Whether the options are GPT-2's (LayerNorm, GELU, learned positions, multi-head attention, tied
// embeddings, biases): what the Hugging Face GPT-2 import (model.init_from) and export read and write.
bool is_gpt2_architecture(const ModelConfig& m);

// The architecture in words for the start-up log: "GPT-2 (LayerNorm, GELU, learned positions, multi-head
// attention, tied embeddings, biases)" or its LLaMA-family options.
std::string describe_architecture(const ModelConfig& m);

// RoPE's inverse frequencies (rotary_dim(m) / 2 of them): rotary_base^(-2j/rot) in double, rescaled
// by Llama 3.1's rope_scaling rule when given (HF's "llama3" rope type), rounded to fp32.
std::vector<float> rope_inv_freq(const ModelConfig& m);

}  // namespace tpt
