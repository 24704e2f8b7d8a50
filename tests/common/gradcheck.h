// The helpers of the Ops gradient checks (tests/unit/gradcheck_test.cpp, llama_ops_test.cpp): the CPU
// backend with two threads, random vectors, dot products, central finite differences in float and in
// double, and the elementwise closeness rule.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/ops.h"

namespace tpt::test {

using VecF = std::vector<float>;
using VecD = std::vector<double>;

// Two threads so the per-thread partial sums of the CPU backend are exercised.
inline Ops& cpu() {
  static std::unique_ptr<Ops> ops = make_cpu_ops(2);
  return *ops;
}

inline VecF randn(size_t n, uint32_t seed, float std = 1.0f, float mean = 0.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(mean, std);
  VecF v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline VecD to_d(const VecF& v) { return VecD(v.begin(), v.end()); }

inline double dot(const VecF& a, const VecF& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}
inline double dot(const VecD& a, const VecF& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline double max_abs(const VecD& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Central differences of J (evaluated in float by the op's forward) with respect to every element
// of x. The actual step (after rounding x +- h to float) is used as the denominator.
inline VecD fd_float(VecF& x, float h, const std::function<double()>& J) {
  VecD g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float old = x[i];
    const float xp = old + h, xm = old - h;
    x[i] = xp;
    const double jp = J();
    x[i] = xm;
    const double jm = J();
    x[i] = old;
    g[i] = (jp - jm) / (double(xp) - double(xm));
  }
  return g;
}

// Central differences in double of a double-precision objective.
inline VecD fd_double(VecD& x, double h, const std::function<double()>& J) {
  VecD g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double old = x[i];
    x[i] = old + h;
    const double jp = J();
    x[i] = old - h;
    const double jm = J();
    x[i] = old;
    g[i] = (jp - jm) / (2 * h);
  }
  return g;
}

// |got - want| <= rtol * (|want| + floor * max|want|) elementwise: relative, with a small absolute
// floor relative to the tensor's largest gradient so that near-zero entries (where the finite
// difference is all rounding noise) do not dominate.
template <class Got>
void expect_close(const Got& got, const VecD& want, double rtol, const std::string& what, double floor = 0.05) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double scale = max_abs(want);
  ASSERT_GT(scale, 0.0) << what << ": reference gradient is all zero, the check would be vacuous";
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = rtol * (std::fabs(want[i]) + floor * scale);
    if (std::fabs(double(got[i]) - want[i]) > tol && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (tol " << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " elements off";
}

// got - base, elementwise (to read an accumulated "+=" gradient).
inline VecD minus(const VecF& got, const VecF& base) {
  VecD d(got.size());
  for (size_t i = 0; i < got.size(); ++i) d[i] = double(got[i]) - double(base[i]);
  return d;
}

// Causal attention in double on qkv (B, T, 3, H, D) -> out (B, T, H*D), scaled by 1/sqrt(D), and the
// log-sum-exp (B, H, T) of each query's scaled scores: the attention kernels' reference.
struct AttentionRef {
  int64_t B, T, H, D;
  // log-sum-exp (B, H, T) of each query's scaled scores
  VecD lse(const VecD& qkv) const {
    VecD l(size_t(B * H * T));
    forward(qkv, &l);
    return l;
  }
  VecD forward(const VecD& qkv, VecD* lse = nullptr) const {
    const int64_t row = 3 * H * D;
    const double scale = 1.0 / std::sqrt(double(D));
    VecD out(size_t(B * T * H * D), 0.0);
    if (lse) lse->assign(size_t(B * H * T), 0.0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          const double* q = qkv.data() + b * T * row + t * row + h * D;
          VecD s(size_t(t + 1));
          double mx = -1e300;
          for (int64_t u = 0; u <= t; ++u) {
            const double* k = qkv.data() + b * T * row + u * row + H * D + h * D;
            double d = 0;
            for (int64_t i = 0; i < D; ++i) d += q[i] * k[i];
            s[size_t(u)] = d * scale;
            mx = std::max(mx, s[size_t(u)]);
          }
          double sum = 0;
          for (double& e : s) sum += (e = std::exp(e - mx));
          if (lse) (*lse)[size_t((b * H + h) * T + t)] = mx + std::log(sum);
          for (int64_t u = 0; u <= t; ++u) {
            const double* v = qkv.data() + b * T * row + u * row + 2 * H * D + h * D;
            for (int64_t i = 0; i < D; ++i) out[size_t((b * T + t) * H * D + h * D + i)] += s[size_t(u)] / sum * v[i];
          }
        }
    return out;
  }
};

}  // namespace tpt::test
