// fp32 SwiGLU forward and backward (core/cpu/kernels.h) over core/math.h's silu.
#include "core/cpu/kernels.h"

#include "core/math.h"

namespace tpt::cpu {

void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = inp + n * 2 * F;
    const float* u = g + F;
    float* y = out + n * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) y[f] = silu(g[f]) * u[f];
  }
}

void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = inp + n * 2 * F;
    const float* u = g + F;
    const float* dy = dout + n * F;
    float* dg = dinp + n * 2 * F;
    float* du = dg + F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      dg[f] = dy[f] * u[f] * silu_grad(g[f]);
      du[f] = dy[f] * silu(g[f]);
    }
  }
}

}  // namespace tpt::cpu
