// fp32 kernels of RMSNorm, SwiGLU, RoPE and the grouped-query QKV regroup (core/cpu/llama_kernels.h).
#include "core/cpu/kernels.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/math.h"

namespace tpt::cpu {

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

void qkv_regroup(float* out, const float* in, int64_t N, int64_t G, int64_t Q, int64_t D, bool to_heads) {
  const int64_t W = G * (Q + 2) * D;  // the row width of both layouts
  const size_t bytes = size_t(D) * sizeof(float);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* src = in + n * W;
    float* dst = out + n * W;
    for (int64_t g = 0; g < G; ++g)
      for (int64_t j = 0; j < Q + 2; ++j) {
        const int64_t grouped = (g * (Q + 2) + j) * D;
        // heads: query head g Q + j, or key g (after the G Q queries), or value g (after the G keys)
        const int64_t heads = (j < Q ? g * Q + j : j == Q ? G * Q + g : G * Q + G + g) * D;
        if (to_heads) std::memcpy(dst + heads, src + grouped, bytes);
        else std::memcpy(dst + grouped, src + heads, bytes);
      }
  }
}

void rope(float* qkv, const float* inv_freq, const int32_t* positions, int64_t N, int64_t S, int64_t H, int64_t KV,
          int64_t D, int64_t rot, bool interleaved, bool inverse) {
  const int64_t W = (H + 2 * KV) * D, half = rot / 2;
#pragma omp parallel
  {
    std::vector<float> cs(size_t(2 * half));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float pos = float(positions ? positions[n] : n % S);
      for (int64_t j = 0; j < half; ++j) {
        const float angle = pos * inv_freq[j];
        cs[size_t(j)] = std::cos(angle);
        cs[size_t(half + j)] = inverse ? -std::sin(angle) : std::sin(angle);
      }
      for (int64_t h = 0; h < H + KV; ++h) {  // the query heads, then the key heads
        float* x = qkv + n * W + h * D;
        for (int64_t j = 0; j < half; ++j) {
          float& x0 = interleaved ? x[2 * j] : x[j];
          float& x1 = interleaved ? x[2 * j + 1] : x[j + half];
          rope_rotate(x0, x1, cs[size_t(j)], cs[size_t(half + j)]);
        }
      }
    }
  }
}

}  // namespace tpt::cpu
