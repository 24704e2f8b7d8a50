// What a pipeline stage (model/gpt.h GPTStage) allocates, counted: the helpers the constructor and
// the counts (model/stage_bytes.cpp: activation_bytes_per_microbatch, scratch_bytes, ...) share.
// Internal to model/.
#pragma once
#include <cstdint>

#include "model/gpt.h"

namespace tpt::stage_bytes {

// Bytes of n elements of the compute dtype t, and of n fp32 values.
inline int64_t tb(int64_t n, DType t) { return dtype_size(n, t); }
inline int64_t fb(int64_t n) { return 4 * n; }

// model.qk_layernorm: the rows of the q/k norms of N tokens (each local q and k head of each token)
inline int64_t qk_norm_rows(const GPTDims& d, int64_t N) { return d.qk_norm ? N * (d.Hl + d.kv_heads) : 0; }

// each shared tensor starts at a multiple of this (the GPU allocator's alignment)
inline constexpr int64_t kScratchAlign = 256;
inline int64_t carve_bytes(int64_t bytes) { return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// whether the stage's shared scratch holds a norm output (Nt, C) for the layers that keep none: with
// the layernorm recompute module, or where FP8 layers save the norms' codes instead (GPTDims::fp8_saved_inputs)
inline bool shares_norm_scratch(const GPTDims& d, Recompute r) { return !d.keeps_norms(r) || d.fp8_saved_by_any(r).ln1; }

// RoPE's rot / 2 inverse frequencies as allocated: padded to 256 bytes (both backends' allocations are
// multiples of it; 32 bytes at head dim 16 took 64 on the CPU, which the plan did not count)
inline int64_t rope_inv_freq_floats(const GPTDims& d) { return (d.rot / 2 + 63) / 64 * 64; }

// the stage's MoE layers
inline int64_t moe_layer_count(const GPTDims& d) {
  int64_t n = 0;
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l) n += d.moe.is_moe(l) ? 1 : 0;
  return n;
}

// whether a split backward's B stashes a linear layer's dY for W: the attention's and the dense MLP's
// (an MoE layer's MLP -- router, experts, shared expert -- finishes its weight gradients in B)
inline bool stashed(const LinearSpec& l) { return l.name.starts_with("attn.") || l.name.starts_with("mlp.fc"); }

// the slot's positions (data.reset_position_ids): this rank's Nt tokens' for learned positions on the
// first stage, all N tokens' for RoPE (after the QKV GEMM every rank sees all tokens)
inline int64_t positions_count(const GPTDims& d, int64_t N) {
  if (!d.position_ids) return 0;
  return d.learned_positions() ? d.local_tokens(N) : N;
}

}  // namespace tpt::stage_bytes
