// Per-element math shared by the CPU and CUDA backends (DESIGN "Backends"): one definition of
// GELU, the AdamW update and the LR schedule, so the CPU tests cover what the GPU runs.
#pragma once
#include <cmath>
#include <cstdint>

#ifndef TPT_HOST_DEVICE
#ifdef __CUDACC__
#define TPT_HOST_DEVICE __host__ __device__
#else
#define TPT_HOST_DEVICE
#endif
#endif

namespace tpt {

// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

TPT_HOST_DEVICE inline float gelu(float x) {
  float u = kGeluScale * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

TPT_HOST_DEVICE inline float gelu_grad(float x) {
  float u = kGeluScale * (x + 0.044715f * x * x * x);
  float t = tanhf(u);
  float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
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

}  // namespace tpt
