// Checks of 16-bit storage and bitwise equality shared by the Ops unit tests (llama_ops_test.cpp,
// attention_gqa_test.cpp), next to tests/common/gradcheck.h's finite differences.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/ops.h"
#include "tests/common/gradcheck.h"

namespace tpt::test {

using VecH = std::vector<uint16_t>;  // bf16 storage

// Bit-for-bit equality of two float vectors, reporting the first differences.
inline void expect_bitwise(const VecF& got, const VecF& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (not bit for bit)";
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " elements differ";
}

// bf16 storage: the values rounded (nearest even), back to fp32, and the check that a bf16 result is
// the fp32 result rounded once -- within half a bf16 ulp of it, and (the CPU rounds exactly once
// where it stores) exactly its rounding.
inline VecH to_bf16(const VecF& v) {
  VecH h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = fp32_to_bf16(v[i]);
  return h;
}
inline VecF from_bf16(const VecH& h) {
  VecF v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = bf16_to_fp32(h[i]);
  return v;
}
inline VecF round_bf16(const VecF& v) { return from_bf16(to_bf16(v)); }
inline Buf bf(VecH& h) { return Buf(h.data(), DType::BF16); }
inline CBuf cbf(const VecH& h) { return CBuf(h.data(), DType::BF16); }

inline void expect_bf16_rounding_of(const VecH& got, const VecF& f32, const std::string& what) {
  ASSERT_EQ(got.size(), f32.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    const float g = bf16_to_fp32(got[i]);
    // half an ulp of bf16 (8 significant bits) at f32[i]'s binade
    const double half_ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(f32[i]), 1e-30f)) - 8);
    const bool within = std::fabs(double(g) - double(f32[i])) <= half_ulp;
    if ((!within || got[i] != fp32_to_bf16(f32[i])) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: bf16 " << g << ", fp32 " << f32[i] << " rounds to "
                    << bf16_to_fp32(fp32_to_bf16(f32[i]));
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << f32.size() << " elements are not the fp32 result rounded";
}

}  // namespace tpt::test
