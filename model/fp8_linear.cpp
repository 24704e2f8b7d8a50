// FP8 GEMMs of the linear layers, current and delayed scaling (model/fp8_linear.h, docs/FP8.md "GEMM path").
#include "model/fp8_linear.h"

#include <algorithm>

#include "core/error.h"
#include "core/fp8.h"
#include "model/gpt.h"
#include "model/moe.h"
#include "parallel/tensor_parallel.h"

namespace tpt {

namespace {
int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
}  // namespace

int64_t Fp8State::state_floats(const Fp8LinearOptions& o, const Fp8ScratchSizes& f, int64_t gemms) {
  if (o.blockwise) return round_up(f.inp_blocks + f.w_blocks + f.dout_blocks, 64);
  return round_up(o.delayed ? 3 * kTensors * gemms : 3 * kTensors, 64);
}

namespace {
// a kept weight's scale floats: current scaling's scale_inv and reduced amax, or one per 128 x 128 block
// (delayed: the GEMM's own scale_inv in the state)
int64_t kept_scale_floats(const Fp8LinearOptions& o, const Fp8Weight& w) {
  if (o.blockwise) return (w.O + kFp8Block - 1) / kFp8Block * ((w.I + kFp8Block - 1) / kFp8Block);
  return o.delayed ? (w.param ? 1 : 0) : 2;  // (delayed: an FP8 parameter's amax, Fp8State::param_amax)
}
}  // namespace

int64_t Fp8State::weight_cache_bytes(const Fp8LinearOptions& o, const std::vector<Fp8Weight>& weights) {
  int64_t codes = 0, floats = 0;
  for (const Fp8Weight& w : weights)  // the codes and their transpose
    if (w.O * w.I > 0) codes += (w.param ? 1 : 2) * round_up(w.O * w.I, 256), floats += kept_scale_floats(o, w);
  return codes ? codes + 4 * round_up(floats, 64) : 0;
}

Fp8State::Fp8State(Ops& ops, const Fp8LinearOptions& options, const Fp8ScratchSizes& f, int64_t gemms,
                   const std::vector<Fp8Weight>& weights)
    : ops_(ops), o_(options), gemms_(size_t(gemms)) {
  TPT_CHECK(gemms >= 1 && o_.history_len >= 1 && !(o_.delayed && o_.blockwise));
  TPT_CHECK(weights.empty() || int64_t(weights.size()) == gemms);
  for (int64_t g = 0; g < gemms; ++g) gemms_[size_t(g)].state_ = this, gemms_[size_t(g)].index_ = g;
  groups_.assign(size_t(gemms), {o_.amax_groups[0], o_.amax_groups[1]});
  if (weight_cache_bytes(o_, weights) > 0) {  // the kept weights' codes and scales
    kept_.resize(weights.size());
    int64_t codes = 0, floats = 0;
    for (size_t g = 0; g < weights.size(); ++g) {
      const Fp8Weight& w = weights[g];
      if (w.O * w.I == 0) continue;
      const int64_t rows = w.param ? 0 : round_up(w.O * w.I, 256);  // an FP8 parameter's are the parameter
      kept_[g] = KeptWeight{codes, codes + rows, floats, w.O, w.I};
      codes += rows + round_up(w.O * w.I, 256);
      floats += kept_scale_floats(o_, w);
    }
    kept_codes_ = static_cast<uint8_t*>(ops_.alloc_bytes(size_t(codes)));
    if (floats) kept_scales_ = ops_.alloc(round_up(floats, 64));
    kept_scale_floats_ = floats;
  }
  const int64_t caps[kTensors] = {f.inp, f.w, f.dout}, blocks[kTensors] = {f.inp_blocks, f.w_blocks, f.dout_blocks};
  for (int i = 0; i < kTensors; ++i) {
    cap_[i] = caps[i];
    block_cap_[i] = blocks[i];
    codes_[i] = static_cast<uint8_t*>(ops_.alloc_bytes(size_t(std::max<int64_t>(caps[i], 1))));
  }
  if (fp8_both_layouts(o_)) t_codes_ = static_cast<uint8_t*>(ops_.alloc_bytes(size_t(std::max<int64_t>(f.dout, 1))));
  const int64_t T = kTensors * gemms;
  state_ = ops_.alloc(state_floats(o_, f, gemms));
  if (o_.blockwise) return;  // the block scales: written by every quantization
  if (o_.delayed) {  // scales 1, empty histories (Transformer Engine's start)
    scale_.assign(size_t(T), 1.0f);
    history_.assign(size_t(T * o_.history_len), 0.0f);
    scales_loaded();
  }
}

Fp8State::~Fp8State() {
  for (uint8_t* c : codes_) ops_.free(c);
  ops_.free(t_codes_);
  ops_.free(kept_codes_);
  ops_.free(kept_scales_);
  ops_.free(state_);
}

void Fp8State::begin_step() {
  TPT_CHECK(o_.delayed);
  ops_.zero(state_, kTensors * gemms());
}

void Fp8State::read_amaxes(float* amax) {
  TPT_CHECK(o_.delayed);
  ops_.to_host(amax, state_, kTensors * gemms());
}

void Fp8State::update(const float* amax) {
  TPT_CHECK(o_.delayed);
  const int len = o_.history_len;
  for (int64_t k = 0; k < kTensors * gemms(); ++k) {
    float* h = history_.data() + k * len;
    Fp8ScaleState s{scale_[size_t(k)], 1.0f / scale_[size_t(k)]};
    s.record(h, amax[k]);
    s.update(h, len, o_.history_max, type(int(k % kTensors)), o_.margin);
    scale_[size_t(k)] = s.scale;
  }
  scales_loaded();
}

void Fp8State::scales_loaded() {
  const int64_t T = kTensors * gemms();
  std::vector<float> inv(static_cast<size_t>(T));
  for (int64_t k = 0; k < T; ++k) inv[size_t(k)] = 1.0f / scale_[size_t(k)];
  ops_.to_device(state_ + T, scale_.data(), T);
  ops_.to_device(state_ + 2 * T, inv.data(), T);
  ops_.zero(state_, T);
}

void Fp8State::set_param_codes(int64_t g, uint8_t* codes) {
  TPT_CHECK(g >= 0 && size_t(g) < kept_.size() && kept_[size_t(g)].O > 0 && codes);
  KeptWeight& k = kept_[size_t(g)];
  TPT_CHECK(k.t_codes == k.codes);  // made as an Fp8Weight::param: no rowwise copy of its own
  k.param = codes;
  k.src = nullptr;
}

// a kept weight's floats in kept_scales_: current scaling's scale_inv and amax; blockwise: its blocks' scale_inv
int64_t Fp8State::kept_floats(const KeptWeight& k) const { return kept_scale_floats(o_, Fp8Weight{k.O, k.I, k.param != nullptr}); }

float* Fp8State::param_amax_slot(const KeptWeight& k) const { return kept_scales_ + k.scales + (o_.delayed ? 0 : 1); }

void Fp8State::begin_param_amaxes() {
  for (const KeptWeight& k : kept_)  // (blockwise: the blocks' amaxes where their scale_inv go)
    if (k.param) o_.blockwise ? ops_.zero(kept_scales_ + k.scales, kept_floats(k)) : ops_.zero(param_amax_slot(k), 1);
}

void Fp8State::param_amax(int64_t g, CBuf x, int64_t at, int64_t n) {
  const KeptWeight& k = kept_.at(size_t(g));
  TPT_CHECK(k.param && at >= 0 && n >= 0 && at + n <= k.O * k.I);
  if (!n) return;
  if (o_.blockwise) return ops_.fp8_block_amax(kept_scales_ + k.scales, x, at, n, k.I, kFp8Block, kFp8Block);
  ops_.fp8_quantize(nullptr, x, n, type(kW), nullptr, param_amax_slot(k));
}

std::vector<float> Fp8State::param_amaxes(const std::vector<int64_t>& gemms) {
  std::vector<float> all(static_cast<size_t>(kept_scale_floats_)), out;
  if (kept_scale_floats_) ops_.to_host(all.data(), CBuf(kept_scales_), kept_scale_floats_);  // one read
  for (int64_t g : gemms) {
    const KeptWeight* k = size_t(g) < kept_.size() && kept_[size_t(g)].param ? &kept_[size_t(g)] : nullptr;
    if (o_.blockwise) {
      TPT_CHECK(k != nullptr);
      out.insert(out.end(), all.begin() + k->scales, all.begin() + k->scales + kept_floats(*k));
    } else {
      out.push_back(k ? all[size_t(param_amax_slot(*k) - kept_scales_)] : 0.0f);
    }
  }
  return out;
}

void Fp8State::set_param_amaxes(const std::vector<int64_t>& gemms, const std::vector<float>& amax) {
  std::vector<float> all(static_cast<size_t>(kept_scale_floats_));
  if (kept_scale_floats_) ops_.to_host(all.data(), CBuf(kept_scales_), kept_scale_floats_);
  const Fp8Type t = type(kW);
  size_t i = 0;
  for (int64_t g : gemms) {
    const KeptWeight* k = size_t(g) < kept_.size() && kept_[size_t(g)].param ? &kept_[size_t(g)] : nullptr;
    if (o_.blockwise) {  // each block's scale_inv from its reduced amax, as fp8_quantize_blocks makes it
      TPT_CHECK(k != nullptr && i + size_t(kept_floats(*k)) <= amax.size());
      for (int64_t b = 0; b < kept_floats(*k); ++b) all[size_t(k->scales + b)] = 1.0f / fp8_block_scale(amax[i++], t, o_.margin);
    } else {
      TPT_CHECK(i < amax.size());
      if (k) all[size_t(param_amax_slot(*k) - kept_scales_)] = amax[i];
      ++i;
    }
  }
  TPT_CHECK(i == amax.size());
  if (kept_scale_floats_) ops_.to_device(kept_scales_, all.data(), kept_scale_floats_);
  if (o_.blockwise || o_.delayed) return;
  for (int64_t g : gemms)  // each reduced amax's scale_inv (the scale: made again by each cast_param)
    if (size_t(g) < kept_.size() && kept_[size_t(g)].param) {
      float* si = kept_scales_ + kept_[size_t(g)].scales;
      ops_.fp8_current_scales(state_ + kTensors + kW, si, si + 1, &t, 1, o_.margin);
    }
}

void Fp8State::cast_param(int64_t g, CBuf x, int64_t at, int64_t n) {
  KeptWeight& k = kept_.at(size_t(g));
  TPT_CHECK(k.param && at >= 0 && n >= 0 && at + n <= k.O * k.I);
  k.src = nullptr;  // its transpose is made again
  if (!n) return;
  if (o_.blockwise)  // each element with its block's scale (set_param_amaxes)
    return ops_.fp8_quantize_given_blocks(k.param + at, x, at, n, k.I, kFp8Block, kFp8Block, type(kW), kept_scales_ + k.scales);
  if (o_.delayed)  // the step's scale (the whole weight's amax is recorded where a GEMM first reads it)
    return ops_.fp8_quantize(k.param + at, x, n, type(kW), state_ + kTensors * gemms() + g * kTensors + kW,
                             param_amax_slot(k));
  const Fp8Type t = type(kW);
  float* si = kept_scales_ + k.scales;
  float* scale = state_ + kTensors + kW;  // a GEMM call's scratch between calls (its amax too)
  ops_.fp8_current_scales(scale, si, si + 1, &t, 1, o_.margin);
  ops_.fp8_quantize(k.param + at, x, n, t, scale, state_ + kW);
}

Fp8State::KeptWeight* Fp8State::kept(int64_t g, CBuf w, int64_t n) {
  if (kept_.empty() || kept_[size_t(g)].O == 0) return nullptr;
  KeptWeight* k = &kept_[size_t(g)];
  TPT_CHECK(k->O * k->I == n);
  if (k->src != w.p || k->epoch != epoch_) k->src = nullptr;  // stale: quantized again below
  return k;
}

void Fp8State::quantize(int64_t g, const CBuf* x, const int64_t* n, Fp8Operand* q, const int64_t* cols,
                        const int64_t* brows, const int64_t* bcols, const int* layouts, uint8_t* const* cols_to,
                        uint8_t* const* rows) {
  for (int i = 0; i < kTensors; ++i) TPT_CHECK(n[i] <= cap_[i]);
  auto layout = [&](int i) { return layouts ? layouts[i] : int(kRow); };
  // where tensor i's codes go in its layouts: rowwise into codes_[i] (or rows[i]), columnwise into
  // codes_[i], or beside rowwise codes into t_codes_ (or cols_to[i]); the operand reads them with scale_inv
  auto cast = [&](int i, const float* scale, float* amax, const float* scale_inv) {
    const int L = layout(i);
    uint8_t* row = !(L & kRow) ? nullptr : rows && rows[i] ? rows[i] : codes_[i];
    uint8_t* col = !(L & kCol) ? nullptr : !row ? codes_[i] : cols_to && cols_to[i] ? cols_to[i] : t_codes_;
    TPT_CHECK(!(row && col && col == t_codes_) || i == kDout);
    TPT_CHECK(!(L & kCol) || (cols && col && cols[i] > 0 && n[i] % cols[i] == 0));
    if (col) ops_.fp8_cast_transpose(row, col, x[i], n[i] / cols[i], cols[i], type(i), scale, amax);
    else ops_.fp8_quantize(row, x[i], n[i], type(i), scale, amax);
    Fp8Operand o{row, type(i), scale_inv};
    o.t_codes = col;
    return o;
  };
  KeptWeight* kw = n[kW] ? kept(g, x[kW], n[kW]) : nullptr;  // the weight's kept copy (src null: to make)
  TPT_CHECK(!kw || !kw->param || (x[kW].t == DType::U8 && x[kW].p == kw->param));
  // reuse: the weight's codes are there (kept this step, or an FP8 parameter's), not quantized again
  const bool reuse = kw && (kw->src || kw->param);
  auto keep = [&] {  // the copy just made is current; its columnwise (transposed) copy
    kw->src = x[kW].p, kw->epoch = epoch_;
    ops_.fp8_transpose(kept_codes_ + kw->t_codes, rows_of(*kw), kw->O, kw->I);
    ++weight_quantizations_;
  };
  if (kw && kw->param && !kw->src) {  // an FP8 parameter: its transpose, once per weights_changed()
    if (o_.delayed)  // and its amax (reduced over its owners) recorded as the weight's quantization records it
      ops_.fp8_quantize(nullptr, CBuf(param_amax_slot(*kw)), 1, type(kW), nullptr, state_ + g * kTensors + kW);
    keep();
  }
  // the kept weight's operand: its codes, and their transpose
  auto kept_operand = [&](Fp8Operand q) {
    q.t_codes = kept_codes_ + kw->t_codes;
    return q;
  };
  if (o_.blockwise) {  // a scale per block, the blocks' scale_inv in state_ (inputs, weights, gradients)
    TPT_CHECK(cols && brows && bcols);
    float* scale_inv = state_;
    for (int i = 0; i < kTensors; ++i) {
      q[i] = Fp8Operand{};
      if (n[i]) {
        const int64_t rows = n[i] / cols[i], blocks = (rows + brows[i] - 1) / brows[i] * ((cols[i] + bcols[i] - 1) / bcols[i]);
        TPT_CHECK(rows * cols[i] == n[i] && blocks <= block_cap_[i]);
        uint8_t* codes = codes_[i];
        float* si = scale_inv;
        if (i == kW && kw) codes = rows_of(*kw), si = kept_scales_ + kw->scales;
        const bool t = layout(i) == kCol;  // one layout: the codes, or their transpose
        TPT_CHECK(layout(i) == kRow || (t && i != kW));
        if (!(i == kW && reuse))
          ops_.fp8_quantize_blocks(codes, x[i], rows, cols[i], brows[i], bcols[i], type(i), o_.margin, si, t);
        if (i == kW && kw && !reuse) keep();
        q[i] = Fp8Operand{t ? nullptr : codes, type(i), si, brows[i], bcols[i], cols[i], t ? codes : nullptr};
        if (i == kW && kw) q[i] = kept_operand(q[i]);
      }
      scale_inv += block_cap_[i];
    }
    return;
  }
  if (o_.delayed) {  // the last update's scales; the amaxes recorded (max) on the device
    const int64_t T = kTensors * gemms();
    for (int i = 0; i < kTensors; ++i) {
      q[i] = Fp8Operand{};
      if (!n[i]) continue;
      const int64_t k = g * kTensors + i;
      TPT_CHECK(i != kW || layout(i) == kRow);
      if (i == kW && kw) {
        uint8_t* codes = rows_of(*kw);
        if (!reuse) {  // a kept weight's amax was recorded when its copy was made this step
          ops_.fp8_quantize(codes, x[i], n[i], type(i), state_ + T + k, state_ + k);
          keep();
        }
        q[i] = kept_operand(Fp8Operand{codes, type(i), state_ + 2 * T + k});
        continue;
      }
      q[i] = cast(i, state_ + T + k, state_ + k, state_ + 2 * T + k);
    }
    return;
  }
  float* amax = state_;
  float* scale = state_ + kTensors;
  float* scale_inv = state_ + 2 * kTensors;
  // all on the device, nothing read to the host: the amax pass (no codes), the reduction over the
  // groups (device groups), the scales
  ops_.zero(amax, kTensors);
  for (int i = 0; i < kTensors; ++i)
    if (n[i] && !(i == kW && reuse)) ops_.fp8_quantize(nullptr, x[i], n[i], type(i), nullptr, amax + i);
  float* kept_si = kw ? kept_scales_ + kw->scales : nullptr;  // the kept weight's scale_inv, then its amax
  if (reuse) ops_.copy(amax + kW, kept_si + 1, 1);  // the kept copy's (reduced already: the group's maximum again)
  fp8_amax_reduce(amax, kTensors, groups_[size_t(g)].data(), 2);  // every rank of a tensor's parts: the same amax
  // a tensor's own scale: an amax of 0 (or inf / nan) gives no information and keeps 1
  const Fp8Type types[kTensors] = {type(0), type(1), type(2)};
  ops_.fp8_current_scales(scale, scale_inv, amax, types, kTensors, o_.margin);
  for (int i = 0; i < kTensors; ++i) {
    q[i] = Fp8Operand{};
    if (!n[i]) continue;
    if (i == kW && kw) {  // the kept copy, with its own scale_inv
      if (!reuse) {
        ops_.fp8_quantize(kept_codes_ + kw->codes, x[i], n[i], type(i), scale + i, amax + i);
        ops_.copy(kept_si, scale_inv + i, 1);
        ops_.copy(kept_si + 1, amax + i, 1);
        keep();
      }
      q[i] = kept_operand(Fp8Operand{rows_of(*kw), type(i), kept_si});
      continue;
    }
    TPT_CHECK(i != kW || layout(i) == kRow);
    q[i] = cast(i, scale + i, amax + i, scale_inv + i);
  }
}

namespace {
constexpr int64_t B = kFp8Block;
}  // namespace

void Fp8Linear::forward(Buf out, CBuf inp, CBuf w, CBuf bias, int64_t N, int64_t I, int64_t O, Buf gelu_pre,
                        const Fp8SavedInput& save, const Fp8TokenGather* sp) {
  constexpr int kT = Fp8State::kTensors;
  const Fp8LinearOptions& o = state_->o_;
  TPT_CHECK(!save || (o.wgrad && save.scale_inv && save.shard == (sp != nullptr)));
  // blockwise: the shards' 128 x 1 blocks of a saved input must not straddle two ranks' tokens
  TPT_CHECK(!sp || (sp->gather && sp->Nt > 0 && sp->Nt <= N && (!o.blockwise || sp->Nt % B == 0)));
  // current scaling: the shards' amaxes must meet over the TP group (the first reduction), or each rank
  // would cast its shard with a scale of its own
  TPT_CHECK(!sp || o.delayed || o.blockwise || state_->groups_[size_t(index_)][0] != nullptr);
  const bool block_sp = o.blockwise && sp;  // the shard's blocks cast below, not in quantize
  const CBuf x[kT] = {block_sp ? CBuf{} : inp, w, CBuf{}};
  const int64_t n[kT] = {block_sp ? 0 : (sp ? sp->Nt : N) * I, O * I, 0};
  // blockwise: the input 1 x 128 and the weight 128 x 128 along the reduction over I
  const int64_t cols[kT] = {I, I, 1}, br[kT] = {1, B, 1}, bc[kT] = {B, B, 1};
  // the saved input: current and delayed scaling cast it in both layouts at once (the columnwise
  // codes into save), blockwise scaling again in 128 x 1 blocks below; with sp its shard's codes in the
  // rows' layout (current and delayed: the rowwise ones)
  const bool both = save && !o.blockwise && !sp;
  const int layouts[kT] = {Fp8State::kRow | (both ? Fp8State::kCol : 0), Fp8State::kRow, Fp8State::kRow};
  // sp: the shard's codes into the saved shard (current and delayed scaling: the same codes), or in place
  // into its rows of the gathered codes
  uint8_t* const gathered = state_->codes_[Fp8State::kInp];
  uint8_t* shard = !sp ? nullptr : save && !o.blockwise ? save.codes : gathered + int64_t(sp->rank) * sp->Nt * I;
  Fp8Operand q[kT];
  uint8_t* const rows[kT] = {shard, nullptr, nullptr};
  uint8_t* const cols_to[kT] = {both ? save.codes : nullptr, nullptr, nullptr};
  state_->quantize(index_, x, n, q, cols, br, bc, layouts, cols_to, rows);
  Ops& ops = state_->ops_;
  const Fp8Type tx = state_->type(Fp8State::kInp);
  if (block_sp) {  // blockwise: the shard's 1 x 128 blocks (codes and scales) into its rows of the gathered ones
    float* const si = state_->state_;  // the input's block scales (Fp8State::quantize's first region)
    const int64_t per_rank = sp->Nt * ((I + B - 1) / B);
    TPT_CHECK(N * ((I + B - 1) / B) <= state_->block_cap_[Fp8State::kInp]);
    ops.fp8_quantize_blocks(shard, inp, sp->Nt, I, 1, B, tx, o.margin, si + sp->rank * per_rank, false);
    sp->gather(reinterpret_cast<uint8_t*>(si), reinterpret_cast<uint8_t*>(si + sp->rank * per_rank), 4 * per_rank);
    q[Fp8State::kInp] = Fp8Operand{nullptr, tx, si, 1, B, I};
  }
  if (both || (save && sp && !o.blockwise)) {
    ops.copy(save.scale_inv, q[Fp8State::kInp].scale_inv, 1);
  } else if (save && sp) {  // the shard's 128 x 1 blocks in the rows' layout (Nt, I), to be gathered in backward:
    // cast transposed (the fast kernel's layout) into the output gradient's scratch, transposed back
    TPT_CHECK(sp->Nt * I <= state_->cap_[Fp8State::kDout]);
    uint8_t* const t = state_->codes_[Fp8State::kDout];
    ops.fp8_quantize_blocks(t, inp, sp->Nt, I, B, 1, tx, o.margin, save.scale_inv, true);
    ops.fp8_transpose(save.codes, t, I, sp->Nt);
  } else if (save) {  // the weight gradient's quantization (Fp8Linear::backward), made here
    ops.fp8_quantize_blocks(save.codes, inp, N, I, B, 1, tx, o.margin, save.scale_inv, true);
  }
  if (sp) {  // the TP group's codes, every rank's cast with the same scale (blockwise: its own blocks')
    sp->gather(gathered, shard, sp->Nt * I);
    q[Fp8State::kInp].codes = gathered;
  }
  ops.fp8_linear_forward(out, q[Fp8State::kInp], q[Fp8State::kW], bias, N, I, O, gelu_pre);
}

void Fp8Linear::backward(Buf dinp, Buf dw, Buf dbias, CBuf dout, CBuf inp, CBuf w, int64_t N, int64_t I,
                         int64_t O, bool accumulate_dinp, CBuf gelu_pre, const Fp8SavedInput& saved,
                         const Fp8TokenGather* sp, const Fp8TokenGather* dout_sp, const Fp8SavedInput& dout_stash) {
  Ops& ops = state_->ops_;
  const Fp8LinearOptions& o = state_->o_;
  const bool fp8_dw = dw && o.wgrad;
  // ZB-H1: B writes the weight gradient's output-gradient codes into dout_stash, W reads them
  const bool stash_out = dout_stash && dinp, stash_in = dout_stash && !dinp;
  TPT_CHECK(!saved || o.wgrad);
  TPT_CHECK(!saved.shard || (sp && sp->scratch));
  TPT_CHECK(!dout_stash || (o.wgrad && dout_stash.scale_inv && !dout_stash.shard && (stash_out ? !dw : fp8_dw && !dbias)));
  // a gathered output gradient's codes serve both GEMMs: the whole backward, with an FP8 weight gradient
  // (a bf16 one would read the gathered 16-bit tensor), or B keeping them for W; no bias gradient here
  // (it is the shard's)
  TPT_CHECK(!dout_sp || (!o.blockwise && dinp && (fp8_dw || stash_out) && !dbias && dout_sp->gather &&
                         dout_sp->Nt > 0 && (o.delayed || state_->groups_[size_t(index_)][0] != nullptr)));
  const bool cast_inp = fp8_dw && !saved;  // the input's columnwise codes: cast here, or the saved ones
  const Fp8Type tx = state_->type(Fp8State::kInp), ty = state_->type(Fp8State::kDout);
  // the saved input as the weight gradient's operand (after the casts below, which leave the input's
  // codes scratch and block scales unused): a saved shard gathered (its rows' layout, into sp's scratch)
  // and transposed into it, with blockwise scaling its 128 x 1 blocks' scales gathered too
  auto saved_operand = [&] {
    if (saved.shard) {
      uint8_t* col = state_->codes_[Fp8State::kInp];
      TPT_CHECK(N * I <= state_->cap_[Fp8State::kInp]);
      sp->gather(sp->scratch, saved.codes, sp->Nt * I);
      ops.fp8_transpose(col, sp->scratch, N, I);
      if (!o.blockwise) return Fp8Operand{nullptr, tx, saved.scale_inv, 0, 0, 0, col};
      float* const si = state_->state_;
      const int64_t per_rank = sp->Nt / B * I;
      TPT_CHECK(sp->Nt % B == 0 && N / B * I <= state_->block_cap_[Fp8State::kInp]);
      sp->gather(reinterpret_cast<uint8_t*>(si), reinterpret_cast<const uint8_t*>(saved.scale_inv), 4 * per_rank);
      return Fp8Operand{nullptr, tx, si, B, 1, I, col};
    }
    if (!o.blockwise) return Fp8Operand{nullptr, tx, saved.scale_inv, 0, 0, 0, saved.codes};
    return Fp8Operand{nullptr, tx, saved.scale_inv, B, 1, I, saved.codes};
  };
  // W's output gradient: B's columnwise codes (blockwise: its 128 x 1 blocks)
  auto stashed_operand = [&] {
    if (!o.blockwise) return Fp8Operand{nullptr, ty, dout_stash.scale_inv, 0, 0, 0, dout_stash.codes};
    return Fp8Operand{nullptr, ty, dout_stash.scale_inv, B, 1, O, dout_stash.codes};
  };
  if (o.blockwise) {  // two calls: each GEMM's operands in blocks along its own reduction
    constexpr int kT = Fp8State::kTensors;
    Fp8Operand q[kT];
    if (dinp) {  // dinp = dout @ w: the output gradient 1 x 128 over O, the weight 128 x 128
      const CBuf x[kT] = {CBuf{}, w, dout};
      const int64_t n[kT] = {0, O * I, N * O}, cols[kT] = {1, I, O}, br[kT] = {1, B, 1}, bc[kT] = {1, B, B};
      state_->quantize(index_, x, n, q, cols, br, bc);
      ops.fp8_linear_backward(dinp, nullptr, q[Fp8State::kDout], Fp8Operand{}, q[Fp8State::kW], N, I, O, accumulate_dinp,
                              gelu_pre);
    }
    if (stash_out)  // the weight gradient's quantization (below), made here
      ops.fp8_quantize_blocks(dout_stash.codes, dout, N, O, B, 1, ty, o.margin, dout_stash.scale_inv, true);
    if (fp8_dw) {  // dw += dout^T @ inp: both 128 x 1 over the tokens, written transposed (K-major)
      const CBuf x[kT] = {cast_inp ? inp : CBuf{}, CBuf{}, stash_in ? CBuf{} : dout};
      const int64_t n[kT] = {cast_inp ? N * I : 0, 0, stash_in ? 0 : N * O}, cols[kT] = {I, 1, O},
                    br[kT] = {B, 1, B}, bc[kT] = {1, 1, 1};
      const int layouts[kT] = {Fp8State::kCol, Fp8State::kRow, Fp8State::kCol};
      if (n[Fp8State::kInp] || n[Fp8State::kDout]) state_->quantize(index_, x, n, q, cols, br, bc, layouts);
      if (saved) q[Fp8State::kInp] = saved_operand();
      if (stash_in) q[Fp8State::kDout] = stashed_operand();
      ops.fp8_linear_backward(Buf{}, dw, q[Fp8State::kDout], q[Fp8State::kInp], Fp8Operand{}, N, I, O, false, CBuf{});
    }
  } else if (dinp || fp8_dw) {
    // the input columnwise (the weight gradient reads it transposed), the output gradient rowwise for
    // the input gradient and columnwise for the weight gradient (or B's stash for W), each made in its
    // cast; dout_sp: the output gradient's shard cast rowwise in place into its rows of the gathered codes
    constexpr int kD = Fp8State::kDout;
    uint8_t* const gathered = state_->codes_[kD];
    uint8_t* const rows[Fp8State::kTensors] = {nullptr, nullptr,
                                               dout_sp ? gathered + int64_t(dout_sp->rank) * dout_sp->Nt * O : nullptr};
    uint8_t* const cols_to[Fp8State::kTensors] = {nullptr, nullptr, stash_out ? dout_stash.codes : nullptr};
    const CBuf x[Fp8State::kTensors] = {cast_inp ? inp : CBuf{}, dinp ? w : CBuf{}, stash_in ? CBuf{} : dout};
    const int64_t n[Fp8State::kTensors] = {cast_inp ? N * I : 0, dinp ? O * I : 0,
                                           stash_in ? 0 : (dout_sp ? dout_sp->Nt : N) * O};
    const int64_t cols[Fp8State::kTensors] = {I, I, O};
    const bool dout_col = (fp8_dw || stash_out) && !dout_sp;
    const int layouts[Fp8State::kTensors] = {Fp8State::kCol, Fp8State::kRow,
                                             (dinp ? Fp8State::kRow : 0) | (dout_col ? Fp8State::kCol : 0)};
    Fp8Operand q[Fp8State::kTensors];
    if (n[0] || n[1] || n[2]) state_->quantize(index_, x, n, q, cols, nullptr, nullptr, layouts, cols_to, rows);
    if (dout_sp) {  // the TP group's codes (one scale), and their transpose for the weight gradient
      dout_sp->gather(gathered, rows[kD], dout_sp->Nt * O);
      uint8_t* t = stash_out ? dout_stash.codes : state_->t_codes_;
      ops.fp8_transpose(t, gathered, N, O);
      q[kD].codes = gathered, q[kD].t_codes = t;
    }
    if (stash_out) ops.copy(dout_stash.scale_inv, q[kD].scale_inv, 1);
    if (stash_in) q[kD] = stashed_operand();
    if (fp8_dw && saved) q[Fp8State::kInp] = saved_operand();
    ops.fp8_linear_backward(dinp, fp8_dw ? dw : nullptr, q[Fp8State::kDout], q[Fp8State::kInp], q[Fp8State::kW], N, I,
                            O, accumulate_dinp, gelu_pre);
  }
  // the bf16 weight gradient (fp8_wgrad: false) and the bias gradient from the unquantized dout
  if ((dw && !fp8_dw) || dbias)
    ops.linear_backward(Buf{}, fp8_dw ? nullptr : dw, dbias, dout, fp8_dw ? CBuf{} : inp, CBuf{}, N, I, O, false);
}

// (declared in model/gpt.h: GPTStage allocates these, plan/memory.cpp counts them)
Fp8ScratchSizes fp8_scratch_sizes(const GPTDims& d, int64_t B) {
  const int64_t N = B * d.S;
  auto blocks = [](int64_t rows, int64_t cols, int64_t br, int64_t bc) {
    return (rows + br - 1) / br * ((cols + bc - 1) / bc);
  };
  Fp8ScratchSizes f;
  struct Gemm {
    int64_t rows, I, O;
  };
  std::vector<Gemm> gemms = {{N, d.C, d.qkv_width}, {N, d.Cl, d.C}, {N, d.C, d.fc1_width}, {N, d.Fl, d.C}};
  if (d.moe.any()) {  // a MoE layer's: the shared expert's on every token, an expert's on up to all its rows
    const MoEDims& m = d.moe;
    const int64_t rows = m.etp * moe_rows_bound(m, d.local_tokens(N));
    gemms.push_back({rows, d.C, m.fc1_width});
    gemms.push_back({rows, m.Fel, d.C});
    if (m.Fs) {
      gemms.push_back({N, d.C, m.shared_fc1_width});
      gemms.push_back({N, m.Fsl, d.C});
    }
  }
  for (const auto& [rows, I, O] : gemms) {
    f.inp = std::max(f.inp, rows * I);
    f.w = std::max(f.w, O * I);
    f.dout = std::max(f.dout, rows * O);
    // blockwise: 1 x 128 for the forward / input gradient, 128 x 1 for the weight gradient
    f.inp_blocks = std::max({f.inp_blocks, blocks(rows, I, 1, kFp8Block), blocks(rows, I, kFp8Block, 1)});
    f.w_blocks = std::max(f.w_blocks, blocks(O, I, kFp8Block, kFp8Block));
    f.dout_blocks = std::max({f.dout_blocks, blocks(rows, O, 1, kFp8Block), blocks(rows, O, kFp8Block, 1)});
  }
  return f;
}

std::vector<Fp8Weight> fp8_weights(const GPTDims& d, int64_t begin, int64_t end) {
  const int64_t G = fp8_gemms_per_layer(d);
  const MoEDims& m = d.moe;
  std::vector<Fp8Weight> w(size_t(std::max<int64_t>(0, end - begin) * G));
  for (int64_t l = begin; l < end; ++l) {
    Fp8Weight* s = w.data() + (l - begin) * G;  // (O, I) of each slot
    s[0] = {d.qkv_width, d.C};
    s[1] = {d.C, d.Cl};
    if (!(m.any() && m.is_moe(l))) {
      s[2] = {d.fc1_width, d.C};
      s[3] = {d.C, d.Fl};
      continue;
    }
    if (m.Fs) s[2] = {m.shared_fc1_width, d.C}, s[3] = {d.C, m.Fsl};
    for (int64_t e = m.expert_begin; e < m.expert_begin + m.El; ++e) {
      s[kFp8GemmsPerLayer + e] = {m.fc1_width, d.C};
      s[kFp8GemmsPerLayer + m.E + e] = {d.C, m.Fel};
    }
  }
  if (d.fp8_params)  // every kept weight (model/params.cpp marks the same tensors ParamGroup::fp8)
    for (Fp8Weight& x : w) x.param = x.O * x.I > 0;
  return w;
}

int64_t fp8_scratch_bytes(const GPTDims& d, int64_t B, const Fp8LinearOptions& o, int64_t begin, int64_t end) {
  const Fp8ScratchSizes f = fp8_scratch_sizes(d, B);
  return std::max<int64_t>(f.inp, 1) + std::max<int64_t>(f.w, 1) + std::max<int64_t>(f.dout, 1) +
         (fp8_both_layouts(o) ? std::max<int64_t>(f.dout, 1) : 0) +
         4 * Fp8State::state_floats(o, f, fp8_gemms_per_layer(d) * (end - begin)) +
         Fp8State::weight_cache_bytes(o, fp8_weights(d, begin, end));
}

std::vector<Fp8StateEntry> fp8_state_entries(bool moe_layer, int64_t experts, bool shared_expert) {
  if (!moe_layer) return {{"attn.qkv", 0}, {"attn.proj", 1}, {"mlp.fc1", 2}, {"mlp.fc2", 3}};
  std::vector<Fp8StateEntry> e = {{"attn.qkv", 0}, {"attn.proj", 1}};
  if (shared_expert) e.insert(e.end(), {{"mlp.shared_experts.fc1", 2}, {"mlp.shared_experts.fc2", 3}});
  e.push_back({"mlp.experts.fc1", kFp8GemmsPerLayer, experts});
  e.push_back({"mlp.experts.fc2", kFp8GemmsPerLayer + experts, experts});
  return e;
}

std::string fp8_state_name(int64_t layer, const std::string& gemm, const char* what) {
  return "h." + std::to_string(layer) + "." + gemm + ".fp8_" + what;
}

bool is_fp8_state_name(const std::string& tensor) {
  return tensor.starts_with("h.") && (tensor.ends_with(".fp8_scale") || tensor.ends_with(".fp8_amax_history"));
}

}  // namespace tpt
