// What an MoE layer and MoEMLP allocate, counted (model/moe.h: moe_layer_bytes, moe_scratch_bytes,
// moe_pool_layer_bytes, ...): the planner and MoEMLP's constructor and take_rows share these.
#include <cmath>

#include "model/gpt.h"
#include "model/moe.h"
#include "model/stage_bytes.h"

namespace tpt {

using stage_bytes::carve_bytes;
using stage_bytes::tb;

int64_t moe_rows_bound(const MoEDims& m, int64_t Nt) {
  const int64_t balanced = Nt * m.router.k;
  if (m.ep == 1) return balanced;
  return int64_t(std::ceil(double(balanced) * m.dispatch_factor));
}

bool moe_shares_rows(const MoEDims& m, Recompute r) {
  return r == Recompute::Full || (r == Recompute::Selective && m.recompute_moe);
}

bool moe_keeps_act(const MoEDims& m, Recompute r) {
  return moe_shares_rows(m, r) || !(r == Recompute::Selective && m.recompute_act);
}

bool moe_keeps_shared(const MoEDims& m, Recompute r) {
  return moe_shares_rows(m, r) || !(r == Recompute::Selective && m.recompute_shared);
}

bool moe_pools_rows(const MoEDims& m, Recompute r) { return m.ep > 1 && !moe_shares_rows(m, r); }

std::vector<int64_t> moe_rows_tensor_bytes(const GPTDims& d, DType t, bool act, int64_t n) {
  const MoEDims& m = d.moe;
  std::vector<int64_t> v = {tb(n * d.C, t), tb(n * m.fc1_width, t)};
  if (act) v.push_back(tb(n * m.Fel, t));
  return v;
}

namespace {
// one set of kept rows in MoEMLP's order: the experts' rows at the bound (not with pooled rows); the
// shared expert's (fc1's output and the activation not with the shared_experts module; the returned rows
// are not kept: the probabilities are applied in the experts)
std::vector<int64_t> kept_tensor_bytes(const GPTDims& d, int64_t Nt, DType t, bool act, bool rows = true,
                                       bool shared = true) {
  const MoEDims& m = d.moe;
  const int64_t cap = moe_rows_bound(m, Nt), N = d.gemm_tokens(Nt);
  std::vector<int64_t> v;
  if (rows) v = moe_rows_tensor_bytes(d, t, act, m.etp * cap);
  if (m.Fs) {  // the shared expert's fc1, act, y; gate
    if (shared) v.push_back(tb(N * m.shared_fc1_width, t)), v.push_back(tb(N * m.Fsl, t));
    v.push_back(tb(Nt * d.C, t));
    if (m.shared_gate) v.push_back(4 * Nt);
  }
  return v;
}
}  // namespace

std::vector<int64_t> moe_layer_tensor_bytes(const GPTDims& d, int64_t Nt, DType t, Recompute r) {
  if (moe_shares_rows(d.moe, r)) return {};  // the layers' one set is scratch
  return kept_tensor_bytes(d, Nt, t, moe_keeps_act(d.moe, r), !moe_pools_rows(d.moe, r), moe_keeps_shared(d.moe, r));
}

int64_t moe_pool_layer_bytes(const GPTDims& d, int64_t Nt, DType t, Recompute r) {
  const MoEDims& m = d.moe;
  if (!moe_pools_rows(m, r)) return 0;
  const int64_t rows = int64_t(std::ceil(double(Nt * m.router.k) * m.kept_factor));
  int64_t n = 0;
  for (int64_t b : moe_rows_tensor_bytes(d, t, moe_keeps_act(m, r), m.etp * rows)) n += carve_bytes(b);
  return n;
}

int64_t moe_layer_bytes(const GPTDims& d, int64_t Nt, DType t, Recompute r) {
  int64_t n = moe_pool_layer_bytes(d, Nt, t, r);
  for (int64_t b : moe_layer_tensor_bytes(d, Nt, t, r)) n += b;
  return n;
}

int64_t moe_scratch_bytes(const GPTDims& d, int64_t Nt, DType t, Recompute r) {
  const MoEDims& m = d.moe;
  const int64_t cap = moe_rows_bound(m, Nt), k = m.router.k, C = d.C, E = m.E;
  int64_t n = 0;
  if (moe_shares_rows(m, r)) {  // full recompute or the moe module: the layers' one set of kept rows, first
    for (int64_t b : kept_tensor_bytes(d, Nt, t, true)) n += b;
    if (r == Recompute::Selective) n += tb(Nt * d.C, t);  // the moe module's rerun output
  }
  n += 4 * (Nt * E + 2 * Nt * k);  // logits (fp32); perm, comb (int32)
  if (t != DType::F32) n += 4 * (2 * Nt * C + E * C) + tb(Nt * C, t);  // x32, dx32, w32; tmp
  const int64_t xcap = m.etp * cap;  // the rows of the experts' GEMMs (the expert-TP group's)
  const bool ag = m.gathers_tokens();
  n += tb((ag ? 0 : Nt * k * C) + cap * C + xcap * (m.Fel + m.fc1_width), t);  // send (alltoall), bufA, dact, dfc
  // the rows' probabilities, d probabilities (2), index lists (2); weighted activations; weighted d outputs
  n += 4 * 5 * xcap + tb(xcap * m.Fel, t) + (m.bias ? tb(xcap * C, t) : 0);
  if (m.ep > 1 || m.etp > 1) n += tb(xcap * C, t);                             // bufB
  if (!moe_keeps_act(m, r)) n += tb(xcap * m.Fel, t);                           // act (moe_act)
  if (m.ep > 1 && !ag) n += 4 * 2 * cap;                                        // regroup, inverse
  if (m.etp > 1) n += tb(xcap * C, t) + 4 * 2 * xcap;              // the padded gather, its maps
  if (m.gathers_tokens()) {  // the EP group's tokens, their 16-bit staging, its assignments' maps
    const int64_t Tg = m.ep * Nt;
    n += tb(Tg * C, t) * (t == DType::F32 ? 1 : 2) + 4 * 2 * Tg * k;
  }
  n += tb(Nt * C, t);                                        // dx
  if (m.Fs) {  // the shared expert's d fc1, d act, partial sums (N); d y x gate (Nt); gate logits, identity
    const int64_t N = d.gemm_tokens(Nt);
    n += tb(N * (m.shared_fc1_width + m.Fsl + C), t);
    if (m.shared_gate) n += tb(Nt * C + Nt, t) + 4 * 2 * Nt;
    if (!moe_keeps_shared(m, r)) n += tb(N * (m.shared_fc1_width + m.Fsl), t);  // the shared_experts module's rerun
  }
  return n;
}

}  // namespace tpt
