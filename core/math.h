// Per-element math shared by the CPU and CUDA backends (docs/ARCHITECTURE.md "Backends and
// communicators"): one definition of exp, tanh, GELU and the AdamW update, so the CPU
// tests cover what the GPU runs. (The LR schedule is model/optimizer.h's learning_rate.)
#pragma once
#include <cmath>
#include <cstdint>

#include "core/dtype.h"

#ifndef TPT_HOST_DEVICE
#ifdef __CUDACC__
#define TPT_HOST_DEVICE __host__ __device__
#else
#define TPT_HOST_DEVICE
#endif
#endif

namespace tpt {

// exp(x) in float that the compiler can vectorize (libm's expf is a scalar call): Cody-Waite
// reduction by ln 2 and Cephes' degree-6 polynomial, within 2 ulp of expf on [-87.3, 88.37];
// inputs outside are clamped (exp(-87.3) ~ 1e-38 instead of a denormal or 0; exp(88.37) ~ 2.4e38,
// finite: the power of two n stays <= 127, never the infinity exponent); a nan stays a nan.
TPT_HOST_DEVICE inline float fast_exp(float in) {
  const float x = fminf(fmaxf(in, -87.33654f), 88.37626f);  // (fmaxf drops a nan: returned below)
  const float n = floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return in == in ? p * scale : in;
}

// tanh through fast_exp (vectorizable): 1 - 2 / (exp(2u) + 1); absolute error ~1e-7.
TPT_HOST_DEVICE inline float fast_tanh(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }

// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

TPT_HOST_DEVICE inline float gelu(float x) {
  float u = kGeluScale * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + fast_tanh(u));
}

TPT_HOST_DEVICE inline float gelu_grad(float x) {
  // Beyond |x| = 10 the derivative is 1 (x > 0: what the formula gives in float from x ~ 6.6 on) or,
  // below -10, smaller than 1e-35 in size; there exp(2u) and x^2 overflow (inf / inf, 0 * inf: nans).
  if (!(x <= 10.0f)) return x > 10.0f ? 1.0f : x;  // a nan stays a nan
  x = fmaxf(x, -10.0f);
  float u = kGeluScale * (x + 0.044715f * x * x * x);
  // tanh and sech^2 from one exp: e = exp(2u), tanh = 1 - 2/(e+1), sech^2 = 4e/(e+1)^2 (no
  // cancellation near |tanh| = 1)
  float e = fast_exp(2.0f * u);
  float t = 1.0f - 2.0f / (e + 1.0f);
  // for e > ~1.8e19 (x > ~6.6) (e + 1)^2 is inf and sech^2 is 0 (4e, 3.3e38 at x = 10, stays finite)
  float sech2 = e > 1e20f ? 0.0f : 4.0f * e / ((e + 1.0f) * (e + 1.0f));
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

// SiLU (swish) x * sigmoid(x), and SwiGLU's two partial derivatives: out = silu(g) * u,
// d/dg = u * silu'(g), d/du = silu(g), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g).
TPT_HOST_DEVICE inline float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }
TPT_HOST_DEVICE inline float silu(float x) { return x * sigmoid(x); }
TPT_HOST_DEVICE inline float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

// One RoPE pair (x0, x1) rotated by the angle whose cosine and sine are c, s (s negated for the
// inverse rotation): x0' = x0 c - x1 s, x1' = x1 c + x0 s.
TPT_HOST_DEVICE inline void rope_rotate(float& x0, float& x1, float c, float s) {
  const float a = x0 * c - x1 * s, b = x1 * c + x0 * s;
  x0 = a;
  x1 = b;
}

// torch.optim.AdamW for one element. step is 1-based. Decoupled decay: p -= lr*wd*p first.
struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1, bias_correction2;  // 1 - beta^step
  float one_minus_beta1, one_minus_beta2;    // computed in double, as torch's Python scalars are
};

TPT_HOST_DEVICE inline void adamw_update(float& p, float g, float& m, float& v, const AdamWParams& a,
                                         bool decay) {
  if (decay) p *= 1.0f - a.lr * a.weight_decay;
  m = a.beta1 * m + a.one_minus_beta1 * g;
  v = a.beta2 * v + a.one_minus_beta2 * g * g;
  float denom = sqrtf(v) / sqrtf(a.bias_correction2) + a.eps;
  p -= (a.lr / a.bias_correction1) * m / denom;
}

// An optimizer state (an Adam moment, or the master weight with optimizer.main_params_dtype)
// stored as t: F32; BF16 (the precision-aware optimizer's bf16 moments: read as fp32, written back
// rounded to nearest even, torch's .bfloat16()); or F16 scaled per tensor as Transformer Engine's
// FusedAdam stores fp16 states: the value is fp16(code) * scale (an fp32 product), and a step writes
// code = fp16(x * rscale) with scale = absmax / (65504 / 2) over the tensor's new values and
// rscale = 1 / scale (0 for an all-zero tensor). Half the fp16 range is left as headroom.
constexpr float kFp16StateRange = 65504.0f / 2.0f;
TPT_HOST_DEVICE inline float fp16_state_scale(float absmax) { return absmax / kFp16StateRange; }
TPT_HOST_DEVICE inline float fp16_state_rscale(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }
TPT_HOST_DEVICE inline float load_state(const void* p, DType t, int64_t i, float scale) {
  if (t == DType::F32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return t == DType::BF16 ? bf16_to_fp32(h) : fp16_to_fp32(h) * scale;
}
TPT_HOST_DEVICE inline void store_state(void* p, DType t, int64_t i, float x, float rscale) {
  if (t == DType::F32) static_cast<float*>(p)[i] = x;
  else if (t == DType::BF16) static_cast<uint16_t*>(p)[i] = fp32_to_bf16(x);
  else static_cast<uint16_t*>(p)[i] = fp32_to_fp16(x * rscale);
}

// One element of a pass of the optimizer step over stored states (core/ops.h adamw_segments and
// adamw_store_scaled, the same on both backends): the master weight at `at` (remainders: with the
// compute copy's bits), the moments at `loc`, the compute copy at `off`; g the gradient, already
// multiplied by the clip. The fp32 update is the same in both passes. First pass (new_scales null):
// folds the F16 states' |new value| into am / av / ap (all three with scaled states; only the F16
// ones' are used) and writes every other state and the compute
// copy unless the master is F16 (with scaled states the moments, which the store pass reads again,
// neither). Store pass: writes the moments (F16 with the new scales) and an F16 master, and with an
// F16 master the compute copy of the master as stored. The master, if not F16, may be the new one in
// the store pass: that pass does not use it.
struct AdamWStates {
  void* master;  // null with remainders
  DType master_t;
  void *m, *v;
  DType m_t, v_t;
  void* compute;  // null, or the compute copy in compute_t
  DType compute_t;
  uint16_t* remainders;
  const float* scales;      // 3 per tensor (m, v, master) with F16 states, else null
  const float* new_scales;  // the store pass's, else null
};
TPT_HOST_DEVICE inline void adamw_state_step(const AdamWStates& b, const AdamWParams& a, float g, bool decay,
                                             int64_t at, int64_t loc, int64_t off, int tensor, float& am, float& av,
                                             float& ap) {
  const float* sc = b.scales ? b.scales + 3 * tensor : nullptr;
  uint16_t* c16 = b.compute && b.compute_t != DType::F32 ? static_cast<uint16_t*>(b.compute) + off : nullptr;
  float p = b.remainders ? master_from_remainder(*c16, b.remainders[at])
                         : load_state(b.master, b.master_t, at, sc ? sc[2] : 1.0f);
  float m = load_state(b.m, b.m_t, loc, sc ? sc[0] : 1.0f), v = load_state(b.v, b.v_t, loc, sc ? sc[1] : 1.0f);
  adamw_update(p, g, m, v, a, decay);
  const bool m16 = b.m_t == DType::F16, v16 = b.v_t == DType::F16, p16 = b.master_t == DType::F16;
  if (b.new_scales) {
    const float* ns = b.new_scales + 3 * tensor;
    store_state(b.m, b.m_t, loc, m, m16 ? fp16_state_rscale(ns[0]) : 1.0f);
    store_state(b.v, b.v_t, loc, v, v16 ? fp16_state_rscale(ns[1]) : 1.0f);
    if (!p16) return;
    store_state(b.master, DType::F16, at, p, fp16_state_rscale(ns[2]));
    p = load_state(b.master, DType::F16, at, ns[2]);  // the weight as stored
  } else {
    if (sc) {  // scaled: the moments (which the store pass reads again) are written there
      am = fmaxf(am, fabsf(m));
      av = fmaxf(av, fabsf(v));
    } else {
      store_state(b.m, b.m_t, loc, m, 1.0f);
      store_state(b.v, b.v_t, loc, v, 1.0f);
    }
    if (p16) {
      ap = fmaxf(ap, fabsf(p));
      return;
    }
    if (b.remainders) {
      *c16 = master_to_bf16(p);
      b.remainders[at] = master_remainder(p);
      return;
    }
    store_state(b.master, DType::F32, at, p, 1.0f);
  }
  if (c16) *c16 = master_copy_bits(p, b.compute_t);
  else if (b.compute) static_cast<float*>(b.compute)[off] = p;
}

}  // namespace tpt
