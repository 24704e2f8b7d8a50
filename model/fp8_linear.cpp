// FP8 GEMMs of the linear layers, current and delayed scaling (model/fp8_linear.h, docs/FP8.md "GEMM path").
#include "model/fp8_linear.h"

#include <algorithm>

#include "core/error.h"
#include "core/fp8.h"
#include "model/gpt.h"
#include "parallel/tensor_parallel.h"

namespace tpt {

namespace {
int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
}  // namespace

int64_t Fp8State::state_floats(bool delayed, int64_t gemms) {
  return round_up(delayed ? 3 * kTensors * gemms : 3 * kTensors + 1, 64);
}

Fp8State::Fp8State(Ops& ops, const Fp8LinearOptions& options, int64_t max_inp, int64_t max_w, int64_t max_dout,
                   int64_t gemms)
    : ops_(ops), o_(options), gemms_(size_t(gemms)) {
  TPT_CHECK(gemms >= 1 && o_.history_len >= 1);
  for (int64_t g = 0; g < gemms; ++g) gemms_[size_t(g)].state_ = this, gemms_[size_t(g)].index_ = g;
  const int64_t caps[kTensors] = {max_inp, max_w, max_dout};
  for (int i = 0; i < kTensors; ++i) {
    cap_[i] = caps[i];
    codes_[i] = static_cast<uint8_t*>(ops_.alloc_bytes(size_t(std::max<int64_t>(caps[i], 1))));
  }
  const int64_t T = kTensors * gemms;
  state_ = ops_.alloc(state_floats(o_.delayed, gemms));
  last_scale_.assign(size_t(T), 1.0f);
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

void Fp8State::quantize(int64_t g, const CBuf* x, const int64_t* n, Fp8Operand* q) {
  for (int i = 0; i < kTensors; ++i) TPT_CHECK(n[i] <= cap_[i]);
  float* last = last_scale_.data() + g * kTensors;
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
  fp8_amax_reduce(h, kTensors, o_.amax_groups, 2);  // every rank of a tensor's parts: the same amax
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

void Fp8Linear::forward(Buf out, CBuf inp, CBuf w, CBuf bias, int64_t N, int64_t I, int64_t O, Buf gelu_pre) {
  const CBuf x[Fp8State::kTensors] = {inp, w, CBuf{}};
  const int64_t n[Fp8State::kTensors] = {N * I, O * I, 0};
  Fp8Operand q[Fp8State::kTensors];
  state_->quantize(index_, x, n, q);
  state_->ops_.fp8_linear_forward(out, q[Fp8State::kInp], q[Fp8State::kW], bias, N, I, O, gelu_pre);
}

void Fp8Linear::backward(Buf dinp, float* dw, float* dbias, CBuf dout, CBuf inp, CBuf w, int64_t N, int64_t I,
                         int64_t O, bool accumulate_dinp, CBuf gelu_pre) {
  Ops& ops = state_->ops_;
  const bool fp8_dw = dw && state_->o_.wgrad;
  if (dinp || fp8_dw) {
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
  return {N * std::max({d.C, d.Cl, d.Fl}),
          std::max({d.qkv_width * d.C, d.C * d.Cl, d.fc1_width * d.C, d.C * d.Fl}),
          N * std::max({d.qkv_width, d.C, d.fc1_width})};
}

int64_t fp8_scratch_bytes(const GPTDims& d, int64_t B, bool delayed, int64_t fp8_layers) {
  const Fp8ScratchSizes f = fp8_scratch_sizes(d, B);
  return std::max<int64_t>(f.inp, 1) + std::max<int64_t>(f.w, 1) + std::max<int64_t>(f.dout, 1) +
         4 * Fp8State::state_floats(delayed, kFp8GemmsPerLayer * fp8_layers);
}

std::string fp8_state_name(int64_t layer, int64_t gemm, const char* what) {
  static const char* const kGemms[kFp8GemmsPerLayer] = {"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"};
  TPT_CHECK(gemm >= 0 && gemm < kFp8GemmsPerLayer);
  return "h." + std::to_string(layer) + "." + kGemms[gemm] + ".fp8_" + what;
}

bool is_fp8_state_name(const std::string& tensor) {
  return tensor.starts_with("h.") && (tensor.ends_with(".fp8_scale") || tensor.ends_with(".fp8_amax_history"));
}

}  // namespace tpt
