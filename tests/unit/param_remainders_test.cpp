// optimizer.store_param_remainders (core/dtype.h): the fp32 master weight as its bf16 compute copy
// plus a 16-bit remainder. The split merges back to the same bits for every finite value and
// infinity; the compute copy is the nearest bf16 value, ties away from zero, against a rounding
// computed in double; and the CPU backend's AdamW over remainders moves the weights bit for bit as
// AdamW over fp32 master weights with a bf16 compute copy does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/math.h"
#include "core/ops.h"

namespace tpt {
namespace {

bool is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

// The bf16 value nearest to x, ties away from zero, in double: the two bf16 neighbours of x's
// magnitude by truncation (the upper one with an unbounded exponent: 2^128 past the largest
// finite), then compare distances. Returns the bf16 bits (2^128 -> infinity).
uint16_t nearest_bf16_ties_away(uint32_t u) {
  const uint32_t sign = u & 0x80000000u, a = u & 0x7FFFFFFFu;
  if (a == 0x7F800000u) return uint16_t(u >> 16);  // infinity is itself
  const uint32_t down = a & 0xFFFF0000u;
  const double x = double(bits_to_float(a)), lo = double(bits_to_float(down));
  const double hi = down == 0x7F7F0000u ? std::ldexp(1.0, 128) : double(bits_to_float(down + 0x10000u));
  const uint32_t pick = (x - lo < hi - x) ? down : down + 0x10000u;  // a tie (x - lo == hi - x) goes up
  return uint16_t((sign | pick) >> 16);
}

void check_bits(uint32_t u) {
  const float f = bits_to_float(u);
  const uint16_t c = master_to_bf16(f), r = master_remainder(f);
  const uint32_t back = float_to_bits(master_from_remainder(c, r));
  if (is_nan_bits(u)) {
    ASSERT_TRUE(is_nan_bits(uint32_t(c) << 16)) << std::hex << u;  // the compute copy: a NaN
    ASSERT_TRUE(is_nan_bits(back)) << std::hex << u;
    ASSERT_EQ(back >> 31, u >> 31) << std::hex << u;  // of the same sign
    return;
  }
  ASSERT_EQ(back, u) << std::hex << u;
  ASSERT_EQ(c, nearest_bf16_ties_away(u)) << std::hex << u;
  // everywhere but at an exact tie the nearest-even rounding of every other bf16 conversion
  if ((u & 0xFFFFu) != 0x8000u) {
    ASSERT_EQ(c, fp32_to_bf16(f)) << std::hex << u;
  }
}

TEST(ParamRemainders, EdgeValues) {
  const uint32_t edges[] = {
      0x00000000u, 0x80000000u,                // +0, -0
      0x00000001u, 0x80000001u, 0x00007FFFu,   // the smallest denormals
      0x00008000u, 0x00018000u, 0x0000FFFFu,   // denormal ties (even and odd top) and round-ups
      0x007FFFFFu, 0x807FFFFFu, 0x007F8000u,   // the largest denormals: round up into the normals
      0x7F800000u, 0xFF800000u,                // +-inf
      0x7FC00000u, 0xFFC00000u, 0x7F800001u,   // NaNs: quiet, negative, signalling with low bits only
      0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FFF8000u,   // NaNs whose top half + 1 would wrap
      0x3F7FFFFFu, 0x3FFFFFFFu, 0xBF7FFFFFu,   // the round-up carries into the exponent (1.0, 2.0, -1.0)
      0x3F808000u, 0x3F818000u,                // ties: even top (nearest-even would stay), odd top
      0x7F7F7FFFu, 0x7F7F8000u, 0x7F7FFFFFu,   // near the largest finite: the tie and above round to inf
      0xFF7F8000u, 0x3F80FFFFu, 0x3F807FFFu,
  };
  for (uint32_t u : edges) check_bits(u);
  // the documented cases by value
  EXPECT_EQ(master_to_bf16(bits_to_float(0x3F7FFFFFu)), 0x3F80);  // carries to 1.0
  EXPECT_EQ(master_to_bf16(bits_to_float(0x7F7FFFFFu)), 0x7F80);  // the largest finite rounds to inf ...
  EXPECT_EQ(master_from_remainder(0x7F80, master_remainder(bits_to_float(0x7F7FFFFFu))), bits_to_float(0x7F7FFFFFu));
  EXPECT_EQ(master_to_bf16(bits_to_float(0x3F808000u)), 0x3F81);  // a tie goes away from zero
  EXPECT_EQ(fp32_to_bf16(bits_to_float(0x3F808000u)), 0x3F80);    // (nearest-even would keep 0x3F80)
}

TEST(ParamRemainders, EveryTopHalfWithEdgeAndRandomLowHalves) {
  std::mt19937 gen(17);
  std::vector<uint32_t> lows = {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFEu, 0xFFFFu};
  for (int i = 0; i < 25; ++i) lows.push_back(gen() & 0xFFFFu);
  for (uint32_t top = 0; top <= 0xFFFFu; ++top)
    for (uint32_t low : lows) check_bits((top << 16) | low);
}

// AdamW on 4096 weights for 6 steps: remainders (master = compute bits + low half) against fp32
// master weights with a bf16 compute copy, in two segments (decay and not), sharded indexing:
// weights, compute copies and moments bitwise equal. Weights start on ties and next to them.
TEST(ParamRemainders, AdamWBitwiseAsFp32MasterWeights) {
  const int64_t n = 4096;
  std::mt19937 gen(3);
  std::normal_distribution<float> nd;
  std::vector<float> master(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = float_to_bits(nd(gen) * 0.05f);
    if (i % 4 == 0) u = (u & 0xFFFF0000u) | 0x8000u;  // an exact tie
    if (i % 4 == 1) u = (u & 0xFFFF0000u) | 0x7FFFu;
    master[size_t(i)] = bits_to_float(u);
  }
  master[0] = 0.0f;
  master[1] = -0.0f;
  master[2] = bits_to_float(0x00000001u);  // a denormal
  std::vector<uint16_t> c32(static_cast<size_t>(n)), c16(static_cast<size_t>(n)), rem(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    c32[size_t(i)] = master_to_bf16(master[size_t(i)]);
    c16[size_t(i)] = master_to_bf16(master[size_t(i)]);
    rem[size_t(i)] = master_remainder(master[size_t(i)]);
  }
  std::vector<float> m1(static_cast<size_t>(n), 0.0f), v1(static_cast<size_t>(n), 0.0f), m2 = m1, v2 = v1;
  auto ops = make_cpu_ops(2);
  // the owned arrays (master, moments) indexed by local: the second segment's elements come first
  const std::vector<TensorSegment> segs = {{0, 2048, 2048, true}, {2048, 0, 2048, false}};
  std::vector<float> master_local(static_cast<size_t>(n));
  for (const TensorSegment& s : segs)
    for (int64_t i = 0; i < s.n; ++i) master_local[size_t(s.local + i)] = master[size_t(s.offset + i)];
  std::vector<uint16_t> rem_local(static_cast<size_t>(n));
  for (const TensorSegment& s : segs)
    for (int64_t i = 0; i < s.n; ++i) rem_local[size_t(s.local + i)] = rem[size_t(s.offset + i)];
  const AdamWBuffers fp32{master_local.data(), true, g.data(), m1.data(), v1.data(), Buf(c32.data(), DType::BF16)};
  const AdamWBuffers remainders{nullptr, true, g.data(), m2.data(), v2.data(), Buf(c16.data(), DType::BF16),
                                rem_local.data()};
  for (int step = 1; step <= 6; ++step) {
    for (float& x : g) x = nd(gen) * (step == 3 ? 0.0f : 1.0f);  // a zero gradient too
    const AdamWParams a{1e-3f * float(step), 0.9f, 0.95f, 1e-8f, 0.1f, float(1 - std::pow(0.9, step)),
                        float(1 - std::pow(0.95, step)), float(1.0 - 0.9), float(1.0 - 0.95)};
    ops->adamw_segments(fp32, segs, a, 0.75f);
    ops->adamw_segments(remainders, segs, a, 0.75f);
    for (const TensorSegment& s : segs)
      for (int64_t i = 0; i < s.n; ++i) {
        const size_t off = size_t(s.offset + i), loc = size_t(s.local + i);
        ASSERT_EQ(c16[off], c32[off]) << "step " << step << " element " << off;
        ASSERT_EQ(float_to_bits(master_from_remainder(c16[off], rem_local[loc])), float_to_bits(master_local[loc]))
            << "step " << step << " element " << off;
        ASSERT_EQ(float_to_bits(m2[loc]), float_to_bits(m1[loc]));
        ASSERT_EQ(float_to_bits(v2[loc]), float_to_bits(v1[loc]));
      }
  }
  // and the weights moved: a test that does nothing would pass the above too
  int moved = 0;
  for (int64_t i = 0; i < n; ++i) moved += c32[size_t(i)] != master_to_bf16(master[size_t(i)]);
  EXPECT_GT(moved, n / 2);
}

}  // namespace
}  // namespace tpt
