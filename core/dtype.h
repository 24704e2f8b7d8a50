// Per-element conversions between fp32 and the 16-bit float formats (bf16, fp16), shared by the
// CPU and CUDA backends (docs/ARCHITECTURE.md "Backends and communicators": per-element math in __host__ __device__ inline
// functions). All conversions from fp32 round to nearest, ties to even (but the master weights'
// bf16 compute copy, master_to_bf16: ties away from zero); infinities keep their
// sign, NaNs stay (quiet) NaNs with their sign, and subnormals are produced and read exactly.
// The 16-bit values travel as their raw bit patterns (uint16_t).
#pragma once
#include <cstdint>
#include <cstring>

#ifndef TPT_HOST_DEVICE  // also defined, identically, by core/math.h
#if defined(__CUDACC__)
#define TPT_HOST_DEVICE __host__ __device__
#else
#define TPT_HOST_DEVICE
#endif
#endif

namespace tpt {

TPT_HOST_DEVICE inline uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

TPT_HOST_DEVICE inline float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// ---- bf16: 1 sign, 8 exponent, 7 mantissa bits (the top half of an fp32) ----

TPT_HOST_DEVICE inline uint16_t fp32_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)                  // NaN: keep sign, force the quiet bit
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // (a payload only in the low bits would vanish)
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest even; overflow carries into the
  // exponent, which correctly rounds the largest finite values up to infinity.
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

TPT_HOST_DEVICE inline float bf16_to_fp32(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// ---- an fp32 master weight as its bf16 compute copy plus a 16-bit remainder ----
// (optimizer.store_param_remainders, Apex's param remainders.) The compute copy is the master's top
// half rounded to nearest, ties away from zero (+1 when the low half is >= 0x8000); the remainder
// is the low half. A 16-bit remainder can invert only a rounding whose every bf16 value has
// exactly 2^16 fp32 preimages, which ties-to-even is not (an even value has 2^16 + 1), so the
// bf16 compute copy of the master weights rounds this way in every bf16 run (core/ops.h
// "master copy"): with or without remainders the weights compute uses are the same. Exact for
// every finite value and infinity (the largest finite values round to infinity, as to even); a NaN
// master gives a NaN of its sign (quiet bit forced) and merges back to a NaN of that sign.
TPT_HOST_DEVICE inline uint16_t master_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u >> 16) + ((u >> 15) & 1u));
}
TPT_HOST_DEVICE inline uint16_t master_remainder(float f) { return static_cast<uint16_t>(float_to_bits(f) & 0xFFFFu); }
// The master weight of (master_to_bf16(f), master_remainder(f)): f itself (NaN: a NaN).
TPT_HOST_DEVICE inline float master_from_remainder(uint16_t bf16, uint16_t remainder) {
  const uint32_t top = static_cast<uint16_t>(bf16 - (remainder >> 15));  // undo the round-up
  return bits_to_float((top << 16) | remainder);
}

// ---- fp16 (IEEE binary16): 1 sign, 5 exponent, 10 mantissa bits; max 65504, min subnormal 2^-24 ----

TPT_HOST_DEVICE inline uint16_t fp32_to_fp16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;  // |f|
  if (a >= 0x7F800000u) {              // inf or NaN
    if (a == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // quiet NaN, top payload bits
  }
  if (a >= 0x477FF000u)  // >= 65520 = halfway between 65504 and 2^16: ties-to-even rounds up to inf
    return static_cast<uint16_t>(sign | 0x7C00u);
  if (a >= 0x38800000u) {  // >= 2^-14: normal fp16. Rebias the exponent (127 -> 15), then round.
    const uint32_t r = a - 0x38000000u;
    return static_cast<uint16_t>(sign | ((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13));
  }
  if (a <= 0x33000000u)  // <= 2^-25 (half the smallest subnormal): ties-to-even rounds to zero
    return static_cast<uint16_t>(sign);
  // Subnormal fp16: the value in units of 2^-24, rounded to nearest even. The result may round up
  // to 0x400, which is exactly the encoding of the smallest normal number.
  const uint32_t exponent = a >> 23;                     // 102..112 here
  const uint32_t mantissa = (a & 0x7FFFFFu) | 0x800000u;  // with the implicit bit
  const uint32_t shift = 126u - exponent;                // 14..24
  uint32_t q = mantissa >> shift;
  const uint32_t rem = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

TPT_HOST_DEVICE inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float v = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -v : v;
  }
  if (exponent == 0x1Fu) return bits_to_float(sign | 0x7F800000u | (mantissa << 13));  // inf / NaN
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// fp32 -> 16-bit -> fp32: the value a bf16 / fp16 tensor would store.
TPT_HOST_DEVICE inline float round_to_bf16(float f) { return bf16_to_fp32(fp32_to_bf16(f)); }
TPT_HOST_DEVICE inline float round_to_fp16(float f) { return fp16_to_fp32(fp32_to_fp16(f)); }

// The element type of a buffer. A run's compute dtype (training.precision) is F32, BF16 or F16:
// what parameters used in compute, activations, pipeline messages and activation gradients are
// stored as (master weights, weight gradients and optimizer state are always fp32). F64, I32 and
// I64 are the further types the communicators carry (parallel/comm.h: losses and flags in double,
// token counts in int64), and U8 the bytes they move (FP8 codes: sequence parallelism's gathers of
// FP8 layers' inputs, model/fp8_linear.h).
enum class DType { F32, BF16, F16, F64, I32, I64, U8 };

inline int dtype_bytes(DType t) {
  switch (t) {
    case DType::U8: return 1;
    case DType::BF16:
    case DType::F16: return 2;
    case DType::F32:
    case DType::I32: return 4;
    case DType::F64:
    case DType::I64: return 8;
  }
  return 4;
}

// Rounds x to the nearest value representable in the storage type t (nearest-even; fp16 overflow
// gives inf); F32 (and the non-storage types) leave x as it is.
TPT_HOST_DEVICE inline float round_to(float x, DType t) {
  return t == DType::BF16 ? round_to_bf16(x) : t == DType::F16 ? round_to_fp16(x) : x;
}

// The bits of master weight f's 16-bit compute copy: bf16 as master_to_bf16, fp16 to nearest even.
TPT_HOST_DEVICE inline uint16_t master_copy_bits(float f, DType t) {
  return t == DType::BF16 ? master_to_bf16(f) : fp32_to_fp16(f);
}

}  // namespace tpt
