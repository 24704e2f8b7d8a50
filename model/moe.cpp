// The MoE MLP's forward and backward (model/moe.h). Shapes: T = Nt the rank's tokens, k the experts per
// token, E the experts, El this rank's, R the rows its experts receive. A token's k choices are its
// assignments (t, j); the send order lists them by expert (token order within an expert), which is
// also the experts' row order with EP 1. With EP > 1 the rows go to each expert's owner in one
// all-to-all (per-expert counts exchanged first), arrive source-major (from rank 0's rows for my first
// expert ... ) and are regrouped expert-major, so every expert's rows are contiguous for its GEMMs. With
// ETP > 1 (= TP: each expert's fc1 column-parallel, fc2 row-parallel over the TP group) every
// expert-TP rank's expert-major rows are all-gathered over that group (padded to the largest rank's)
// and regrouped expert-major again, so each shard of an expert sees all of its rows; the shards'
// partial outputs are reduce-scattered back to the rows' rank before the way back (Megatron's alltoall
// dispatcher with expert TP). The backward mirrors it: output gradients all-gathered, input
// gradients reduce-scattered.
// The allgather dispatcher (model.moe_token_dispatcher_type: allgather, EP > 1; Megatron's
// MoEAllGatherTokenDispatcher) instead all-gathers every EP rank's tokens and routing; each rank takes
// the group's assignments to its own experts (expert-major, the group's token order within: the same
// rows, in the same order, as the all-to-all brings), weighs its experts' outputs into partial outputs
// of all the group's tokens, and reduce-scatters them over EP back to the tokens' ranks.
// Each row's routing probability is applied in its expert, as Megatron-core applies it (the weighted
// activation, with the fc2 bias weighted too): fc2 reads p x act, so the rows come back weighted and
// are summed unweighted; the probability's gradient d(p act) . act (+ dy . fc2 bias) is formed where
// the activations are, and only those numbers (one per row) travel back. No layer keeps its returned
// rows (docs/MOE.md). The probabilities go to the experts' ranks with the rows (a host all-to-all of
// one float per row).
#include "model/moe.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "model/fp8_linear.h"
#include "model/gpt.h"
#include "model/stage_bytes.h"
#include "parallel/comm.h"
#include "parallel/tensor_parallel.h"

namespace tpt {

using stage_bytes::carve_bytes;

namespace {
// the all-to-all's element counts of row counts of width C
std::vector<int64_t> elems(int64_t C, std::vector<int64_t> rows) {
  for (int64_t& n : rows) n *= C;
  return rows;
}
// allocations of the CPU (64 B) and GPU (256 B) allocators are counted rounded; the plan's sums
// equal the allocations when each tensor's bytes are multiples of 256 (docs/PLAN.md)
}  // namespace

namespace {
// local expert e's fc1 (second: fc2) in FP8, or null
Fp8Linear* expert_fp8(const std::function<Fp8Linear*(int64_t)>& fp8, const MoEDims& m, int64_t e, bool fc2) {
  return fp8 ? fp8(kFp8GemmsPerLayer + (fc2 ? m.E : 0) + m.expert_begin + e) : nullptr;
}
Fp8Linear* shared_fp8(const MoETPMappings& tp, bool fc2) { return tp.fp8 ? tp.fp8(fc2 ? 3 : 2) : nullptr; }
}  // namespace

void moe_experts_forward(Ops& ops, const GPTDims& d, const MoEParams<CBuf>& w, const std::vector<int64_t>& rows,
                         CBuf xin, Buf fc1, Buf act, Buf out, const std::function<Fp8Linear*(int64_t)>& fp8,
                         const MoERowWeights* pw) {
  const MoEDims& m = d.moe;
  const int64_t C = d.C;
  int64_t off = 0;
  for (int64_t e = 0; e < int64_t(rows.size()); ++e) {
    const int64_t n = rows[size_t(e)];
    if (n == 0) continue;
    d.mlp.forward(ops, act + off * m.Fel, fc1 + off * m.fc1_width, xin + off * C, w.fc1 + e * m.fc1_width * C,
                  w.fc1_bias ? w.fc1_bias + e * m.fc1_width : CBuf{}, n, C, m.Fel, expert_fp8(fp8, m, e, false));
    const CBuf bias = w.fc2_bias ? w.fc2_bias + e * C : CBuf{};
    CBuf in = act + off * m.Fel;
    if (pw) {  // fc2 of p x act (rounded once), then + p x bias
      ops.gather_rows(pw->wact + off * m.Fel, in, pw->ident, pw->p + off, n, m.Fel);
      in = pw->wact + off * m.Fel;
    }
    linear_forward(ops, expert_fp8(fp8, m, e, true), out + off * C, in, w.fc2 + e * C * m.Fel, pw ? CBuf{} : bias,
                   n, m.Fel, C);
    if (pw && bias) ops.combine_rows(out + off * C, bias, pw->zeros, pw->p + off, n, 1, C, true);
    off += n;
  }
}

struct MoEMLP::LayerState {
  Buf xin, fc1, act;  // (cap, C), (cap, fc1_width), (cap, Fe): expert-major rows
  int64_t cap = 0;
  std::vector<float> row_p;  // the experts' rows' probabilities (expert-major, over the expert-TP group)
  Buf sh_fc1, sh_act, sh_y;  // the shared expert: (N, shared_fc1_width), (N, Fsl), its output (T, C)
  float* gate = nullptr;     // (T) sigmoid of the gate's logits
  std::vector<float> gate_host;
  Routing routing;
  // the dispatch of the last forward: send order, per-expert counts, the regroup permutations
  MoESendOrder order;
  std::vector<int64_t> send_rows, recv_rows;  // per EP peer
  std::vector<int64_t> expert_rows;           // (El) rows of each local expert's GEMMs (over the expert-TP group)
  std::vector<int32_t> regroup, inverse;      // expert-major <- source-major, and back (EP > 1)
  int64_t R = 0;                              // the rows this rank's experts received (its own)
  // ETP > 1: each group rank's block in the padded gather (Rmax rows each), the experts' rows from
  // it (tp_regroup, expert-major over the group) and back (tp_scatter, -1 on the padding)
  int64_t Rmax = 0, Rx = 0;
  std::vector<int32_t> tp_regroup, tp_scatter;
  MoESendOrder group_order;  // allgather: the EP group's assignments to this rank's experts
  std::vector<double> global_f;  // global_aux_loss: the mean counts the forward used (full recompute reuses them)
  char* block = nullptr;         // moe_pools_rows: the pool's block holding xin, fc1, act
};

Buf MoEMLP::alloc(int64_t n, DType t) {
  Buf b = ops_.alloc(std::max<int64_t>(n, 1), t);
  owned_.push_back(b.p);
  return b;
}

MoEMLP::MoEMLP(const GPTDims& d, Ops& ops, DType t, int64_t Nt, int64_t B, int64_t token_begin, int slots, Comm* ep,
               Comm* ep_host, Comm* etp, Comm* tp_host, Comm* cp_host, Comm* dp_host, Recompute recompute,
               const std::vector<char*>& slot_regions, MoERowPool* pool)
    : d_(d), ops_(ops), t_(t), Nt_(Nt), B_(B), token_begin_(token_begin), ep_(ep), ep_host_(ep_host), etp_(etp),
      tp_host_(tp_host), cp_host_(cp_host), dp_host_(dp_host) {
  const MoEDims& m = d.moe;
  TPT_CHECK(m.any() && (m.ep == 1 || (ep && ep_host && ep->size() == m.ep && ep_host->size() == m.ep)));
  TPT_CHECK(m.etp == 1 || (etp && tp_host && etp->size() == m.etp && tp_host->size() == m.etp &&
                           etp->rank() == m.etp_rank && tp_host->rank() == m.etp_rank));
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l)
    if (m.is_moe(l)) moe_layers_.push_back(l);
  rows_cap_ = moe_rows_bound(m, Nt);
  keep_act_ = moe_keeps_act(m, recompute);
  pooled_ = moe_pools_rows(m, recompute);  // the states' rows from the chunks' pool, or one of its own (after the states)
  TPT_CHECK(!pooled_ || pool || slot_regions.empty());
  if (pooled_) pool_ = pool;
  const int64_t C = d.C, k = m.router.k;
  // a state's kept rows (moe_layer_tensor_bytes' order): allocated, or carved from a pooled slot's region
  auto kept = [&](LayerState& s, char** from) {  // from: advanced past what is carved
    auto take = [&](int64_t n, DType dt) {
      if (!from) return alloc(n, dt);
      Buf b(*from, dt);
      *from += carve_bytes(dtype_size(n, dt));
      return b;
    };
    grow_state(s, from);
    if (m.Fs) {
      const int64_t N = d.gemm_tokens(Nt);
      s.sh_fc1 = sh_fc1_.p ? sh_fc1_ : take(N * m.shared_fc1_width, t);
      s.sh_act = sh_act_.p ? sh_act_ : take(N * m.Fsl, t);
      s.sh_y = take(Nt * C, t);
      if (m.shared_gate) s.gate = take(Nt, DType::F32).f32();
    }
  };
  if (m.Fs && !moe_keeps_shared(m, recompute)) {  // the shared_experts module's one pair (moe_scratch_bytes)
    sh_fc1_ = alloc(d.gemm_tokens(Nt) * m.shared_fc1_width, t);
    sh_act_ = alloc(d.gemm_tokens(Nt) * m.Fsl, t);
  }
  // allocation order: per slot and layer its kept rows (with full recompute one set, shared), then the scratch
  TPT_CHECK(slot_regions.empty() || (int(slot_regions.size()) == slots && !moe_shares_rows(m, recompute)));
  if (moe_shares_rows(m, recompute)) {
    shared_rows_ = std::make_unique<LayerState>();
    kept(*shared_rows_, nullptr);
    if (recompute == Recompute::Selective) y_ = alloc(Nt * C, t);
  }
  state_.resize(size_t(slots));
  for (size_t j = 0; j < state_.size(); ++j) {
    char* from = slot_regions.empty() ? nullptr : slot_regions[j];
    for (size_t i = 0; i < moe_layers_.size(); ++i) {
      auto* s = new LayerState;
      if (shared_rows_) *s = *shared_rows_;  // its buffers (the host state is each one's own)
      else kept(*s, from ? &from : nullptr);
      state_[j].push_back(s);
    }
  }
  if (pooled_ && !pool) {
    own_pool_ = std::make_unique<MoERowPool>(
        ops_, int64_t(slots) * int64_t(moe_layers_.size()) * moe_pool_layer_bytes(d, Nt, t, recompute));
    pool_ = own_pool_.get();
  }
  logits_ = alloc(Nt * m.E, DType::F32).f32();
  perm_ = static_cast<int32_t*>(alloc(Nt * k, DType::I32).p);
  comb_ = static_cast<int32_t*>(alloc(Nt * k, DType::I32).p);
  if (t != DType::F32) {
    x32_ = alloc(Nt * C, DType::F32).f32();
    dx32_ = alloc(Nt * C, DType::F32).f32();
    w32_ = alloc(m.E * C, DType::F32).f32();
    tmp_ = alloc(Nt * C, t);
  }
  if (!m.gathers_tokens()) send_ = alloc(Nt * k * C, t);
  alloc_rows_scratch();
  if (m.gathers_tokens()) {
    const int64_t Tg = m.ep * Nt;
    tokens_ = alloc(Tg * C, t);
    if (t != DType::F32) wire_ = alloc(Tg * C, t);
    perm_g_ = static_cast<int32_t*>(alloc(Tg * k, DType::I32).p);
    comb_g_ = static_cast<int32_t*>(alloc(Tg * k, DType::I32).p);
  }
  dx_ = alloc(Nt * C, t);
  if (m.Fs) {
    const int64_t N = d.gemm_tokens(Nt);
    sh_dfc_ = alloc(N * m.shared_fc1_width, t);
    sh_dact_ = alloc(N * m.Fsl, t);
    sh_part_ = alloc(N * C, t);
    if (m.shared_gate) {
      sh_dy_ = alloc(Nt * C, t);
      gate_logit_ = alloc(Nt, t);
      gate_f32_ = alloc(Nt, DType::F32).f32();
      identity_ = static_cast<int32_t*>(alloc(Nt, DType::I32).p);
      std::vector<int32_t> id(static_cast<size_t>(Nt));
      for (int64_t i = 0; i < Nt; ++i) id[size_t(i)] = int32_t(i);
      ops_.to_device(Buf(identity_, DType::I32), id.data(), Nt);
    }
  }
  stats_.layers = moe_layers_;
  stats_.counts.assign(moe_layers_.size() * size_t(m.E), 0.0);
  global_counts_.assign(moe_layers_.size(), std::vector<double>(size_t(m.E), 0.0));
  global_steps_.assign(moe_layers_.size(), 0);
  if (m.router.expert_bias) {
    bias_.assign(moe_layers_.size(), std::vector<float>(size_t(m.E), 0.0f));
    bias_counts_.assign(moe_layers_.size(), std::vector<double>(size_t(m.E), 0.0));
  }
}

void MoEMLP::update_expert_bias(const GroupSum& sum) {
  for (size_t i = 0; i < bias_.size(); ++i) {
    std::vector<double>& counts = bias_counts_[i];
    sum(counts);
    tpt::update_expert_bias(bias_[i], counts, d_.moe.router.bias_update_rate);
    std::fill(counts.begin(), counts.end(), 0.0);
  }
}

void MoEMLP::discard_step() {
  for (auto& slot : state_)
    for (LayerState* s : slot) give_rows(*s);
  take_stats();
  for (auto& c : bias_counts_) std::fill(c.begin(), c.end(), 0.0);
}

// the scratch whose size is the rows bound: bufA, dact, dfc (the expert-TP group's rows), the rows'
// probabilities, their d probabilities (two parts), the index lists, the weighted activations (and with
// biases the weighted d outputs), with EP > 1 or ETP > 1 bufB, with the all-to-all over EP > 1 its
// regroup maps, with ETP > 1 the padded gather and its maps
void MoEMLP::alloc_rows_scratch() {
  const MoEDims& m = d_.moe;
  const int64_t xcap = m.etp * rows_cap_;
  bufA_ = alloc(rows_cap_ * d_.C, t_);
  dact_ = alloc(xcap * m.Fel, t_);
  if (!keep_act_) act_ = alloc(xcap * m.Fel, t_);
  dfc_ = alloc(xcap * m.fc1_width, t_);
  row_p_ = alloc(xcap, DType::F32).f32();
  row_dot_ = alloc(xcap, DType::F32).f32();
  row_dot_bias_ = alloc(xcap, DType::F32).f32();
  row_ident_ = static_cast<int32_t*>(alloc(xcap, DType::I32).p);
  row_zero_ = static_cast<int32_t*>(alloc(xcap, DType::I32).p);
  std::vector<int32_t> id(static_cast<size_t>(xcap));
  for (int64_t i = 0; i < xcap; ++i) id[size_t(i)] = int32_t(i);
  ops_.to_device(Buf(row_ident_, DType::I32), id.data(), xcap);
  std::fill(id.begin(), id.end(), 0);
  ops_.to_device(Buf(row_zero_, DType::I32), id.data(), xcap);
  wact_ = alloc(xcap * m.Fel, t_);
  if (m.bias) wdy_ = alloc(xcap * d_.C, t_);
  if (m.ep > 1 || m.etp > 1) bufB_ = alloc(xcap * d_.C, t_);
  if (m.ep > 1 && !m.gathers_tokens()) {
    regroup_ = static_cast<int32_t*>(alloc(rows_cap_, DType::I32).p);
    inverse_ = static_cast<int32_t*>(alloc(rows_cap_, DType::I32).p);
  }
  if (m.etp > 1) {
    xg_ = alloc(xcap * d_.C, t_);
    tp_regroup_ = static_cast<int32_t*>(alloc(xcap, DType::I32).p);
    tp_scatter_ = static_cast<int32_t*>(alloc(xcap, DType::I32).p);
  }
}

// a layer state's kept rows (xin, fc1, act) for the rows bound, over the expert-TP group
void MoEMLP::grow_state(LayerState& s, char** from) {
  const MoEDims& m = d_.moe;
  if ((s.cap == rows_cap_ && s.xin) || pooled_) return;  // pooled: take_rows
  if (shared_rows_ && &s != shared_rows_.get()) {  // full recompute: the one set, grown once
    grow_state(*shared_rows_);
    const LayerState& k = *shared_rows_;
    s.cap = k.cap, s.xin = k.xin, s.fc1 = k.fc1, s.act = k.act;
    return;
  }
  const int64_t xcap = m.etp * rows_cap_;
  auto take = [&](int64_t n) {
    if (!from) return alloc(n, t_);
    Buf b(*from, t_);
    *from += carve_bytes(dtype_size(n, t_));
    return b;
  };
  s.cap = rows_cap_;
  s.xin = take(xcap * d_.C);
  s.fc1 = take(xcap * m.fc1_width);
  if (keep_act_) s.act = take(xcap * m.Fel);
}

void MoEMLP::take_rows(LayerState& s, int64_t layer) {
  if (!pooled_) return;
  give_rows(s);  // a forward without backward (evaluation) left them
  const int64_t n = d_.moe.etp > 1 ? s.Rx : s.R;
  const std::vector<int64_t> sizes = moe_rows_tensor_bytes(d_, t_, keep_act_, n);
  int64_t bytes = 0;
  for (int64_t b : sizes) bytes += carve_bytes(b);
  s.block = pool_->take(std::max<int64_t>(bytes, stage_bytes::kScratchAlign), layer, n);
  // rows_tensor_bytes' order
  std::vector<Buf*> bufs = {&s.xin, &s.fc1};
  if (keep_act_) bufs.push_back(&s.act);
  char* at = s.block;
  for (size_t i = 0; i < bufs.size(); ++i) {
    *bufs[i] = Buf(at, t_);
    at += carve_bytes(sizes[i]);
  }
}

void MoEMLP::give_rows(LayerState& s) {
  if (!s.block) return;
  pool_->give(s.block);
  s.block = nullptr;
}

// the EP group's partial sums of every group token (EP x Nt, C) -> this rank's tokens' sums (Nt, C), in
// fp32 in rank order (16-bit: staged in wire_)
void MoEMLP::ep_reduce_scatter(Buf out, CBuf group_tokens) {
  const TPWire wire{&ops_, wire_};
  sp_reduce_scatter(*ep_, out, group_tokens, Nt_ * d_.C, &wire);
}

// ETP > 1: every group rank's per-expert rows (host all-gather), the largest rank's total Rmax (the
// padded block; the buffers grow to it), and the maps between the padded blocks and the experts' rows,
// expert-major over the group (expert e: rank 0's rows, rank 1's, ...)
void MoEMLP::tp_plan(LayerState& s, const std::vector<int64_t>& own_rows, int64_t layer) {
  const int P = d_.moe.etp;
  const int64_t El = d_.moe.El;
  std::vector<int64_t> rows(size_t(P * El));  // (P, El)
  tp_host_->all_gather(rows.data(), own_rows.data(), El, DType::I64);
  s.Rmax = 0;
  for (int r = 0; r < P; ++r) {
    int64_t n = 0;
    for (int64_t e = 0; e < El; ++e) n += rows[size_t(r * El + e)];
    s.Rmax = std::max(s.Rmax, n);
  }
  grow(s.Rmax, layer);
  grow_state(s);
  std::vector<int64_t> at(static_cast<size_t>(P));  // the next row of rank r's block
  for (int r = 0; r < P; ++r) at[size_t(r)] = r * s.Rmax;
  s.expert_rows.assign(size_t(El), 0);
  s.tp_regroup.clear();
  s.tp_scatter.assign(size_t(P * s.Rmax), -1);
  for (int64_t e = 0; e < El; ++e)
    for (int r = 0; r < P; ++r)
      for (int64_t n = 0; n < rows[size_t(r * El + e)]; ++n) {
        s.tp_scatter[size_t(at[size_t(r)])] = int32_t(s.tp_regroup.size());
        s.tp_regroup.push_back(int32_t(at[size_t(r)]++));
        s.expert_rows[size_t(e)] += 1;
      }
  s.Rx = int64_t(s.tp_regroup.size());
}

void MoEMLP::set_row_probs(LayerState& s, const std::vector<float>& own) {
  TPT_CHECK(int64_t(own.size()) == s.R);
  if (d_.moe.etp > 1) {  // every group rank's padded block, then the experts' rows over the group
    std::vector<float> block(own), all(static_cast<size_t>(d_.moe.etp * s.Rmax));
    block.resize(size_t(s.Rmax), 0.0f);
    tp_host_->all_gather(all.data(), block.data(), s.Rmax);
    s.row_p.resize(size_t(s.Rx));
    for (int64_t j = 0; j < s.Rx; ++j) s.row_p[size_t(j)] = all[size_t(s.tp_regroup[size_t(j)])];
  } else {
    s.row_p = own;
  }
  ops_.to_device(row_p_, s.row_p.data(), int64_t(s.row_p.size()));
}

std::vector<float> MoEMLP::fetch_row_dots(int64_t rows, bool bias) {
  std::vector<float> dp(static_cast<size_t>(rows)), db(bias ? size_t(rows) : 0);
  ops_.to_host(dp.data(), row_dot_, rows);
  if (bias) {
    ops_.to_host(db.data(), row_dot_bias_, rows);
    for (int64_t j = 0; j < rows; ++j) dp[size_t(j)] += db[size_t(j)];
  }
  return dp;
}

std::vector<float> MoEMLP::own_row_dprob(const LayerState& s, std::vector<float> dp) {
  if (d_.moe.etp == 1) return dp;
  tp_host_->all_reduce(dp.data(), int64_t(dp.size()), ReduceOp::Sum);  // the activations' shards' partial dots
  std::vector<float> own(static_cast<size_t>(s.R));
  const int64_t at = d_.moe.etp_rank * s.Rmax;
  for (int64_t j = 0; j < s.R; ++j) own[size_t(j)] = dp[size_t(s.tp_scatter[size_t(at + j)])];
  return own;
}

void MoEMLP::tp_upload(const LayerState& s) {
  ops_.to_device(Buf(tp_regroup_, DType::I32), s.tp_regroup.data(), s.Rx);
  ops_.to_device(Buf(tp_scatter_, DType::I32), s.tp_scatter.data(), d_.moe.etp * s.Rmax);
}

Buf MoEMLP::tp_own_block(const LayerState& s) const { return xg_ + d_.moe.etp_rank * s.Rmax * d_.C; }

void MoEMLP::tp_gather(const LayerState& s, Buf out) {
  if (s.Rmax == 0) return;
  const int64_t C = d_.C;
  etp_->all_gather(xg_.p, tp_own_block(s).p, s.Rmax * C, t_);
  ops_.gather_rows(out, xg_, tp_regroup_, nullptr, s.Rx, C);
}

Buf MoEMLP::tp_reduce(const LayerState& s, CBuf in) {
  const Buf own = tp_own_block(s);
  if (s.Rmax == 0) return own;
  const int64_t C = d_.C;
  ops_.gather_rows(xg_, in, tp_scatter_, nullptr, d_.moe.etp * s.Rmax, C);  // zeros on the padding
  // `in` (bufB_) is spent now: it stages the 16-bit partials, summed in fp32 in rank order
  TPT_CHECK(in.p == bufB_.p);
  const TPWire wire{&ops_, bufB_};
  sp_reduce_scatter(*etp_, own, xg_, s.Rmax * C, &wire);
  return own;
}

MoEMLP::~MoEMLP() {
  for (void* p : owned_) ops_.free(p);
  for (auto& slot : state_)
    for (LayerState* s : slot) delete s;
}

int MoEMLP::moe_index(int64_t layer) const {
  const auto it = std::find(moe_layers_.begin(), moe_layers_.end(), layer);
  TPT_CHECK(it != moe_layers_.end());
  return int(it - moe_layers_.begin());
}

// Dropless routing sent more rows to this rank's experts than the bound: grow the scratch (and the
// state being written) to them, once per new maximum, with a warning. Never a drop, never a crash.
void MoEMLP::grow(int64_t rows, int64_t layer) {
  if (rows <= rows_cap_) return;
  spdlog::warn("WARNING: MoE layer {}: this rank's experts received {} rows, more than the planned {} ({}x the balanced "
               "load of {}); growing its dispatch buffers (one allocation now, not in the plan)",
               layer, rows, rows_cap_, d_.moe.dispatch_factor, Nt_ * d_.moe.router.k);
  rows_cap_ = rows;
  alloc_rows_scratch();  // the old scratch stays owned (freed with the stage): nothing in it is live
}

Buf MoEMLP::act(const LayerState& s) const { return keep_act_ ? s.act : act_; }

const float* MoEMLP::router_input(CBuf x) {
  if (x.t == DType::F32) return x.f32();
  ops_.convert(x32_, x, Nt_ * d_.C);
  return x32_;
}

const float* MoEMLP::router_weight(CBuf w) {
  if (w.t == DType::F32) return w.f32();
  ops_.convert(w32_, w, d_.moe.E * d_.C);
  return w32_;
}

void MoEMLP::forward(int slot, int64_t layer, const MoEParams<CBuf>& w, CBuf x, Buf y, const MoETPMappings& tp,
                     bool record) {
  const MoEDims& m = d_.moe;
  const int mi = moe_index(layer);
  LayerState& s = *state_.at(size_t(slot)).at(size_t(mi));
  const int64_t T = Nt_, C = d_.C, E = m.E, k = m.router.k, El = m.El;
  // the router's logits in fp32, routed on the host
  ops_.linear_forward(logits_, router_input(x), router_weight(w.router), nullptr, T, C, E);
  std::vector<float> z(static_cast<size_t>(T * E));
  ops_.to_host(z.data(), logits_, T * E);
  const int64_t group = (tp_host_ ? tp_host_->size() : 1) * (cp_host_ ? cp_host_->size() : 1);
  const bool global = m.router.balancing == MoEBalancing::GlobalAuxLoss;
  auto sum = [&](std::vector<double>& v) {
    for (Comm* c : {tp_host_, cp_host_, global ? dp_host_ : nullptr})
      if (c && c->size() > 1) c->all_reduce(v.data(), int64_t(v.size()), ReduceOp::Sum);
  };
  auto average = [&](std::vector<double>& f) {  // global_aux_loss: the step's mean counts so far
    if (record) {
      std::vector<double>& acc = global_counts_[size_t(mi)];
      const double n = double(++global_steps_[size_t(mi)]);
      s.global_f.resize(f.size());
      for (size_t e = 0; e < f.size(); ++e) s.global_f[e] = (acc[e] += f[e]) / n;
    }
    f = s.global_f;
  };
  const auto t0 = std::chrono::steady_clock::now();  // the host's routing, timed (host_routing_ms)
  s.routing = route(z.data(), T, m.router, [&](int64_t t) { return (token_begin_ + t) / d_.S; }, B_, group, sum,
                    m.router.expert_bias ? bias_[size_t(mi)].data() : nullptr, average);
  const Routing& r = s.routing;
  if (record && m.router.expert_bias) add_bias_counts(r, m.router, bias_counts_[size_t(mi)]);
  if (record) {
    stats_.aux += m.router.aux_coeff != 0 ? r.aux / m.router.aux_coeff : 0;
    stats_.z += r.z_mean;
    stats_.terms += 1;
    for (int64_t e = 0; e < E; ++e) stats_.counts[size_t(mi * E + e)] += r.counts[size_t(e)];
  }
  // the send order: assignments by expert, token order within
  s.order = moe_send_order(r, E);
  host_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const MoESendOrder& o = s.order;
  const std::vector<int64_t>& per_expert = o.per_expert;
  ops_.to_device(Buf(perm_, DType::I32), o.perm.data(), o.n_send);
  ops_.to_device(Buf(comb_, DType::I32), o.comb.data(), T * k);

  // dispatch: the rows to their experts' owners, expert-major in s.xin (with ETP > 1 this rank's in
  // the padded gather's own block first, then gathered over the expert-TP group)
  const bool etp = m.etp > 1, ag = m.gathers_tokens();
  const int64_t Tg = m.ep * T;  // allgather: the EP group's tokens
  if (m.ep == 1) {
    s.R = o.n_send;
    s.expert_rows = per_expert;
    if (etp) tp_plan(s, per_expert, layer), tp_upload(s);
    set_row_probs(s, o.row_w);
    ops_.gather_rows(etp ? tp_own_block(s) : s.xin, x, perm_, nullptr, o.n_send, C);  // R <= T k = the state's rows
  } else if (ag) {  // every EP rank's tokens and routing; the group's rows for this rank's experts
    ep_->all_gather(tokens_.p, x.p, T * C, t_);
    std::vector<int32_t> experts(static_cast<size_t>(Tg * k));
    Routing group;
    group.T = Tg, group.k = k;
    group.prob.resize(size_t(Tg * k));
    ep_host_->all_gather(experts.data(), r.expert.data(), T * k, DType::I32);
    ep_host_->all_gather(group.prob.data(), r.prob.data(), T * k, DType::F32);
    for (int32_t& e : experts) e = e >= m.expert_begin && e < m.expert_begin + El ? int32_t(e - m.expert_begin) : -1;
    group.expert = std::move(experts);
    s.group_order = moe_send_order(group, El);
    const MoESendOrder& g = s.group_order;
    s.R = g.n_send;
    s.expert_rows = g.per_expert;
    grow(s.R, layer);
    grow_state(s);
    if (etp) tp_plan(s, std::vector<int64_t>(s.expert_rows), layer), tp_upload(s);
    take_rows(s, layer);
    set_row_probs(s, g.row_w);
    ops_.to_device(Buf(perm_g_, DType::I32), g.perm.data(), g.n_send);
    ops_.to_device(Buf(comb_g_, DType::I32), g.comb.data(), Tg * k);
    ops_.gather_rows(etp ? tp_own_block(s) : s.xin, tokens_, perm_g_, nullptr, s.R, C);
  } else {
    const int P = m.ep;
    std::vector<int64_t> recv_counts(static_cast<size_t>(E));  // (P, El): from peer q, rows for my local expert e
    ep_host_->all_to_all_v(per_expert.data(), std::vector<int64_t>(size_t(P), El), recv_counts.data(),
                           std::vector<int64_t>(size_t(P), El), DType::I64);
    s.send_rows.assign(size_t(P), 0);
    s.recv_rows.assign(size_t(P), 0);
    s.expert_rows.assign(size_t(El), 0);
    for (int q = 0; q < P; ++q)
      for (int64_t e = 0; e < El; ++e) {
        s.send_rows[size_t(q)] += per_expert[size_t(q * El + e)];
        s.recv_rows[size_t(q)] += recv_counts[size_t(q * El + e)];
        s.expert_rows[size_t(e)] += recv_counts[size_t(q * El + e)];
      }
    s.R = 0;
    for (int64_t n : s.recv_rows) s.R += n;
    grow(s.R, layer);
    grow_state(s);  // this state's kept rows grow with the scratch
    if (etp) tp_plan(s, std::vector<int64_t>(s.expert_rows), layer), tp_upload(s);
    take_rows(s, layer);
    ops_.gather_rows(send_, x, perm_, nullptr, o.n_send, C);
    ep_->all_to_all_v(send_.p, elems(C, s.send_rows), bufA_.p, elems(C, s.recv_rows), t_);
    // source-major (q, e) blocks -> expert-major (e, q)
    std::vector<int64_t> src(size_t(E) + 1, 0);  // start of block (q, e) in the received rows
    for (int64_t b = 0; b < E; ++b) src[size_t(b + 1)] = src[size_t(b)] + recv_counts[size_t(b)];
    s.regroup.assign(size_t(s.R), 0);
    s.inverse.assign(size_t(s.R), 0);
    int64_t i = 0;
    for (int64_t e = 0; e < El; ++e)
      for (int q = 0; q < P; ++q)
        for (int64_t n = 0; n < recv_counts[size_t(q * El + e)]; ++n, ++i) {
          const int64_t from = src[size_t(q * El + e)] + n;
          s.regroup[size_t(i)] = int32_t(from);
          s.inverse[size_t(from)] = int32_t(i);
        }
    ops_.to_device(Buf(regroup_, DType::I32), s.regroup.data(), s.R);
    ops_.to_device(Buf(inverse_, DType::I32), s.inverse.data(), s.R);
    ops_.gather_rows(etp ? tp_own_block(s) : s.xin, bufA_, regroup_, nullptr, s.R, C);
    // the rows' probabilities with them (source-major), expert-major
    std::vector<float> p(static_cast<size_t>(s.R)), own(static_cast<size_t>(s.R));
    ep_host_->all_to_all_v(o.row_w.data(), s.send_rows, p.data(), s.recv_rows, DType::F32);
    for (int64_t j = 0; j < s.R; ++j) own[size_t(j)] = p[size_t(s.regroup[size_t(j)])];
    set_row_probs(s, own);
  }
  if (etp) tp_gather(s, s.xin);
  // the experts: fc1 with its activation, fc2 of the weighted activation, on each local expert's
  // contiguous rows (with ETP > 1 partial sums over the group; fc2's bias added by etp rank 0 alone)
  MoEParams<CBuf> ws = w;
  if (m.etp_rank != 0) ws.fc2_bias = CBuf{};
  const Buf out = m.ep == 1 && !etp ? send_ : bufB_;
  const MoERowWeights pw = row_weights();
  moe_experts_forward(ops_, d_, ws, s.expert_rows, s.xin, s.fc1, act(s), out, tp.fp8, &pw);
  const Buf own = etp ? tp_reduce(s, out) : out;  // this rank's weighted rows, expert-major
  if (ag) {
    // the group's tokens' sums of this rank's experts' rows, summed over EP to their ranks
    ops_.combine_rows(tokens_, own, comb_g_, nullptr, Tg, k, C, false);
    ep_reduce_scatter(y, tokens_);
  } else {
    CBuf ret = own;  // the rows in send order (with EP 1 the experts' order)
    if (m.ep > 1) {  // back to the tokens' ranks, in their send order
      ops_.gather_rows(bufA_, own, inverse_, nullptr, s.R, C);
      ep_->all_to_all_v(bufA_.p, elems(C, s.recv_rows), send_.p, elems(C, s.send_rows), t_);
      ret = send_;
    }
    // y (T, C) = sum over each token's kept choices of its weighted expert outputs
    ops_.combine_rows(y, ret, comb_, nullptr, T, k, C, false);
  }
  if (m.Fs) shared_forward(s, w, x, y, tp);  // + the shared expert
}

// The shared expert: a dense MLP of width Fs on every token, TP-split as the dense MLP (its mappings
// are GPTStage's), times sigmoid(x . gate) per token with the gate (computed in the compute dtype, as
// Megatron's), added to y.
void MoEMLP::shared_forward(LayerState& s, const MoEParams<CBuf>& w, CBuf x, Buf y, const MoETPMappings& tp) {
  const MoEDims& m = d_.moe;
  const int64_t T = Nt_, C = d_.C, N = tp.N;
  const Fp8TokenGather* sp = shared_fp8(tp, false) ? tp.fp8_gather : nullptr;  // fc1's input gathered as codes
  d_.mlp.forward(ops_, s.sh_act, s.sh_fc1, sp ? x : tp.gather_tokens(x), w.shared_fc1, w.shared_fc1_bias, N, C, m.Fsl,
                 shared_fp8(tp, false), {}, sp);
  linear_forward(ops_, shared_fp8(tp, true), sh_part_, s.sh_act, w.shared_fc2,
                 tp.bias_in_gemm ? w.shared_fc2_bias : CBuf{}, N, m.Fsl, C);
  ops_.copy(s.sh_y, tp.row_parallel_output(sh_part_, w.shared_fc2_bias), T * C);
  if (!m.shared_gate) return ops_.accumulate(y, s.sh_y, T * C);
  ops_.linear_forward(gate_logit_, x, w.gate, nullptr, T, C, 1);
  ops_.convert(gate_f32_, gate_logit_, T);
  s.gate_host.resize(static_cast<size_t>(T));
  ops_.to_host(s.gate_host.data(), gate_f32_, T);
  for (float& g : s.gate_host) g = 1.0f / (1.0f + std::exp(-g));
  ops_.to_device(s.gate, s.gate_host.data(), T);
  ops_.combine_rows(y, s.sh_y, identity_, s.gate, T, 1, C, true);
}

void MoEMLP::shared_backward(LayerState& s, const MoEParams<CBuf>& w, const MoEParams<Buf>& g, CBuf x, CBuf dy,
                             const MoETPMappings& tp) {
  const MoEDims& m = d_.moe;
  const int64_t T = Nt_, C = d_.C, N = tp.N;
  CBuf dys = dy;
  if (m.shared_gate) {  // d gate logit = (dy . shared output) g (1 - g); d shared output = g dy
    ops_.row_dots(gate_f32_, dy, s.sh_y, identity_, T, 1, C);
    std::vector<float> dg(static_cast<size_t>(T));
    ops_.to_host(dg.data(), gate_f32_, T);
    for (int64_t t = 0; t < T; ++t) dg[size_t(t)] *= s.gate_host[size_t(t)] * (1 - s.gate_host[size_t(t)]);
    ops_.to_device(gate_f32_, dg.data(), T);
    ops_.convert(gate_logit_, gate_f32_, T);
    ops_.linear_backward(dx_, g.gate, nullptr, gate_logit_, x, w.gate, T, C, 1, true);
    ops_.gather_rows(sh_dy_, dy, identity_, s.gate, T, C);
    dys = sh_dy_;
  }
  if (sh_fc1_.p) {  // the shared_experts module: fc1's output and the activation again, as shared_forward made them
    const Fp8TokenGather* sp = shared_fp8(tp, false) ? tp.fp8_gather : nullptr;
    d_.mlp.forward(ops_, s.sh_act, s.sh_fc1, sp ? x : tp.gather_tokens(x), w.shared_fc1, w.shared_fc1_bias, N, C, m.Fsl,
                   shared_fp8(tp, false), {}, sp);
  }
  const auto [dout, dbias] = tp.row_parallel_output_grad(dys, g.shared_fc2_bias);  // (Nt, C) with dout_codes
  d_.mlp.backward(ops_, sh_dfc_, sh_dact_, g.shared_fc2, dbias, dout, s.sh_act, w.shared_fc2, s.sh_fc1, N, m.Fsl, C,
                  shared_fp8(tp, true), {}, tp.dout_codes ? tp.fp8_gather : nullptr);
  linear_backward(ops_, shared_fp8(tp, false), sh_part_, g.shared_fc1, g.shared_fc1_bias, sh_dfc_,
                  tp.gather_tokens(x), w.shared_fc1, N, C, m.shared_fc1_width, false);
  ops_.accumulate(dx_, tp.input_grad_to_tokens(sh_part_), T * C);
}

CBuf MoEMLP::backward(int slot, int64_t layer, const MoEParams<CBuf>& w, const MoEParams<Buf>& g, CBuf x, CBuf dy,
                      const MoETPMappings& tp) {
  const Buf dx = dx_;
  const MoEDims& m = d_.moe;
  LayerState& s = *state_.at(size_t(slot)).at(size_t(moe_index(layer)));
  const int64_t T = Nt_, C = d_.C, E = m.E, k = m.router.k, El = m.El;
  const bool etp = m.etp > 1, ag = m.gathers_tokens();
  const int64_t Tg = m.ep * T;  // allgather: the EP group's tokens
  if (etp) tp_upload(s);
  // the forward's maps again (the scratch served other layers since)
  const MoESendOrder& o = ag ? s.group_order : s.order;
  ops_.to_device(Buf(ag ? perm_g_ : perm_, DType::I32), o.perm.data(), o.n_send);
  ops_.to_device(Buf(ag ? comb_g_ : comb_, DType::I32), o.comb.data(), ag ? Tg * k : T * k);
  ops_.to_device(row_p_, s.row_p.data(), int64_t(s.row_p.size()));
  // the d outputs of this rank's rows, expert-major (with ETP > 1 in the padded gather's own block),
  // then the group's: dy of each row's token (the probability is applied in the experts)
  Buf dout = etp ? tp_own_block(s) : m.ep > 1 ? bufB_ : send_;
  if (ag) {
    ep_->all_gather(tokens_.p, dy.p, T * C, t_);
    ops_.gather_rows(dout, tokens_, perm_g_, nullptr, s.R, C);
  } else {
    ops_.gather_rows(send_, dy, perm_, nullptr, o.n_send, C);
  }
  if (m.ep > 1 && !ag) {
    ops_.to_device(Buf(regroup_, DType::I32), s.regroup.data(), s.R);
    ops_.to_device(Buf(inverse_, DType::I32), s.inverse.data(), s.R);
    ep_->all_to_all_v(send_.p, elems(C, s.send_rows), bufA_.p, elems(C, s.recv_rows), t_);
    ops_.gather_rows(dout, bufA_, regroup_, nullptr, s.R, C);
  } else if (etp && !ag) {
    ops_.copy(dout, send_, o.n_send * C);
  }
  if (etp) {
    tp_gather(s, bufB_);
    dout = bufB_;
  }
  // the experts' backward: fc2 of the weighted activations (d weighted activations into dact), each
  // row's d probability (dact . act, + dy . fc2 bias), d act = p dact through the activation (dfc),
  // fc1 (d input rows: into bufA, or with ETP > 1 over each expert's d output rows in bufB, partial
  // sums over the group); fc2's bias (and its gradient, of p dy) on etp rank 0 alone (summed over TP
  // with the other TP-replicated tensors')
  const Buf dxin = etp ? bufB_ : bufA_;
  const bool bias = m.bias && m.etp_rank == 0;
  const Buf a = act(s);
  int64_t rows = 0;
  for (int64_t n : s.expert_rows) rows += n;
  if (!keep_act_ && rows)  // moe_act: the activations again from the kept fc1 outputs
    d_.mlp.activation(ops_, a, s.fc1, rows, m.Fel);
  if (rows) ops_.gather_rows(wact_, a, row_ident_, row_p_, rows, m.Fel);  // fc2's input again: p x act
  // fc2's backward and the rows' d probabilities first; their dots come to the host (waiting for these
  // GEMMs alone) before fc1's backward is queued, so the host's part of the probabilities' gradient and
  // the routing's backward run while the device computes fc1's backward and the way back
  for (int64_t e = 0, off = 0; e < El; off += s.expert_rows[size_t(e)], ++e) {
    const int64_t n = s.expert_rows[size_t(e)];
    if (n == 0) continue;
    const Buf dact = dact_ + off * m.Fel, wact = wact_ + off * m.Fel, dyr = dout + off * C;
    linear_backward(ops_, expert_fp8(tp.fp8, m, e, true), dact, g.fc2 + e * C * m.Fel, Buf{}, dyr, wact,
                    w.fc2 + e * C * m.Fel, n, m.Fel, C, false);
    ops_.row_dots(row_dot_ + off, dact, a + off * m.Fel, row_ident_, n, 1, m.Fel);
    if (bias) {
      ops_.row_dots(row_dot_bias_ + off, dyr, w.fc2_bias + e * C, row_zero_, n, 1, C);
      ops_.gather_rows(wdy_, dyr, row_ident_, row_p_ + off, n, C);
      ops_.bias_backward(g.fc2_bias + e * C, wdy_, n, C);
    }
    ops_.gather_rows(wact, dact, row_ident_, row_p_ + off, n, m.Fel);  // d act (fc2 has read wact)
    d_.mlp.activation_backward(ops_, dfc_ + off * m.fc1_width, wact, s.fc1 + off * m.fc1_width, n, m.Fel);
  }
  std::vector<float> dots = fetch_row_dots(rows, bias);
  for (int64_t e = 0, off = 0; e < El; off += s.expert_rows[size_t(e)], ++e) {
    const int64_t n = s.expert_rows[size_t(e)];
    if (n == 0) continue;
    linear_backward(ops_, expert_fp8(tp.fp8, m, e, false), dxin + off * C, g.fc1 + e * m.fc1_width * C,
                    g.fc1_bias ? g.fc1_bias + e * m.fc1_width : Buf{}, dfc_ + off * m.fc1_width, s.xin + off * C,
                    w.fc1 + e * m.fc1_width * C, n, C, m.fc1_width, false);
  }
  give_rows(s);  // the experts' rows are read (the stream orders their next writer after)
  Buf drows = etp ? tp_reduce(s, dxin) : dxin;  // d input rows: this rank's expert-major, in send order with EP 1
  if (ag) {  // the group's tokens' partial d inputs, summed over EP to their ranks
    ops_.combine_rows(tokens_, drows, comb_g_, nullptr, Tg, k, C, false);
    ep_reduce_scatter(dx, tokens_);
  } else {
    if (m.ep > 1) {
      const Buf back = etp ? bufA_ : bufB_;  // free by now
      ops_.gather_rows(back, drows, inverse_, nullptr, s.R, C);
      ep_->all_to_all_v(back.p, elems(C, s.recv_rows), send_.p, elems(C, s.send_rows), t_);
      drows = send_;
    }
    // dx (T, C) = sum of the token's rows' input gradients
    ops_.combine_rows(dx, drows, comb_, nullptr, T, k, C, false);
  }
  // the routing probabilities' gradient: this rank's rows' (expert-major), back to their tokens' choices
  const std::vector<float> own = own_row_dprob(s, std::move(dots));
  std::vector<float> dprob(static_cast<size_t>(T * k), 0.0f);
  if (ag) {  // the group's assignments (0 but for this rank's experts), summed over EP to the tokens' ranks
    std::vector<float> group(static_cast<size_t>(Tg * k), 0.0f);
    for (int64_t i = 0; i < Tg * k; ++i)
      if (o.comb[size_t(i)] >= 0) group[size_t(i)] = own[size_t(o.comb[size_t(i)])];
    ep_host_->reduce_scatter(dprob.data(), group.data(), T * k);
  } else {
    std::vector<float> sent(own);  // in send order
    if (m.ep > 1) {
      std::vector<float> src(static_cast<size_t>(s.R));
      for (int64_t j = 0; j < s.R; ++j) src[size_t(s.regroup[size_t(j)])] = own[size_t(j)];
      sent.assign(size_t(o.n_send), 0.0f);
      ep_host_->all_to_all_v(src.data(), s.recv_rows, sent.data(), s.send_rows, DType::F32);
    }
    for (int64_t i = 0; i < T * k; ++i)
      if (o.comb[size_t(i)] >= 0) dprob[size_t(i)] = sent[size_t(o.comb[size_t(i)])];
  }
  // + the router's
  std::vector<float> dlogits(static_cast<size_t>(T * E));
  const auto t0 = std::chrono::steady_clock::now();
  routing_backward(s.routing, dprob.data(), m.router, loss_scale_, dlogits.data());
  host_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ops_.to_device(logits_, dlogits.data(), T * E);
  const float* x32 = router_input(x);
  const float* w32 = router_weight(w.router);
  if (t_ == DType::F32) {
    ops_.linear_backward(dx, g.router, nullptr, logits_, x32, w32, T, C, E, true);
  } else {
    ops_.linear_backward(dx32_, g.router, nullptr, logits_, x32, w32, T, C, E, false);
    ops_.convert(tmp_, dx32_, T * C);
    ops_.accumulate(dx, tmp_, T * C);
  }
  if (m.Fs) shared_backward(s, w, g, x, dy, tp);
  return dx;
}

MoEStats MoEMLP::take_stats() {
  for (auto& c : global_counts_) std::fill(c.begin(), c.end(), 0.0);
  std::fill(global_steps_.begin(), global_steps_.end(), 0);
  MoEStats r = stats_;
  stats_ = MoEStats{};
  stats_.layers = r.layers;
  stats_.counts.assign(r.counts.size(), 0.0);
  return r;
}

}  // namespace tpt
