// The CPU backend's Mixture-of-Experts row movement (core/ops.h gather_rows, combine_rows, row_dots)
// on fp32 rows: one output row per loop iteration, its terms added in index order.
#include <cstring>

#include "core/cpu/kernels.h"

namespace tpt::cpu {

void gather_rows(float* out, const float* in, const int32_t* idx, const float* scale, int64_t R, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    float* o = out + r * C;
    if (idx[r] < 0) {
      std::memset(o, 0, size_t(C) * sizeof(float));
      continue;
    }
    const float* x = in + int64_t(idx[r]) * C;
    const float s = scale ? scale[r] : 1.0f;
    for (int64_t c = 0; c < C; ++c) o[c] = scale ? s * x[c] : x[c];
  }
}

void combine_rows(float* out, const float* in, const int32_t* idx, const float* w, int64_t N, int64_t K, int64_t C,
                  bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    float* o = out + t * C;
    if (!accumulate) std::memset(o, 0, size_t(C) * sizeof(float));
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = idx[t * K + j];
      if (r < 0) continue;
      const float* x = in + int64_t(r) * C;
      const float s = w ? w[t * K + j] : 1.0f;
      for (int64_t c = 0; c < C; ++c) o[c] += s * x[c];
    }
  }
}

void row_dots(float* out, const float* a, const float* b, const int32_t* idx, int64_t N, int64_t K, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = idx[t * K + j];
      float s = 0;
      if (r >= 0)
        for (int64_t c = 0; c < C; ++c) s += a[t * C + c] * b[int64_t(r) * C + c];
      out[t * K + j] = s;
    }
}

}  // namespace tpt::cpu
