// fp32 kernels on the QKV projection's output (core/cpu/kernels.h): the grouped-query regroup (a
// permutation of whole heads) and RoPE (in place on the query and key heads).
#include "core/cpu/kernels.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/math.h"

namespace tpt::cpu {

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
