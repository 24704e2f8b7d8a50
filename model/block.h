// One transformer block's forward (docs/ARCHITECTURE.md "Model"), written once for training
// (GPTStage: its tensor-parallel mappings around the GEMMs, the attention core of a micro-batch)
// and generation (GPTInference: one rank, attention over a KV cache).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/ops.h"
#include "model/gpt.h"

namespace tpt {

// Parameter (or gradient) pointers of one transformer block, per part of the layer spec
// (model/layer_spec.h; the dense block's parts are DensePart): weight[part] (a norm's weight, a linear
// layer's weight) and bias[part], null where the part has none (the norms' biases with RMSNorm, the
// linear biases without model.add_bias_linear).
template <class P>
struct BlockParams {
  std::vector<P> weight, bias;
  int q_norm = -1, k_norm = -1;  // the q/k norms' parts (LayerSpec), -1 without model.qk_layernorm
};

template <class P>
BlockParams<P> block_params(const ParamLayout& layout, const LayerSpec& spec, P base, int64_t layer) {
  const std::string pre = "h." + std::to_string(layer) + ".";
  auto at = [&](const std::string& n, bool required) {
    const ParamInfo* p = layout.find(pre + n);
    TPT_CHECK(p != nullptr || !required);
    return p ? base + p->offset : P{};
  };
  BlockParams<P> r;
  r.q_norm = spec.q_norm, r.k_norm = spec.k_norm;
  for (const LayerPart& part : spec.parts) {
    r.weight.push_back(at(part.name() + ".weight", true));
    r.bias.push_back(at(part.name() + ".bias", false));
  }
  return r;
}

// What a block's forward writes (and its backward reads). Nt: the rank's tokens of the residual
// stream (all N, or with sequence parallelism its block); N: the tokens of the TP-sharded GEMMs.
struct BlockActs {
  Buf ln1;                                     // (Nt, C)
  NormStats ln1_stats;                         // (Nt) each: LayerNorm's mean and rstd, RMSNorm's rstd
  Buf qkv;                                     // (N, qkv_width) in the attention's heads layout (model/layers.h
                                               // QKVLayout), q and k normalised (qk_layernorm) and rotated with RoPE
  Buf qk_in;                                   // model.qk_layernorm: (N (Hl + KV) D) q and k before their norm
  NormStats qk_stats;                          // (N (Hl + KV)) each (model/layers.h QKNorm)
  Buf atty;                                    // (N, Cl) attention output (before the projection)
  float* lse = nullptr;                        // (B, Hl, S) log-sum-exp of each query's scores (training)
  Buf x_mid;                                   // (Nt, C) residual after attention
  Buf ln2;                                     // (Nt, C)
  NormStats ln2_stats;                         // (Nt)
  Buf fc1;                                     // (N, fc1_width) fc1's output (before GELU / SwiGLU)
  Buf gelu;                                    // (N, Fl) the activation (fc2's input); GELU: the stage's
                                               // shared buffer, recomputed from fc1 in backward
  // FP8 layers (GPTDims::fp8_saved_inputs): ln1's, ln2's and the activation's FP8 codes for the
  // weight gradients of QKV, fc1 and fc2; where one is saved, its 16-bit tensor above is the stage's
  // shared scratch, unread in backward
  Fp8SavedInput ln1_q, ln2_q, act_q;
};

// The block's sizes and parts (model/layers.h). positions: the N tokens' positions on the device for
// RoPE, or null (n % S).
struct BlockShape {
  int64_t N = 0, Nt = 0, C = 0, Cl = 0, Fl = 0, S = 0;
  Norm norm;
  MLPActivation mlp;
  QKVLayout qkv;
  Rope rope;
  const int32_t* positions = nullptr;
  QKNorm qk_norm;
};

// The tensor-parallel mappings around the GEMMs (parallel/tensor_parallel.h through GPTStage); one
// rank passes none: the GEMM input is the LayerNorm output and the row-parallel GEMMs add their bias.
struct BlockMappings {
  std::function<CBuf(CBuf ln)> gather_tokens;                     // (Nt, C) -> (N, C)
  std::function<CBuf(Buf partial, CBuf bias)> row_parallel_output;  // (N, C) partial sums -> (Nt, C)
  bool bias_in_gemm = true;                                       // row-parallel biases added in the GEMM
  // an MoE layer's MLP (model/moe.h): y (Nt, C) from ln_2's output (Nt, C), in place of fc1 / fc2
  std::function<CBuf(CBuf ln2)> mlp;
  // FP8 training (model/fp8_linear.h): the layer's linear GEMMs in FP8; null: in the compute dtype
  Fp8Linear* fp8[kDenseParts] = {};  // by DensePart (kQkv, kProj, kFc1, kFc2)
  // sequence parallelism with current or delayed scaling: the FP8 GEMMs' inputs ln1 and ln2 gathered
  // as codes (Fp8TokenGather) instead of by gather_tokens; null: gathered in the compute dtype
  const Fp8TokenGather* fp8_gather = nullptr;
};

// x_out = block(x_in), both (Nt, C); tmp: (N, C) scratch; qkv_tmp: (N, qkv_width) scratch for the QKV GEMM's
// grouped output (grouped-query attention only; else unused). attention_core(a) writes a.atty from
// a.qkv (scores, softmax, weighted values); before it, a.atty is the q/k norms' scratch.
void block_forward(Ops& ops, const BlockParams<CBuf>& w, BlockActs& a, CBuf x_in, Buf x_out, Buf tmp, Buf qkv_tmp,
                   const BlockShape& s, const std::function<void(BlockActs&)>& attention_core,
                   const BlockMappings* tp = nullptr);

}  // namespace tpt
