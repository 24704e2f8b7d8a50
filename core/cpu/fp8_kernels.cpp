// The CPU backend's FP8 kernels (core/cpu/kernels.h; docs/FP8.md): the quantization of core/fp8.h's
// scalar rules over a tensor (one scale, or a power-of-two scale per block) and the operands' decoding
// for the emulated FP8 GEMMs (a table of the 256 codes times the scale_inv, fp32).
#include <algorithm>

#include "core/cpu/kernels.h"
#include "core/error.h"
#include "core/fp8.h"

namespace tpt::cpu {

void fp8_quantize(uint8_t* out, uint8_t* out_t, const float* x, int64_t rows, int64_t cols, Fp8Type t, float scale,
                  float* amax) {
  const int64_t n = rows * cols;
  uint32_t m = fp8_abs_bits(*amax);
  if (!out && !out_t) {  // the amax alone
#pragma omp parallel for reduction(max : m) schedule(static)
    for (int64_t i = 0; i < n; ++i) m = std::max(m, fp8_abs_bits(x[i]));
  } else if (!out_t) {
#pragma omp parallel for reduction(max : m) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      out[i] = fp32_to_fp8(x[i] * scale, t);
      m = std::max(m, fp8_abs_bits(x[i]));
    }
  } else {
#pragma omp parallel for reduction(max : m) schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float v = x[r * cols + c];
        const uint8_t q = fp32_to_fp8(v * scale, t);
        if (out) out[r * cols + c] = q;
        out_t[c * rows + r] = q;
        m = std::max(m, fp8_abs_bits(v));
      }
  }
  *amax = bits_to_float(m);
}

void fp8_quantize_blocks(uint8_t* out, const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Type t,
                         int margin, float* scale_inv, bool transposed) {
  TPT_CHECK(br > 0 && bc > 0);
  const int64_t gc = (cols + bc - 1) / bc, blocks = (rows + br - 1) / br * gc;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t r0 = b / gc * br, c0 = b % gc * bc, r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
    float amax = 0.0f;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) amax = fp8_amax_step(amax, x[r * cols + c]);
    const float s = fp8_block_scale(amax, t, margin);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c)
        out[transposed ? c * rows + r : r * cols + c] = fp32_to_fp8(x[r * cols + c] * s, t);
    scale_inv[b] = 1.0f / s;
  }
}

void fp8_dequantize(float* out, const Fp8Operand& x, int64_t n) {
  TPT_CHECK(x.codes && x.scale_inv);
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = fp8_to_fp32(uint8_t(c), x.t);
  const uint8_t* q = x.codes;
  if (x.block_rows > 0) {  // each element times its block's scale_inv
    const int64_t cols = x.cols, gc = (cols + x.block_cols - 1) / x.block_cols;
    TPT_CHECK(cols > 0 && n % cols == 0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = table[q[i]] * x.scale_inv[i / cols / x.block_rows * gc + i % cols / x.block_cols];
    return;
  }
  const float s = *x.scale_inv;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = table[q[i]] * s;
}

}  // namespace tpt::cpu
