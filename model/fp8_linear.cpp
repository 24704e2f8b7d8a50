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
  return round_up(o.delayed ? 3 * kTensors * gemms : 3 * kTensors + 1, 64);
}

Fp8State::Fp8State(Ops& ops, const Fp8LinearOptions& options, const Fp8ScratchSizes& f, int64_t gemms)
    : ops_(ops), o_(options), gemms_(size_t(gemms)) {
  TPT_CHECK(gemms >= 1 && o_.history_len >= 1 && !(o_.delayed && o_.blockwise));
  for (int64_t g = 0; g < gemms; ++g) gemms_[size_t(g)].state_ = this, gemms_[size_t(g)].index_ = g;
  groups_.assign(size_t(gemms), {o_.amax_groups[0], o_.amax_groups[1]});
  const int64_t caps[kTensors] = {f.inp, f.w, f.dout}, blocks[kTensors] = {f.inp_blocks, f.w_blocks, f.dout_blocks};
  for (int i = 0; i < kTensors; ++i) {
    cap_[i] = caps[i];
    block_cap_[i] = blocks[i];
    codes_[i] = static_cast<uint8_t*>(ops_.alloc_bytes(size_t(std::max<int64_t>(caps[i], 1))));
  }
  const int64_t T = kTensors * gemms;
  state_ = ops_.alloc(state_floats(o_, f, gemms));
  last_scale_.assign(size_t(T), 1.0f);
  if (o_.blockwise) return;  // the block scales: written by every quantization
  if (o_.delayed) {  // scales 1, empty histories (Transformer Engine's start)
    scale_.assign(size_t(T), 1.0f);
    history_.assign(size_t(T * o_.history_len), 0.0f);
    scales_loaded();
  } else {
    const float one = 1.0f;
    ops_.to_device(state_ + 3 * kTensors, &one, 1);
  }
}

Fp8State::~Fp8State() {
  for (uint8_t* c : codes_) ops_.free(c);
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

void Fp8State::quantize(int64_t g, const CBuf* x, const int64_t* n, Fp8Operand* q, const int64_t* cols,
                        const int64_t* brows, const int64_t* bcols) {
  for (int i = 0; i < kTensors; ++i) TPT_CHECK(n[i] <= cap_[i]);
  float* last = last_scale_.data() + g * kTensors;
  if (o_.blockwise) {  // a scale per block, the blocks' scale_inv in state_ (inputs, weights, gradients)
    TPT_CHECK(cols && brows && bcols);
    float* scale_inv = state_;
    for (int i = 0; i < kTensors; ++i) {
      q[i] = Fp8Operand{};
      if (n[i]) {
        const int64_t rows = n[i] / cols[i], blocks = (rows + brows[i] - 1) / brows[i] * ((cols[i] + bcols[i] - 1) / bcols[i]);
        TPT_CHECK(rows * cols[i] == n[i] && blocks <= block_cap_[i]);
        ops_.fp8_quantize_blocks(codes_[i], x[i], rows, cols[i], brows[i], bcols[i], type(i), o_.margin, scale_inv);
        q[i] = Fp8Operand{codes_[i], type(i), scale_inv, brows[i], bcols[i], cols[i]};
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
      ops_.fp8_quantize(codes_[i], x[i], n[i], type(i), state_ + T + k, state_ + k);
      q[i] = Fp8Operand{codes_[i], type(i), state_ + 2 * T + k};
      last[i] = scale_[size_t(k)];
    }
    return;
  }
  float* amax = state_;
  float* scale = state_ + kTensors;
  float* scale_inv = state_ + 2 * kTensors;
  const float* one = state_ + 3 * kTensors;
  ops_.zero(amax, kTensors);
  for (int i = 0; i < kTensors; ++i)  // the amax pass (the codes of scale 1 are overwritten below)
    if (n[i]) ops_.fp8_quantize(codes_[i], x[i], n[i], type(i), one, amax + i);
  float h[3 * kTensors];
  ops_.to_host(h, amax, kTensors);
  fp8_amax_reduce(h, kTensors, groups_[size_t(g)].data(), 2);  // every rank of a tensor's parts: the same amax
  for (int i = 0; i < kTensors; ++i) {
    // a tensor's own scale: an amax of 0 (or inf / nan) gives no information and keeps 1
    h[kTensors + i] = fp8_scale_from_amax(h[i], 1.0f, type(i), o_.margin);
    h[2 * kTensors + i] = 1.0f / h[kTensors + i];
    if (n[i]) last[i] = h[kTensors + i];
  }
  ops_.to_device(scale, h + kTensors, 2 * kTensors);
  for (int i = 0; i < kTensors; ++i) {
    q[i] = Fp8Operand{};
    if (!n[i]) continue;
    ops_.fp8_quantize(codes_[i], x[i], n[i], type(i), scale + i, amax + i);
    q[i] = Fp8Operand{codes_[i], type(i), scale_inv + i};
  }
}

namespace {
constexpr int64_t B = kFp8Block;
}  // namespace

void Fp8Linear::forward(Buf out, CBuf inp, CBuf w, CBuf bias, int64_t N, int64_t I, int64_t O, Buf gelu_pre) {
  const CBuf x[Fp8State::kTensors] = {inp, w, CBuf{}};
  const int64_t n[Fp8State::kTensors] = {N * I, O * I, 0};
  // blockwise: the input 1 x 128 and the weight 128 x 128 along the reduction over I
  const int64_t cols[Fp8State::kTensors] = {I, I, 1}, br[Fp8State::kTensors] = {1, B, 1}, bc[Fp8State::kTensors] = {B, B, 1};
  Fp8Operand q[Fp8State::kTensors];
  state_->quantize(index_, x, n, q, cols, br, bc);
  state_->ops_.fp8_linear_forward(out, q[Fp8State::kInp], q[Fp8State::kW], bias, N, I, O, gelu_pre);
}

void Fp8Linear::backward(Buf dinp, Buf dw, Buf dbias, CBuf dout, CBuf inp, CBuf w, int64_t N, int64_t I,
                         int64_t O, bool accumulate_dinp, CBuf gelu_pre) {
  Ops& ops = state_->ops_;
  const bool fp8_dw = dw && state_->o_.wgrad;
  if (state_->o_.blockwise) {  // two calls: each GEMM's operands in blocks along its own reduction
    constexpr int kT = Fp8State::kTensors;
    Fp8Operand q[kT];
    if (dinp) {  // dinp = dout @ w: the output gradient 1 x 128 over O, the weight 128 x 128
      const CBuf x[kT] = {CBuf{}, w, dout};
      const int64_t n[kT] = {0, O * I, N * O}, cols[kT] = {1, I, O}, br[kT] = {1, B, 1}, bc[kT] = {1, B, B};
      state_->quantize(index_, x, n, q, cols, br, bc);
      ops.fp8_linear_backward(dinp, nullptr, q[Fp8State::kDout], Fp8Operand{}, q[Fp8State::kW], N, I, O, accumulate_dinp,
                              gelu_pre);
    }
    if (fp8_dw) {  // dw += dout^T @ inp: both 128 x 1 over the tokens
      const CBuf x[kT] = {inp, CBuf{}, dout};
      const int64_t n[kT] = {N * I, 0, N * O}, cols[kT] = {I, 1, O}, br[kT] = {B, 1, B}, bc[kT] = {1, 1, 1};
      state_->quantize(index_, x, n, q, cols, br, bc);
      ops.fp8_linear_backward(Buf{}, dw, q[Fp8State::kDout], q[Fp8State::kInp], Fp8Operand{}, N, I, O, false, CBuf{});
    }
  } else if (dinp || fp8_dw) {
    const CBuf x[Fp8State::kTensors] = {fp8_dw ? inp : CBuf{}, dinp ? w : CBuf{}, dout};
    const int64_t n[Fp8State::kTensors] = {fp8_dw ? N * I : 0, dinp ? O * I : 0, N * O};
    Fp8Operand q[Fp8State::kTensors];
    state_->quantize(index_, x, n, q);
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

int64_t fp8_scratch_bytes(const GPTDims& d, int64_t B, const Fp8LinearOptions& o, int64_t fp8_layers) {
  const Fp8ScratchSizes f = fp8_scratch_sizes(d, B);
  return std::max<int64_t>(f.inp, 1) + std::max<int64_t>(f.w, 1) + std::max<int64_t>(f.dout, 1) +
         4 * Fp8State::state_floats(o, f, fp8_gemms_per_layer(d) * fp8_layers);
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
