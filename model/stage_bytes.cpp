// The bytes a pipeline stage allocates (model/gpt.h: activation_bytes_per_microbatch, pooled_slot_bytes,
// scratch_bytes, shared_scratch_bytes, weight_grad_stash_bytes), tensor by tensor in the order
// GPTStage's constructor allocates them: the planner (plan/memory.cpp) and the allocation agree.
#include "model/stage_bytes.h"

#include <vector>

#include "core/error.h"
#include "model/moe.h"
#include "parallel/context_parallel.h"
#include "parallel/tensor_parallel.h"

namespace tpt {

using namespace stage_bytes;

namespace {
// one layer's activations (LayerActs), with or without the attention core, tensor by tensor in the
// constructor's order (layer_acts): the residual stream and the norms on this rank's Nt tokens, the
// TP-sharded GEMM outputs on all N (QKV, fc1 and SwiGLU's activation; GELU's is recomputed from fc1's
// output in backward, in the shared dact_). An MoE layer's MLP keeps its rows in MoEMLP
// (moe_layer_bytes) instead of fc1's output. q: the inputs an FP8 layer saves as FP8 codes and their
// scales (GPTDims::fp8_saved_inputs) in place of the 16-bit tensors.
std::vector<int64_t> layer_tensor_bytes(const GPTDims& d, int64_t B, DType t, bool with_core, bool moe = false,
                                        bool norms = true, GPTDims::Fp8Saved q = {}, bool mlp = true) {
  const int64_t N = B * d.S, Nt = d.local_tokens(N), qk = qk_norm_rows(d, N);
  std::vector<int64_t> v;
  auto stats = [&](int64_t rows) {  // NormStats: LayerNorm's mean and rstd, RMSNorm's rstd
    for (int i = 0; i < d.norm.stats_per_token(); ++i) v.push_back(fb(rows));
  };
  auto saved = [&](int64_t rows, int64_t I) {  // Fp8SavedInput: rows x I codes, their scales
    v.push_back(fp8_saved_code_bytes(rows, I));
    v.push_back(fb(fp8_saved_scale_floats(d.fp8_blockwise, rows, I)));
  };
  if (q.ln1) saved(Nt, d.C);  // with sequence parallelism this rank's tokens' (gathered in backward)
  else if (norms) v.push_back(tb(Nt * d.C, t));  // ln1 (not with the layernorm recompute module)
  stats(Nt);
  v.push_back(tb(N * d.qkv_width, t));
  if (d.qk_norm) {  // the q/k norms' inputs and statistics
    v.push_back(tb(qk * d.D, t));
    stats(qk);
  }
  if (with_core) v.push_back(tb(N * d.Cl, t)), v.push_back(fb(B * d.Hl * d.S));  // attention output, lse
  v.push_back(tb(Nt * d.C, t));  // x_mid
  if (q.ln2) saved(Nt, d.C);
  else if (norms) v.push_back(tb(Nt * d.C, t));  // ln2
  stats(Nt);
  if (!moe && mlp) {  // (not with the mlp recompute module: the stage's shared mlp_rerun tensors)
    v.push_back(tb(N * d.fc1_width, t));
    if (q.act) saved(N, d.Fl);
    else if (d.mlp.swiglu) v.push_back(tb(N * d.Fl, t));
  }
  v.push_back(tb(Nt * d.C, t));  // x_out
  return v;
}

// The stage's shared scratch (StageOptions::shared_scratch), tensor by tensor in the constructor's
// order: dln, tmp (N, C); dqkv; datt and its row statistics; dfc; dact; qkv_tmp (grouped-query
// attention); qk_din (q/k norms); the attention core selective recompute rebuilds (and with the
// layernorm module the norm output, with the mlp module fc1's output and the activation), or the layer
// full recompute rebuilds; the 16-bit TP sums' gather buffer.
std::vector<int64_t> shared_scratch_tensors(const GPTDims& d, int64_t B, Recompute r, DType t) {
  const int64_t N = B * d.S;
  std::vector<int64_t> v = {tb(N * d.C, t),         tb(N * d.C, t), tb(N * d.qkv_width, t), tb(N * d.Cl, t),
                            fb(B * d.Hl * d.S),     tb(N * d.fc1_width, t), tb(N * d.Fl, t)};
  if (d.grouped_qkv) v.push_back(tb(N * d.qkv_width, t));
  if (d.qk_norm) v.push_back(tb(N * d.Cl, t));
  if (r == Recompute::Selective) v.push_back(tb(N * d.Cl, t)), v.push_back(fb(B * d.Hl * d.S));
  if (shares_norm_scratch(d, r)) v.push_back(tb(d.local_tokens(N) * d.C, t));  // ln1 / ln2 of the layer at hand
  if (const GPTDims::MlpRerun m = d.mlp_rerun(r); m.any) {  // the mlp module's reruns: fc1, the activation
    v.push_back(tb(N * d.fc1_width, t));
    if (m.act16) v.push_back(tb(N * d.Fl, t));
    if (m.act8) v.push_back(fp8_saved_code_bytes(N, d.Fl)), v.push_back(fb(fp8_saved_scale_floats(d.fp8_blockwise, N, d.Fl)));
  }
  if (r == Recompute::Full)
    for (int64_t b : layer_tensor_bytes(d, B, t, true)) v.push_back(b);
  v.push_back(tp_gather_bytes(N * d.C, t, d.tp));
  return v;
}

// One slot's tensors (SlotActs) in the constructor's order: tokens, targets, positions, loss weights,
// the stage input, each layer's (full recompute: its output only), the final norm's output and statistics
std::vector<int64_t> slot_tensor_bytes(const GPTDims& d, int64_t B, Recompute r, DType t) {
  const int64_t N = B * d.S, Nt = d.local_tokens(N);
  std::vector<int64_t> v = {fb(N), fb(N)};
  if (d.position_ids) v.push_back(fb(positions_count(d, N)));
  if (d.loss_mask) v.push_back(fb(N));
  v.push_back(tb(Nt * d.C, t));
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l) {
    if (r == Recompute::Full) v.push_back(tb(Nt * d.C, t));
    else
      for (int64_t b : layer_tensor_bytes(d, B, t, r == Recompute::None, d.moe.is_moe(l), d.keeps_norms(r),
                                          d.fp8_saved_inputs(l, r), d.keeps_mlp(r, l)))
        v.push_back(b);
  }
  if (d.last_stage()) {
    v.push_back(tb(Nt * d.C, t));
    for (int i = 0; i < d.norm.stats_per_token(); ++i) v.push_back(fb(Nt));
  }
  return v;
}
}  // namespace

int64_t activation_bytes_per_microbatch(const GPTDims& d, int64_t B, Recompute r, DType t) {
  int64_t n = 0;
  for (int64_t b : slot_tensor_bytes(d, B, r, t)) n += b;
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l)  // MoEMLP's per slot (none with full recompute)
    if (d.moe.is_moe(l)) n += moe_layer_bytes(d, d.local_tokens(B * d.S), t, r);
  return n;
}

bool pooled_slots(const std::vector<GPTDims>& chunks, bool split_backward) {
  return chunks.size() >= 2 && !split_backward;
}

int64_t pooled_slot_bytes(const GPTDims& d, int64_t B, Recompute r, DType t) {
  int64_t n = 0;
  for (int64_t b : slot_tensor_bytes(d, B, r, t)) n += carve_bytes(b);
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l)  // MoEMLP's kept rows, after the dense tensors
    if (d.moe.is_moe(l))
      for (int64_t b : moe_layer_tensor_bytes(d, d.local_tokens(B * d.S), t, r)) n += carve_bytes(b);
  return n;
}

int64_t moe_pool_slot_bytes(const GPTDims& d, int64_t B, Recompute r, DType t) {
  return moe_layer_count(d) * moe_pool_layer_bytes(d, d.local_tokens(B * d.S), t, r);
}

int64_t scratch_bytes(const GPTDims& d, int64_t B, Recompute r, DType t) {
  const int64_t N = B * d.S, Nt = d.local_tokens(N);
  int64_t n = tb(Nt * d.C, t);                 // dres: the input gradient, sent after the backward
  if (d.rot) n += fb(rope_inv_freq_floats(d));  // RoPE's inverse frequencies
  if (d.last_stage()) n += tb(N * d.Vl, t) + fb(4 * N);  // logits, cross-entropy rows (loss to backward)
  if (d.cp > 1) n += RingAttention::buffer_bytes(B, d.S, d.Hl, d.kv_heads, d.D, t);  // the CP ring's blocks
  if (moe_layer_count(d) > 0) n += moe_scratch_bytes(d, Nt, t, r);
  return n;
}

int64_t shared_scratch_bytes(const GPTDims& d, int64_t B, Recompute r, DType t) {
  int64_t n = 0;
  for (int64_t b : shared_scratch_tensors(d, B, r, t)) n += carve_bytes(b);
  return n;
}

int64_t weight_grad_stash_bytes(const GPTDims& d, int64_t B, DType t) {
  const int64_t N = B * d.S;
  int64_t n = 0, codes = 0;  // LayerStash: dY (N, out) of each stashed linear layer, or its FP8 codes
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l)
    for (const LinearSpec* lin : d.spec(l).linears())
      if (!stashed(*lin)) continue;
      else if (d.fp8_stashes_codes(l))
        codes += fp8_saved_code_bytes(N, lin->out) + fb(fp8_saved_scale_floats(d.fp8_blockwise, N, lin->out));
      else n += N * lin->out;
  return tb(n, t) + codes;
}

}  // namespace tpt
