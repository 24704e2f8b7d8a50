// One transformer block's forward (docs/ARCHITECTURE.md "Model"), written once for training
// (GPTStage: its tensor-parallel mappings around the GEMMs, the attention core of a micro-batch)
// and generation (GPTInference: one rank, attention over a KV cache).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "core/ops.h"
#include "model/gpt.h"

namespace tpt {

// Parameter (or gradient) pointers of one transformer block.
template <class P>
struct BlockParams {
  P ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
};

template <class P>
BlockParams<P> block_params(const ParamLayout& layout, P base, int64_t layer) {
  const std::string pre = "h." + std::to_string(layer) + ".";
  auto at = [&](const char* n) {
    const ParamInfo* p = layout.find(pre + n);
    TPT_CHECK(p != nullptr);
    return base + p->offset;
  };
  return {at("ln_1.weight"), at("ln_1.bias"),   at("attn.qkv.weight"), at("attn.qkv.bias"),
          at("attn.proj.weight"), at("attn.proj.bias"), at("ln_2.weight"), at("ln_2.bias"),
          at("mlp.fc1.weight"), at("mlp.fc1.bias"), at("mlp.fc2.weight"), at("mlp.fc2.bias")};
}

// What a block's forward writes (and its backward reads). Nt: the rank's tokens of the residual
// stream (all N, or with sequence parallelism its block); N: the tokens of the TP-sharded GEMMs.
struct BlockActs {
  Buf ln1;                                     // (Nt, C)
  float *ln1_mean = nullptr, *ln1_rstd = nullptr;  // (Nt), (Nt)
  Buf qkv;                                     // (N, 3 Cl): (B, S, 3, Hl, D)
  Buf atty;                                    // (N, Cl) attention output (before the projection)
  float* lse = nullptr;                        // (B, Hl, S) log-sum-exp of each query's scores (training)
  Buf x_mid;                                   // (Nt, C) residual after attention
  Buf ln2;                                     // (Nt, C)
  float *ln2_mean = nullptr, *ln2_rstd = nullptr;  // (Nt), (Nt)
  Buf fc1;                                     // (N, Fl) before GELU
  Buf gelu;                                    // (N, Fl)
};

struct BlockShape {
  int64_t N = 0, Nt = 0, C = 0, Cl = 0, Fl = 0;
  float eps = 1e-5f;
};

// The tensor-parallel mappings around the GEMMs (parallel/tensor_parallel.h through GPTStage); one
// rank passes none: the GEMM input is the LayerNorm output and the row-parallel GEMMs add their bias.
struct BlockMappings {
  std::function<CBuf(CBuf ln)> gather_tokens;                     // (Nt, C) -> (N, C)
  std::function<CBuf(Buf partial, CBuf bias)> row_parallel_output;  // (N, C) partial sums -> (Nt, C)
  bool bias_in_gemm = true;                                       // row-parallel biases added in the GEMM
};

// x_out = block(x_in), both (Nt, C); tmp: (N, C) scratch. attention_core(a) writes a.atty from
// a.qkv (scores, softmax, weighted values).
void block_forward(Ops& ops, const BlockParams<CBuf>& w, BlockActs& a, CBuf x_in, Buf x_out, Buf tmp,
                   const BlockShape& s, const std::function<void(BlockActs&)>& attention_core,
                   const BlockMappings* tp = nullptr);

}  // namespace tpt
