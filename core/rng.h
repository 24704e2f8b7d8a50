// Counter-based random numbers (Philox4x32-10): every value is a pure function of
// (seed, stream, index), so every parallel layout draws the same number for the same global
// element. stream is a hash of a name (a parameter's global name, a dropout site).
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

#include "core/math.h"  // TPT_HOST_DEVICE

namespace tpt {

struct Philox4 {
  uint32_t v[4];
};

TPT_HOST_DEVICE inline Philox4 philox4x32_10(uint64_t counter_hi, uint64_t counter_lo, uint64_t key) {
  uint32_t c0 = uint32_t(counter_lo), c1 = uint32_t(counter_lo >> 32);
  uint32_t c2 = uint32_t(counter_hi), c3 = uint32_t(counter_hi >> 32);
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// FNV-1a 64-bit: a stable stream id from a name.
inline uint64_t stream_id(std::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

// Uniform in (0, 1] from 32 random bits.
TPT_HOST_DEVICE inline double uniform_open0(uint32_t a, uint32_t b) {
  uint64_t x = (uint64_t(a) << 21) ^ uint64_t(b >> 11);  // 53 bits
  x &= (uint64_t(1) << 53) - 1;
  return (double(x) + 1.0) * (1.0 / 9007199254740992.0);
}

// Standard normal for element `index` of stream `stream` under `seed` (Box-Muller, double math).
TPT_HOST_DEVICE inline float normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
  Philox4 r = philox4x32_10(stream, index, seed);
  double u1 = uniform_open0(r.v[0], r.v[1]);
  double u2 = uniform_open0(r.v[2], r.v[3]);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925 * u2));
}

// Uniform in [0, 1) for element `index` (dropout masks).
TPT_HOST_DEVICE inline float uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  Philox4 r = philox4x32_10(stream, index, seed);
  return float(r.v[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace tpt
