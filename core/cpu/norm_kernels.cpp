// fp32 LayerNorm and RMSNorm, forward and backward (core/cpu/kernels.h): row sums in double, the
// weight (and bias) gradients as per-thread partials summed in thread order (deterministic for a
// thread count).
#include "core/cpu/kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace tpt::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                       int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += x[c];
    float m = float(s / C);
    double v = 0;
    for (int64_t c = 0; c < C; ++c) {
      float d = x[c] - m;
      v += double(d) * d;
    }
    float r = float(1.0 / std::sqrt(v / C + eps));
    float* y = out + n * C;
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C, int threads) {
  const int nt = std::max(1, threads);
  std::vector<float> part(size_t(nt) * 2 * C, 0.0f);
#pragma omp parallel num_threads(nt)
  {
    float* pdw = part.data() + size_t(omp_get_thread_num()) * 2 * C;
    float* pdb = pdw + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      float m = mean[n], r = rstd[n];
      double sum_dn = 0, sum_dn_n = 0;
      for (int64_t c = 0; c < C; ++c) {
        float nc = (x[c] - m) * r;
        float dn = dy[c] * w[c];
        sum_dn += dn;
        sum_dn_n += double(dn) * nc;
      }
      float mean_dn = float(sum_dn / C), mean_dn_n = float(sum_dn_n / C);
      float* dx = dinp + n * C;
      for (int64_t c = 0; c < C; ++c) {
        float nc = (x[c] - m) * r;
        float dn = dy[c] * w[c];
        dx[c] += (dn - mean_dn - nc * mean_dn_n) * r;
        pdw[c] += dy[c] * nc;
        pdb[c] += dy[c];
      }
    }
  }
  for (int t = 0; t < nt; ++t) {
    const float* pdw = part.data() + size_t(t) * 2 * C;
    for (int64_t c = 0; c < C; ++c) {
      dw[c] += pdw[c];
      db[c] += pdw[C + c];
    }
  }
}


void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C, float eps,
                     int) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[c]) * x[c];
    const float r = float(1.0 / std::sqrt(ss / double(C) + double(eps)));
    float* y = out + n * C;
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * r * w[c];
    rstd[n] = r;
  }
}

// y = x r w with r = (mean(x^2) + eps)^-1/2: dx = r (w dy) - x r^3 mean(x w dy), dw = sum dy x r.
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int64_t N, int64_t C, int threads) {
  const int nt = std::max(1, threads);
  std::vector<float> part(size_t(nt) * size_t(C), 0.0f);
#pragma omp parallel num_threads(nt)
  {
    float* pdw = part.data() + size_t(omp_get_thread_num()) * size_t(C);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      const float r = rstd[n];
      double dot = 0;
      for (int64_t c = 0; c < C; ++c) dot += double(dy[c]) * w[c] * x[c];
      const float k = float(dot / double(C)) * r * r * r;
      float* dx = dinp + n * C;
      for (int64_t c = 0; c < C; ++c) {
        dx[c] += dy[c] * w[c] * r - x[c] * k;
        pdw[c] += dy[c] * x[c] * r;
      }
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int64_t c = 0; c < C; ++c) dw[c] += part[size_t(t) * size_t(C) + size_t(c)];
}

}  // namespace tpt::cpu
