// FP8 numerics shared by the CPU emulation and the CUDA kernels (docs/FP8.md): the two OCP formats
// as Hopper stores them, conversion from fp32 with round-to-nearest-even and saturation to +-max
// (cvt.rn.satfinite), and Transformer Engine's scaling rules -- the scale from an amax, and delayed
// scaling's amax history.
//   E4M3 (fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity, NaN S.1111.111; max 448,
//              smallest subnormal 2^-9.
//   E5M2:      1 sign, 5 exponent (bias 15), 2 mantissa bits; max 57344, smallest subnormal 2^-16.
// From fp32: a NaN gives S.1111111 (0x7F / 0xFF: a NaN in both formats), +-inf and every value beyond
// max saturate to +-max, values below the smallest subnormal's half round to a signed zero.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace tpt {

enum class Fp8Type : uint8_t { E4M3, E5M2 };

TPT_HOST_DEVICE inline int fp8_mantissa_bits(Fp8Type t) { return t == Fp8Type::E4M3 ? 3 : 2; }
TPT_HOST_DEVICE inline int fp8_bias(Fp8Type t) { return t == Fp8Type::E4M3 ? 7 : 15; }
TPT_HOST_DEVICE inline float fp8_max(Fp8Type t) { return t == Fp8Type::E4M3 ? 448.0f : 57344.0f; }
TPT_HOST_DEVICE inline uint8_t fp8_max_code(Fp8Type t) { return t == Fp8Type::E4M3 ? 0x7E : 0x7B; }

// fp32 -> fp8 bits, round to nearest even on the fp32 bit pattern (no double rounding), saturating.
TPT_HOST_DEVICE inline uint8_t fp32_to_fp8(float f, Fp8Type t) {
  const uint32_t u = float_to_bits(f), a = u & 0x7FFFFFFFu;
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  if (a > 0x7F800000u) return uint8_t(sign | 0x7F);  // NaN
  const int M = fp8_mantissa_bits(t), B = fp8_bias(t);
  const int e = int(a >> 23) - 127;  // fp32's unbiased exponent (-127 for its zero and subnormals)
  uint32_t code;
  if (e >= 1 - B) {  // an fp8 normal (or beyond max): drop 23 - M mantissa bits, a carry bumps the exponent
    const int s = 23 - M;
    const uint32_t r = (a + (1u << (s - 1)) - 1u + ((a >> s) & 1u)) >> s;
    const uint32_t rebias = uint32_t(127 - B) << M;
    code = r - rebias;
    if (a >= 0x7F800000u || code > fp8_max_code(t)) code = fp8_max_code(t);  // saturate (inf too)
  } else {  // an fp8 subnormal: the significand in units of 2^(1 - B - M), rounded to even
    const int s = 23 + (1 - B - M) - e;  // >= 21
    const uint32_t m = (a >> 23) ? (a & 0x7FFFFFu) | 0x800000u : 0u;  // fp32 subnormals are far below
    code = s > 24 ? 0u : (m + (1u << (s - 1)) - 1u + ((m >> s) & 1u)) >> s;  // may round up to the min normal
  }
  return uint8_t(sign | code);
}

// fp8 bits -> fp32 (exact)
TPT_HOST_DEVICE inline float fp8_to_fp32(uint8_t c, Fp8Type t) {
  const int M = fp8_mantissa_bits(t), B = fp8_bias(t), E = 7 - M;
  const int e = (c >> M) & ((1 << E) - 1), m = c & ((1 << M) - 1);
  const float sign = (c & 0x80) ? -1.0f : 1.0f;
  if (t == Fp8Type::E4M3 && e == 15 && m == 7) return NAN;
  if (t == Fp8Type::E5M2 && e == 31) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * ldexpf(float(m), 1 - B - M);
  return sign * ldexpf(float((1 << M) + m), e - B - M);
}

TPT_HOST_DEVICE inline bool fp8_finite(float x) { return (float_to_bits(x) & 0x7F800000u) != 0x7F800000u; }

// ---- scaling (Transformer Engine): x is stored as fp8(x * scale) and read as fp8 value * scale_inv.

// The scale for an amax: (fp8_max / amax) / 2^margin in fp32, capped at FLT_MAX; an amax of 0, inf or
// nan gives no information and keeps `previous` (delayed scaling's last scale; 1 for a tensor's own).
TPT_HOST_DEVICE inline float fp8_scale_from_amax(float amax, float previous, Fp8Type t, int margin) {
  if (!(amax > 0.0f) || !fp8_finite(amax)) return previous;
  const float s = (fp8_max(t) / amax) / ldexpf(1.0f, margin);
  return fp8_finite(s) ? s : FLT_MAX;
}

// Blockwise scaling's scale of one block (Transformer Engine's Float8BlockScaling, DeepSeek-V3): the
// scale for its amax as above (an amax of 0, inf or nan: 1), then truncated to a power of two (the
// mantissa bits zeroed: TE's default), so that x * scale and its inverse are exact; FLT_MAX -> 2^127.
TPT_HOST_DEVICE inline float fp8_block_scale(float amax, Fp8Type t, int margin) {
  return bits_to_float(float_to_bits(fp8_scale_from_amax(amax, 1.0f, t, margin)) & 0xFF800000u);
}

// The amax a tensor contributes: max |x| as the larger bit pattern of |x| (for values >= 0 the order of
// the bits is the order of the values, and a NaN's bits are above inf's), so a NaN anywhere makes the
// amax a NaN, and the CUDA kernel's atomicMax on the bits gives the same amax bit for bit. amax >= 0.
TPT_HOST_DEVICE inline uint32_t fp8_abs_bits(float x) { return float_to_bits(x) & 0x7FFFFFFFu; }
TPT_HOST_DEVICE inline float fp8_amax_step(float amax, float x) {
  const uint32_t a = fp8_abs_bits(amax), b = fp8_abs_bits(x);
  return bits_to_float(a > b ? a : b);
}

// Delayed scaling's state of one GEMM input (Transformer Engine's order): the step quantizes with
// `scale` (the previous update's), records its amax in history[0] (the max over the quantizations of
// the step: micro-batches, recompute), and after the step's amax reduction update() takes the amax of
// the history (max, or most_recent = history[0]), sets the scale from it, then rolls the history by
// one (history[i] = history[i + 1], history[len - 1] = the old history[0]) and zeroes history[0] for
// the next step, as TE's _update_amax_history.
struct Fp8ScaleState {
  float scale = 1.0f;
  float scale_inv = 1.0f;
  TPT_HOST_DEVICE void record(float* history, float amax) const { history[0] = fp8_amax_step(history[0], amax); }
  TPT_HOST_DEVICE void update(float* history, int len, bool algo_max, Fp8Type t, int margin) {
    float amax = history[0];
    if (algo_max)
      for (int i = 1; i < len; ++i) amax = (amax != amax || history[i] != history[i]) ? NAN : fmaxf(amax, history[i]);
    scale = fp8_scale_from_amax(amax, scale, t, margin);
    scale_inv = 1.0f / scale;
    const float first = history[0];
    for (int i = 0; i + 1 < len; ++i) history[i] = history[i + 1];
    history[len - 1] = first;
    history[0] = 0.0f;
  }
};

}  // namespace tpt
