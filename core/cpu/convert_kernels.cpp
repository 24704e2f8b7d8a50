// The CPU backend's dtype staging and column sums (core/cpu/kernels.h): 16-bit tensors as fp32 and
// back (rounded to nearest even), and the column sums of the norms' and biases' gradients.
#include <algorithm>
#include <cstring>

#include "core/cpu/kernels.h"
#include "core/dtype.h"

namespace tpt::cpu {

// Column sums of x (N, C) added into out (C), parallel over column blocks.
void add_column_sums(float* out, const float* x, int64_t N, int64_t C) {
  constexpr int64_t kBlock = 256;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    int64_t c1 = std::min(C, c0 + kBlock);
    float acc[kBlock] = {0};
    for (int64_t n = 0; n < N; ++n) {
      const float* row = x + n * C;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
    }
    for (int64_t c = c0; c < c1; ++c) out[c] += acc[c - c0];
  }
}

// n elements of src (dtype t) as fp32 into dst, and back (rounded to t).
void load_f32(float* dst, const void* src, DType t, int64_t n) {
  if (t == DType::F32) {
    if (dst != src) std::memcpy(dst, src, size_t(n) * sizeof(float));
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(src);
  if (t == DType::BF16) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
  }
}

void store_f32(void* dst, DType t, const float* src, int64_t n) {
  if (t == DType::F32) {
    if (dst != src) std::memcpy(dst, src, size_t(n) * sizeof(float));
    return;
  }
  uint16_t* h = static_cast<uint16_t*>(dst);
  if (t == DType::BF16) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
  }
}

}  // namespace tpt::cpu
