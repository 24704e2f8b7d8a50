// FP8 training's GEMM path (docs/FP8.md "GEMM path"): the linear layers' GEMMs of a transformer layer
// (attn.qkv, attn.proj, mlp.fc1, mlp.fc2) with FP8 inputs, Transformer Engine's current scaling
// (training.fp8_recipe: tensorwise). Each GEMM input -- the activation, the weight, the output gradient --
// is quantized with the scale of its own amax: one pass for the amaxes (Ops::fp8_quantize), their
// maximum over the ranks holding parts of the same tensor (TP, CP: parallel/tensor_parallel.h
// fp8_amax_reduce, one collective per group per GEMM call), the scale (core/fp8.h
// fp8_scale_from_amax), the cast (Ops::fp8_quantize), then Ops::fp8_linear_forward / backward. Outputs,
// input gradients and bias gradients as the bf16 path (the bias gradient from the unquantized output
// gradient); weight gradients in fp32 from FP8 inputs, or with training.fp8_wgrad: false from the bf16
// ones (Ops::linear_backward).
// Formats: activations and weights E4M3; output gradients E4M3 (fp8_format: e4m3) or E5M2 (hybrid).
// Every call quantizes what it reads again (the weight in each micro-batch's forward and backward, the
// activation again for the weight gradient): the same values give the same codes and scales, so a
// split backward (ZB-H1) and recompute give what one backward gives.
#pragma once
#include <cstdint>

#include "core/ops.h"

namespace tpt {

class Comm;

struct Fp8LinearOptions {
  bool hybrid = false;  // E5M2 output gradients (else E4M3)
  bool wgrad = true;    // weight-gradient GEMMs in FP8 (false: bf16)
  int margin = 0;       // scale = (fp8_max / amax) / 2^margin
  // the amax reductions (max), in this order; null: none. The tensor-parallel and the context-parallel
  // group: the ranks holding parts of one GEMM input.
  Comm* amax_groups[2] = {nullptr, nullptr};
};

class Fp8Linear {
 public:
  // Scratch for the codes of the largest input (elements), weight and output gradient of the GEMMs it runs.
  Fp8Linear(Ops& ops, const Fp8LinearOptions& options, int64_t max_inp, int64_t max_w, int64_t max_dout);
  ~Fp8Linear();
  Fp8Linear(const Fp8Linear&) = delete;
  Fp8Linear& operator=(const Fp8Linear&) = delete;

  // Ops::linear_forward / linear_backward's contract, the GEMMs in FP8.
  void forward(Buf out, CBuf inp, CBuf w, CBuf bias, int64_t N, int64_t I, int64_t O, Buf gelu_pre = {});
  void backward(Buf dinp, float* dw, float* dbias, CBuf dout, CBuf inp, CBuf w, int64_t N, int64_t I, int64_t O,
                bool accumulate_dinp, CBuf gelu_pre = {});

  // The scales (host copies) of the last call's inputs: activation, weight, output gradient (tests).
  const float* last_scales() const { return host_scale_; }
  // the device floats it keeps: amax, scale and scale_inv of each input, and a 1 (10), padded to 256
  // bytes, a multiple of both backends' allocation alignment (the plan counts what is allocated)
  static constexpr int64_t kStateFloats = 64;

 private:
  enum { kInp, kW, kDout, kTensors };
  // quantizes x[i] (n[i] elements; n[i] == 0: none) into codes_[i] with its own scale, the amaxes
  // reduced together (one collective per group), and returns the operands
  void quantize(const CBuf* x, const int64_t* n, Fp8Operand* q);
  Fp8Type type(int i) const { return i == kDout && o_.hybrid ? Fp8Type::E5M2 : Fp8Type::E4M3; }

  Ops& ops_;
  Fp8LinearOptions o_;
  uint8_t* codes_[kTensors] = {};
  int64_t cap_[kTensors] = {};
  // on the device: amax[3], scale[3], scale_inv[3], one
  float* state_ = nullptr;
  float host_scale_[kTensors] = {1.0f, 1.0f, 1.0f};
};

// A linear layer's GEMMs: through fp8 when given, else Ops's own.
inline void linear_forward(Ops& ops, Fp8Linear* fp8, Buf out, CBuf inp, CBuf w, CBuf bias, int64_t N, int64_t I,
                           int64_t O, Buf gelu_pre = {}) {
  if (fp8) fp8->forward(out, inp, w, bias, N, I, O, gelu_pre);
  else ops.linear_forward(out, inp, w, bias, N, I, O, gelu_pre);
}
inline void linear_backward(Ops& ops, Fp8Linear* fp8, Buf dinp, float* dw, float* dbias, CBuf dout, CBuf inp, CBuf w,
                            int64_t N, int64_t I, int64_t O, bool accumulate_dinp, CBuf gelu_pre = {}) {
  if (fp8) fp8->backward(dinp, dw, dbias, dout, inp, w, N, I, O, accumulate_dinp, gelu_pre);
  else ops.linear_backward(dinp, dw, dbias, dout, inp, w, N, I, O, accumulate_dinp, gelu_pre);
}

}  // namespace tpt
