// FP8 GEMMs of the linear layers, current scaling (model/fp8_linear.h, docs/FP8.md "GEMM path").
#include "model/fp8_linear.h"

#include <algorithm>

#include "core/error.h"
#include "core/fp8.h"
#include "model/gpt.h"
#include "parallel/tensor_parallel.h"

namespace tpt {

Fp8Linear::Fp8Linear(Ops& ops, const Fp8LinearOptions& options, int64_t max_inp, int64_t max_w, int64_t max_dout)
    : ops_(ops), o_(options) {
  const int64_t caps[kTensors] = {max_inp, max_w, max_dout};
  for (int i = 0; i < kTensors; ++i) {
    cap_[i] = caps[i];
    codes_[i] = static_cast<uint8_t*>(ops_.alloc_bytes(size_t(std::max<int64_t>(caps[i], 1))));
  }
  static_assert(kStateFloats >= 3 * kTensors + 1);
  state_ = ops_.alloc(kStateFloats);
  const float one = 1.0f;
  ops_.to_device(state_ + 3 * kTensors, &one, 1);
}

Fp8Linear::~Fp8Linear() {
  for (uint8_t* c : codes_) ops_.free(c);
  ops_.free(state_);
}

void Fp8Linear::quantize(const CBuf* x, const int64_t* n, Fp8Operand* q) {
  float* amax = state_;
  float* scale = state_ + kTensors;
  float* scale_inv = state_ + 2 * kTensors;
  const float* one = state_ + 3 * kTensors;
  ops_.zero(amax, kTensors);
  for (int i = 0; i < kTensors; ++i) {  // the amax pass (the codes of scale 1 are overwritten below)
    if (!n[i]) continue;
    TPT_CHECK(n[i] <= cap_[i]);
    ops_.fp8_quantize(codes_[i], x[i], n[i], type(i), one, amax + i);
  }
  float h[3 * kTensors];
  ops_.to_host(h, amax, kTensors);
  fp8_amax_reduce(h, kTensors, o_.amax_groups, 2);  // every rank of a tensor's parts: the same amax
  for (int i = 0; i < kTensors; ++i) {
    // a tensor's own scale: an amax of 0 (or inf / nan) gives no information and keeps 1
    h[kTensors + i] = fp8_scale_from_amax(h[i], 1.0f, type(i), o_.margin);
    h[2 * kTensors + i] = 1.0f / h[kTensors + i];
    if (n[i]) host_scale_[i] = h[kTensors + i];
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
  const CBuf x[kTensors] = {inp, w, CBuf{}};
  const int64_t n[kTensors] = {N * I, O * I, 0};
  Fp8Operand q[kTensors];
  quantize(x, n, q);
  ops_.fp8_linear_forward(out, q[kInp], q[kW], bias, N, I, O, gelu_pre);
}

void Fp8Linear::backward(Buf dinp, float* dw, float* dbias, CBuf dout, CBuf inp, CBuf w, int64_t N, int64_t I,
                         int64_t O, bool accumulate_dinp, CBuf gelu_pre) {
  const bool fp8_dw = dw && o_.wgrad;
  if (dinp || fp8_dw) {
    const CBuf x[kTensors] = {fp8_dw ? inp : CBuf{}, dinp ? w : CBuf{}, dout};
    const int64_t n[kTensors] = {fp8_dw ? N * I : 0, dinp ? O * I : 0, N * O};
    Fp8Operand q[kTensors];
    quantize(x, n, q);
    ops_.fp8_linear_backward(dinp, fp8_dw ? dw : nullptr, q[kDout], q[kInp], q[kW], N, I, O, accumulate_dinp, gelu_pre);
  }
  // the bf16 weight gradient (fp8_wgrad: false) and the bias gradient from the unquantized dout
  if ((dw && !fp8_dw) || dbias)
    ops_.linear_backward(Buf{}, fp8_dw ? nullptr : dw, dbias, dout, fp8_dw ? CBuf{} : inp, CBuf{}, N, I, O, false);
}

// (declared in model/gpt.h: GPTStage allocates these, plan/memory.cpp counts them)
Fp8ScratchSizes fp8_scratch_sizes(const GPTDims& d, int64_t B) {
  const int64_t N = B * d.S;
  return {N * std::max({d.C, d.Cl, d.Fl}),
          std::max({d.qkv_width * d.C, d.C * d.Cl, d.fc1_width * d.C, d.C * d.Fl}),
          N * std::max({d.qkv_width, d.C, d.fc1_width})};
}

int64_t fp8_scratch_bytes(const GPTDims& d, int64_t B) {
  const Fp8ScratchSizes f = fp8_scratch_sizes(d, B);
  return std::max<int64_t>(f.inp, 1) + std::max<int64_t>(f.w, 1) + std::max<int64_t>(f.dout, 1) +
         4 * Fp8Linear::kStateFloats;
}

}  // namespace tpt
