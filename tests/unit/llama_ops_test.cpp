// The LLaMA family's Ops kernels (core/ops.h; CPU: core/cpu/llama_kernels.cpp, core/cpu/cpu_ops.cpp)
// in gradcheck_test.cpp's style, on the CPU backend with two threads:
//   - every forward against a double-precision reference written here by hand (RoPE against an
//     independent formulation: complex multiplication of the pairs);
//   - every backward against central finite differences of the op's own float forward and of the
//     double reference, with the "=" / "+=" contract of each gradient output;
//   - 16-bit storage: a bf16 call gives the fp32 call's result (on the bf16-rounded inputs) rounded
//     once, as the header promises;
//   - RMSNorm fused with the residual add reads the residual as stored; the QKV regroup's placement
//     and exact round trip; RoPE's positions (explicit or n % S), partial rotary, inverse and
//     backward; grouped-query attention against multi-head attention on repeated K/V heads, and
//     KV = H bit for bit equal to the multi-head kernel as it was before grouped-query attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/math.h"
#include "core/ops.h"
#include "tests/common/gradcheck.h"

namespace tpt {
namespace {

using VecH = std::vector<uint16_t>;  // bf16 storage

using namespace test;  // tests/common/gradcheck.h

// Bit-for-bit equality of two float vectors, reporting the first differences.
void expect_bitwise(const VecF& got, const VecF& want, const std::string& what) {
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
VecH to_bf16(const VecF& v) {
  VecH h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = fp32_to_bf16(v[i]);
  return h;
}
VecF from_bf16(const VecH& h) {
  VecF v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = bf16_to_fp32(h[i]);
  return v;
}
VecF round_bf16(const VecF& v) { return from_bf16(to_bf16(v)); }
Buf bf(VecH& h) { return Buf(h.data(), DType::BF16); }
CBuf cbf(const VecH& h) { return CBuf(h.data(), DType::BF16); }

void expect_bf16_rounding_of(const VecH& got, const VecF& f32, const std::string& what) {
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

// ================================================================================================
// RMSNorm: out (N, C) = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps)

struct RmsNormRef {
  int64_t N, C;
  double eps;
  VecD forward(const VecD& x, const VecD& w, VecD* rstd = nullptr) const {
    VecD y(size_t(N * C));
    for (int64_t n = 0; n < N; ++n) {
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += x[size_t(n * C + c)] * x[size_t(n * C + c)];
      const double r = 1.0 / std::sqrt(ss / double(C) + eps);
      for (int64_t c = 0; c < C; ++c) y[size_t(n * C + c)] = x[size_t(n * C + c)] * r * w[size_t(c)];
      if (rstd) rstd->push_back(r);
    }
    return y;
  }
};

TEST(LlamaOps, RmsNormForwardMatchesDoubleReference) {
  for (int64_t C : {int64_t(10), int64_t(257)}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const int64_t N = 7;
    const float eps = 1e-5f;
    // a mean away from zero (RMSNorm does not remove it), and one tiny row where eps matters
    VecF x = randn(size_t(N * C), 201, 2.0f, 0.7f), w = randn(size_t(C), 202, 0.5f, 1.0f);
    for (int64_t c = 0; c < C; ++c) x[size_t(3 * C + c)] *= 1e-3f;
    VecF y(size_t(N * C), 9.0f), rstd(static_cast<size_t>(N), 9.0f);
    cpu().rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    const RmsNormRef ref{N, C, eps};
    VecD rd;
    const VecD yd = ref.forward(to_d(x), to_d(w), &rd);
    expect_close(y, yd, 1e-5, "rmsnorm out", 0.01);
    expect_close(rstd, rd, 1e-6, "rmsnorm rstd", 0.0);
  }
}

TEST(LlamaOps, RmsNormBackwardAgainstFiniteDifferences) {
  const int64_t N = 6, C = 10;
  const float eps = 1e-5f;
  VecF x = randn(size_t(N * C), 211, 2.0f, 0.7f), w = randn(size_t(C), 212, 0.5f, 1.0f),
       R = randn(size_t(N * C), 213);
  VecF y(size_t(N * C)), rstd(static_cast<size_t>(N));
  auto J = [&] {
    cpu().rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return dot(y, R);
  };
  const VecD gx = fd_float(x, 1e-2f, J), gw = fd_float(w, 1e-2f, J);
  const RmsNormRef ref{N, C, eps};
  VecD xd = to_d(x), wd = to_d(w);
  auto Jd = [&] { return dot(ref.forward(xd, wd), R); };
  const VecD gxd = fd_double(xd, 1e-6, Jd), gwd = fd_double(wd, 1e-6, Jd);

  J();  // rstd of the unperturbed input
  // both outputs accumulate ("+=")
  const VecF dx0 = randn(size_t(N * C), 214), dw0 = randn(size_t(C), 215);
  VecF dx = dx0, dw = dw0;
  cpu().rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  expect_close(minus(dx, dx0), gx, 1e-2, "rmsnorm dinp (+=) vs FD(float)");
  expect_close(minus(dw, dw0), gw, 1e-2, "rmsnorm dw (+=) vs FD(float)");
  expect_close(minus(dx, dx0), gxd, 1e-4, "rmsnorm dinp vs FD(double)");
  expect_close(minus(dw, dw0), gwd, 1e-4, "rmsnorm dw vs FD(double)");

  // the same from zeroed outputs: the accumulated part does not depend on what was there
  VecF dxz(size_t(N * C), 0.0f), dwz(static_cast<size_t>(C), 0.0f);
  cpu().rmsnorm_backward(dxz.data(), dwz.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  expect_close(dxz, gxd, 1e-4, "rmsnorm dinp from zero vs FD(double)");
  expect_close(dwz, gwd, 1e-4, "rmsnorm dw from zero vs FD(double)");
}

// Many rows over two threads: dw's per-thread partials add up to the sum over all rows.
TEST(LlamaOps, RmsNormWeightGradientSumsAllRows) {
  const int64_t N = 67, C = 33;
  VecF x = randn(size_t(N * C), 221), w = randn(size_t(C), 222, 0.5f, 1.0f), dy = randn(size_t(N * C), 223);
  VecF y(size_t(N * C)), rstd(static_cast<size_t>(N));
  cpu().rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  VecF dx(size_t(N * C)), dw(static_cast<size_t>(C), 0.5f);
  cpu().rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
  VecD want(static_cast<size_t>(C), 0.5);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      want[size_t(c)] += double(dy[size_t(n * C + c)]) * x[size_t(n * C + c)] * rstd[size_t(n)];
  expect_close(dw, want, 1e-5, "rmsnorm dw over 67 rows", 0.01);
}

// res = a + b is stored (rounded to the storage dtype), and the norm reads res as stored: the fused
// call equals an add followed by rmsnorm_forward of the rounded sum, bit for bit.
TEST(LlamaOps, ResidualRmsNormReadsTheStoredResidual) {
  const int64_t N = 5, C = 24;
  const float eps = 1e-5f;
  const VecF a = randn(size_t(N * C), 231, 3.0f), b = randn(size_t(N * C), 232, 0.01f),
             w = randn(size_t(C), 233, 0.5f, 1.0f);

  // fp32: res is the fp32 sum, out the RMSNorm of it
  {
    VecF res(size_t(N * C), 7.0f), out(size_t(N * C), 7.0f), rstd(static_cast<size_t>(N), 7.0f);
    cpu().residual_rmsnorm_forward(res.data(), out.data(), rstd.data(), a.data(), b.data(), w.data(), N, C, eps);
    VecF sum(size_t(N * C));
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = a[i] + b[i];
    expect_bitwise(res, sum, "fp32 residual");
    VecF out2(size_t(N * C)), rstd2(static_cast<size_t>(N));
    cpu().rmsnorm_forward(out2.data(), rstd2.data(), sum.data(), w.data(), N, C, eps);
    expect_bitwise(out, out2, "fp32 residual RMSNorm");
    expect_bitwise(rstd, rstd2, "fp32 residual RMSNorm rstd");
    const RmsNormRef ref{N, C, eps};
    VecD sd(sum.size());
    for (size_t i = 0; i < sd.size(); ++i) sd[i] = double(a[i]) + double(b[i]);
    expect_close(out, ref.forward(sd, to_d(w)), 1e-5, "fp32 residual RMSNorm vs double reference", 0.01);
  }

  // bf16: res = round(a + b); out = round(RMSNorm(res as stored)); with res aliasing a too
  const VecH ah = to_bf16(a), bh = to_bf16(b), wh = to_bf16(w);
  const VecF af = from_bf16(ah), bfl = from_bf16(bh), wf = from_bf16(wh);
  VecF sum(size_t(N * C));  // the fp32 sum of the stored inputs
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = af[i] + bfl[i];
  const VecH stored = to_bf16(sum);
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "res aliases a" : "separate res");
    VecH a_io = ah, res(size_t(N * C), 0x7777), out(size_t(N * C), 0x7777);
    VecF rstd(static_cast<size_t>(N), 7.0f);
    Buf res_buf = in_place ? bf(a_io) : bf(res);
    cpu().residual_rmsnorm_forward(res_buf, bf(out), rstd.data(), cbf(a_io), cbf(bh), cbf(wh), N, C, eps);
    const VecH& res_got = in_place ? a_io : res;
    EXPECT_EQ(res_got, stored) << "the residual is a + b rounded once to bf16";
    // RMSNorm of the stored residual, unfused
    VecH out2(size_t(N * C));
    VecF rstd2(static_cast<size_t>(N));
    cpu().rmsnorm_forward(bf(out2), rstd2.data(), cbf(stored), cbf(wh), N, C, eps);
    EXPECT_EQ(out, out2) << "out is RMSNorm of the residual as stored";
    expect_bitwise(rstd, rstd2, "rstd of the residual as stored");
    // ... which is the fp32 RMSNorm of the stored residual, rounded once
    VecF outf(size_t(N * C)), rstdf(static_cast<size_t>(N));
    const VecF stored_f = from_bf16(stored);
    cpu().rmsnorm_forward(outf.data(), rstdf.data(), stored_f.data(), wf.data(), N, C, eps);
    expect_bf16_rounding_of(out, outf, "bf16 residual RMSNorm");
    // not vacuous: the unrounded sum would give other statistics
    VecF outu(size_t(N * C)), rstdu(static_cast<size_t>(N));
    cpu().rmsnorm_forward(outu.data(), rstdu.data(), sum.data(), wf.data(), N, C, eps);
    EXPECT_NE(rstdu, rstd) << "the inputs do not tell the stored residual from the fp32 sum";
  }
}

TEST(LlamaOps, RmsNormBf16StorageIsTheFp32ResultRounded) {
  const int64_t N = 9, C = 40;
  const float eps = 1e-5f;
  const VecF x = round_bf16(randn(size_t(N * C), 241, 2.0f, 0.5f)), w = round_bf16(randn(size_t(C), 242, 0.5f, 1.0f)),
             dy = round_bf16(randn(size_t(N * C), 243)), dx0 = round_bf16(randn(size_t(N * C), 244)),
             dw0 = randn(size_t(C), 245);
  // fp32 on the rounded values
  VecF y(size_t(N * C)), rstd(static_cast<size_t>(N)), dx = dx0, dw = dw0;
  cpu().rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  cpu().rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
  // bf16 storage of the compute-dtype tensors; rstd and dw stay fp32
  const VecH xh = to_bf16(x), wh = to_bf16(w), dyh = to_bf16(dy);
  VecH yh(size_t(N * C)), dxh = to_bf16(dx0);
  VecF rstd_h(static_cast<size_t>(N)), dw_h = dw0;
  cpu().rmsnorm_forward(bf(yh), rstd_h.data(), cbf(xh), cbf(wh), N, C, eps);
  cpu().rmsnorm_backward(bf(dxh), dw_h.data(), cbf(dyh), cbf(xh), cbf(wh), rstd_h.data(), N, C);
  expect_bf16_rounding_of(yh, y, "bf16 rmsnorm out");
  expect_bitwise(rstd_h, rstd, "bf16 rmsnorm rstd (fp32)");
  expect_bf16_rounding_of(dxh, dx, "bf16 rmsnorm dinp (+=)");
  expect_bitwise(dw_h, dw, "bf16 rmsnorm dw (fp32, +=)");
}

// ================================================================================================
// SwiGLU: inp (N, 2F) rows [gate | up] -> out (N, F) = silu(gate) * up

struct SwigluRef {
  int64_t N, F;
  VecD forward(const VecD& x) const {
    VecD y(size_t(N * F));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t f = 0; f < F; ++f) {
        const double g = x[size_t(n * 2 * F + f)], u = x[size_t(n * 2 * F + F + f)];
        y[size_t(n * F + f)] = g / (1.0 + std::exp(-g)) * u;
      }
    return y;
  }
};

TEST(LlamaOps, SwigluForwardMatchesDoubleReference) {
  const int64_t N = 5, F = 11;
  VecF x = randn(size_t(2 * N * F), 251, 3.0f);
  x[0] = -40.0f, x[1] = 40.0f, x[2] = 0.0f;  // saturated gates and zero
  VecF y(size_t(N * F), 9.0f);
  cpu().swiglu_forward(y.data(), x.data(), N, F);
  expect_close(y, SwigluRef{N, F}.forward(to_d(x)), 1e-5, "swiglu out", 0.01);
  EXPECT_EQ(y[2], 0.0f);
}

TEST(LlamaOps, SwigluBackwardAgainstFiniteDifferences) {
  const int64_t N = 5, F = 7;
  VecF x = randn(size_t(2 * N * F), 261, 2.0f), R = randn(size_t(N * F), 262);
  VecF y(size_t(N * F));
  auto J = [&] {
    cpu().swiglu_forward(y.data(), x.data(), N, F);
    return dot(y, R);
  };
  const VecD g = fd_float(x, 1e-2f, J);
  const SwigluRef ref{N, F};
  VecD xd = to_d(x);
  const VecD gd = fd_double(xd, 1e-6, [&] { return dot(ref.forward(xd), R); });
  VecF dx(size_t(2 * N * F), 5.0f);  // "=": stale contents must not leak in
  cpu().swiglu_backward(dx.data(), R.data(), x.data(), N, F);
  expect_close(dx, g, 1e-2, "swiglu dinp vs FD(float)");
  expect_close(dx, gd, 1e-5, "swiglu dinp vs FD(double)");
  // the closed form in double: [dy u silu'(g) | dy silu(g)]
  VecD want(size_t(2 * N * F));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double gt = x[size_t(n * 2 * F + f)], u = x[size_t(n * 2 * F + F + f)], dy = R[size_t(n * F + f)];
      const double s = 1.0 / (1.0 + std::exp(-gt));
      want[size_t(n * 2 * F + f)] = dy * u * s * (1.0 + gt * (1.0 - s));
      want[size_t(n * 2 * F + F + f)] = dy * gt * s;
    }
  expect_close(dx, want, 1e-5, "swiglu dinp vs closed form", 0.01);
}

TEST(LlamaOps, SwigluBf16StorageIsTheFp32ResultRounded) {
  const int64_t N = 6, F = 13;
  const VecF x = round_bf16(randn(size_t(2 * N * F), 271, 2.0f)), dy = round_bf16(randn(size_t(N * F), 272));
  VecF y(size_t(N * F)), dx(size_t(2 * N * F));
  cpu().swiglu_forward(y.data(), x.data(), N, F);
  cpu().swiglu_backward(dx.data(), dy.data(), x.data(), N, F);
  const VecH xh = to_bf16(x), dyh = to_bf16(dy);
  VecH yh(size_t(N * F)), dxh(size_t(2 * N * F), 0x4040);
  cpu().swiglu_forward(bf(yh), cbf(xh), N, F);
  cpu().swiglu_backward(bf(dxh), cbf(dyh), cbf(xh), N, F);
  expect_bf16_rounding_of(yh, y, "bf16 swiglu out");
  expect_bf16_rounding_of(dxh, dx, "bf16 swiglu dinp (=)");
}

// ================================================================================================
// qkv_regroup: grouped (N, G, Q + 2, D) <-> heads (N, [G Q query heads | G keys | G values] D)

TEST(LlamaOps, QkvRegroupPlacesHeadsAndRoundTripsExactly) {
  struct Case {
    int64_t N, G, Q, D;
  };
  for (const Case& c : {Case{3, 2, 3, 4}, Case{2, 1, 4, 5}, Case{4, 3, 1, 2}}) {
    SCOPED_TRACE("G=" + std::to_string(c.G) + " Q=" + std::to_string(c.Q) + " D=" + std::to_string(c.D));
    const int64_t W = c.G * (c.Q + 2) * c.D, n = c.N * W;
    // every element tells where it came from: grouped (token, group, slot, channel)
    VecF grouped(static_cast<size_t>(n));
    for (int64_t t = 0; t < c.N; ++t)
      for (int64_t g = 0; g < c.G; ++g)
        for (int64_t j = 0; j < c.Q + 2; ++j)
          for (int64_t e = 0; e < c.D; ++e)
            grouped[size_t(t * W + (g * (c.Q + 2) + j) * c.D + e)] = float(t * 10000 + g * 1000 + j * 100 + e);
    VecF heads(static_cast<size_t>(n), -1.0f);
    cpu().qkv_regroup(heads.data(), grouped.data(), c.N, c.G, c.Q, c.D, true);
    const int64_t GQ = c.G * c.Q;
    for (int64_t t = 0; t < c.N; ++t)
      for (int64_t g = 0; g < c.G; ++g)
        for (int64_t e = 0; e < c.D; ++e) {
          // query head g Q + j is group g's j-th query, key head g group g's key, value head g its value
          for (int64_t j = 0; j < c.Q; ++j)
            EXPECT_EQ(heads[size_t(t * W + (g * c.Q + j) * c.D + e)], float(t * 10000 + g * 1000 + j * 100 + e))
                << "query head " << g * c.Q + j;
          EXPECT_EQ(heads[size_t(t * W + (GQ + g) * c.D + e)], float(t * 10000 + g * 1000 + c.Q * 100 + e))
              << "key head " << g;
          EXPECT_EQ(heads[size_t(t * W + (GQ + c.G + g) * c.D + e)],
                    float(t * 10000 + g * 1000 + (c.Q + 1) * 100 + e))
              << "value head " << g;
        }
    // back: exactly the input (fp32 and bf16)
    VecF back(static_cast<size_t>(n), -1.0f);
    cpu().qkv_regroup(back.data(), heads.data(), c.N, c.G, c.Q, c.D, false);
    expect_bitwise(back, grouped, "fp32 round trip");
    const VecF r = randn(size_t(n), 281);
    VecF h2(static_cast<size_t>(n)), b2(static_cast<size_t>(n));
    cpu().qkv_regroup(h2.data(), r.data(), c.N, c.G, c.Q, c.D, true);
    cpu().qkv_regroup(b2.data(), h2.data(), c.N, c.G, c.Q, c.D, false);
    expect_bitwise(b2, r, "fp32 round trip of random values");
    const VecH rh = to_bf16(r);
    VecH hh(static_cast<size_t>(n)), bh(static_cast<size_t>(n));
    cpu().qkv_regroup(bf(hh), cbf(rh), c.N, c.G, c.Q, c.D, true);
    EXPECT_EQ(from_bf16(hh), round_bf16(h2)) << "bf16 regroup moves the stored values";
    cpu().qkv_regroup(bf(bh), cbf(hh), c.N, c.G, c.Q, c.D, false);
    EXPECT_EQ(bh, rh) << "bf16 round trip";
  }
}

// ================================================================================================
// RoPE, in place on the q and k heads of qkv (N, (H + 2 KV) D)

struct RopeShape {
  int64_t N, S, H, KV, D, rot;
  bool interleaved;
  int64_t width() const { return (H + 2 * KV) * D; }
  int64_t size() const { return N * width(); }
  std::string name() const {
    return std::string(interleaved ? "interleaved" : "rotate-half") + " rot=" + std::to_string(rot) +
           " D=" + std::to_string(D) + " H=" + std::to_string(H) + " KV=" + std::to_string(KV);
  }
};

// inv_freq (rot / 2) as the model computes it without scaling: base^(-2j/rot)
VecF inv_freq_of(int64_t rot, double base = 10000.0) {
  VecF f(size_t(rot / 2));
  for (int64_t j = 0; j < rot / 2; ++j) f[size_t(j)] = float(std::pow(base, -2.0 * double(j) / double(rot)));
  return f;
}

// The independent formulation: each head's first rot channels as rot/2 complex numbers, multiplied
// by e^{i theta_j}, theta_j = pos * inv_freq[j] (the fp32 product, as the spec says), in double.
// Interleaved: z_j = x[2j] + i x[2j+1]. Rotate-half: the channels permuted into interleaved order
// (x[j], x[j + rot/2]) -> (2j, 2j+1), the same complex product, then permuted back.
VecD rope_ref(const VecD& qkv, const VecF& inv_freq, const std::vector<int32_t>* positions, const RopeShape& s,
              bool inverse) {
  VecD out = qkv;
  const int64_t half = s.rot / 2;
  for (int64_t n = 0; n < s.N; ++n) {
    const int32_t pos = positions ? (*positions)[size_t(n)] : int32_t(n % s.S);
    for (int64_t h = 0; h < s.H + s.KV; ++h) {  // query heads, then key heads; values untouched
      double* x = out.data() + n * s.width() + h * s.D;
      // into interleaved order
      VecD y(size_t(s.rot));
      for (int64_t c = 0; c < s.rot; ++c) {
        const int64_t from = s.interleaved ? c : (c % 2 == 0 ? c / 2 : half + c / 2);
        y[size_t(c)] = x[from];
      }
      for (int64_t j = 0; j < half; ++j) {
        const double theta = double(float(pos) * inv_freq[size_t(j)]) * (inverse ? -1.0 : 1.0);
        const std::complex<double> z = std::complex<double>(y[size_t(2 * j)], y[size_t(2 * j + 1)]) *
                                       std::polar(1.0, theta);
        y[size_t(2 * j)] = z.real();
        y[size_t(2 * j + 1)] = z.imag();
      }
      for (int64_t c = 0; c < s.rot; ++c) {
        const int64_t to = s.interleaved ? c : (c % 2 == 0 ? c / 2 : half + c / 2);
        x[to] = y[size_t(c)];
      }
    }
  }
  return out;
}

// HF's formula for rotate-half, as a second reference: x * cos + rotate_half(x) * sin over the
// rotated channels, with cos, sin of angle j repeated in both halves.
VecD rope_ref_hf(const VecD& qkv, const VecF& inv_freq, const RopeShape& s) {
  VecD out = qkv;
  const int64_t half = s.rot / 2;
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t h = 0; h < s.H + s.KV; ++h) {
      const double* x = qkv.data() + n * s.width() + h * s.D;
      double* y = out.data() + n * s.width() + h * s.D;
      for (int64_t c = 0; c < s.rot; ++c) {
        const double theta = double(float(n % s.S) * inv_freq[size_t(c % half)]);
        const double rotated = c < half ? -x[c + half] : x[c - half];
        y[c] = x[c] * std::cos(theta) + rotated * std::sin(theta);
      }
    }
  return out;
}

void run_rope(VecF& x, const VecF& inv_freq, const std::vector<int32_t>* positions, const RopeShape& s,
              bool inverse) {
  cpu().rope(x.data(), inv_freq.data(), positions ? positions->data() : nullptr, s.N, s.S, s.H, s.KV, s.D, s.rot,
             s.interleaved, inverse);
}

const RopeShape kRopeShapes[] = {
    {10, 5, 4, 2, 8, 8, false},  // rotate-half, full rotary, GQA
    {10, 5, 4, 2, 8, 8, true},   // interleaved, full rotary
    {6, 4, 2, 1, 12, 6, false},  // partial rotary (an odd number of pairs)
    {6, 4, 2, 1, 12, 4, true},   // interleaved, partial
    {8, 4, 3, 3, 6, 6, true},    // multi-head (KV = H)
};

TEST(LlamaOps, RopeForwardMatchesComplexMultiplication) {
  for (const RopeShape& s : kRopeShapes) {
    SCOPED_TRACE(s.name());
    const VecF inv_freq = inv_freq_of(s.rot);
    const VecF x0 = randn(size_t(s.size()), 301);
    // positions n % S (null), then explicit ones, some large
    VecF x = x0;
    run_rope(x, inv_freq, nullptr, s, false);
    expect_close(x, rope_ref(to_d(x0), inv_freq, nullptr, s, false), 1e-5, "rope (n % S)");
    if (!s.interleaved) expect_close(x, rope_ref_hf(to_d(x0), inv_freq, s), 1e-5, "rope vs HF's rotate_half form");
    std::vector<int32_t> pos(size_t(s.N));
    for (int64_t n = 0; n < s.N; ++n) pos[size_t(n)] = int32_t((n * 37 + 3) % 23 + (n == 1 ? 4000 : 0));
    VecF xp = x0;
    run_rope(xp, inv_freq, &pos, s, false);
    expect_close(xp, rope_ref(to_d(x0), inv_freq, &pos, s, false), 1e-5, "rope (explicit positions)");
    // the inverse rotation on its own
    VecF xi = x0;
    run_rope(xi, inv_freq, &pos, s, true);
    expect_close(xi, rope_ref(to_d(x0), inv_freq, &pos, s, true), 1e-5, "rope inverse (explicit positions)");
    // position 0 is the identity
    std::vector<int32_t> zero(size_t(s.N), 0);
    VecF xz = x0;
    run_rope(xz, inv_freq, &zero, s, false);
    expect_bitwise(xz, x0, "rope at position 0");
  }
}

// Null positions mean n % S: bit for bit the same as passing those positions.
TEST(LlamaOps, RopeNullPositionsAreTokenIndexModuloS) {
  for (const RopeShape& s : kRopeShapes) {
    SCOPED_TRACE(s.name());
    const VecF inv_freq = inv_freq_of(s.rot);
    const VecF x0 = randn(size_t(s.size()), 311);
    std::vector<int32_t> pos(size_t(s.N));
    for (int64_t n = 0; n < s.N; ++n) pos[size_t(n)] = int32_t(n % s.S);
    VecF a = x0, b = x0;
    run_rope(a, inv_freq, nullptr, s, false);
    run_rope(b, inv_freq, &pos, s, false);
    expect_bitwise(a, b, "null positions vs n % S");
    // and the token's index itself would be another rotation (not vacuous: N > S)
    std::vector<int32_t> idx(size_t(s.N));
    for (int64_t n = 0; n < s.N; ++n) idx[size_t(n)] = int32_t(n);
    VecF c = x0;
    run_rope(c, inv_freq, &idx, s, false);
    EXPECT_NE(a, c);
  }
}

// Partial rotary: channels [rot, D) of every q and k head, and every value channel, are untouched.
TEST(LlamaOps, RopeLeavesUnrotatedChannelsAndValuesUntouched) {
  for (const RopeShape& s : kRopeShapes) {
    SCOPED_TRACE(s.name());
    const VecF inv_freq = inv_freq_of(s.rot);
    const VecF x0 = randn(size_t(s.size()), 321);
    for (bool inverse : {false, true}) {
      VecF x = x0;
      run_rope(x, inv_freq, nullptr, s, inverse);
      int changed = 0, bad = 0;
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t h = 0; h < s.H + 2 * s.KV; ++h)
          for (int64_t c = 0; c < s.D; ++c) {
            const size_t e = size_t(n * s.width() + h * s.D + c);
            const bool rotated = h < s.H + s.KV && c < s.rot;
            if (!rotated && std::memcmp(&x[e], &x0[e], sizeof(float)) != 0 && ++bad <= 5)
              ADD_FAILURE() << "token " << n << " head " << h << " channel " << c << " changed";
            changed += rotated && x[e] != x0[e];
          }
      EXPECT_EQ(bad, 0);
      EXPECT_GT(changed, 0) << "nothing rotated";
    }
  }
}

TEST(LlamaOps, RopeInverseUndoesForward) {
  for (const RopeShape& s : kRopeShapes) {
    SCOPED_TRACE(s.name());
    const VecF inv_freq = inv_freq_of(s.rot);
    const VecF x0 = randn(size_t(s.size()), 331, 2.0f);
    std::vector<int32_t> pos(size_t(s.N));
    for (int64_t n = 0; n < s.N; ++n) pos[size_t(n)] = int32_t(n * 97 % 2048);
    const std::vector<int32_t>* cases[] = {nullptr, &pos};
    for (const std::vector<int32_t>* p : cases) {
      VecF x = x0;
      run_rope(x, inv_freq, p, s, false);
      run_rope(x, inv_freq, p, s, true);
      for (size_t i = 0; i < x.size(); ++i)
        ASSERT_NEAR(x[i], x0[i], 1e-6 * std::max(1.0f, std::fabs(x0[i]))) << "element " << i;
    }
  }
}

// J = sum(rope(x) * R): dJ/dx = R rotated back (the backward is the inverse rotation on the gradient;
// the values' gradient is R itself).
TEST(LlamaOps, RopeBackwardIsTheInverseRotation) {
  for (const RopeShape& s : {kRopeShapes[0], kRopeShapes[1], kRopeShapes[2], kRopeShapes[3]}) {
    SCOPED_TRACE(s.name());
    const VecF inv_freq = inv_freq_of(s.rot);
    VecF x = randn(size_t(s.size()), 341);
    const VecF R = randn(size_t(s.size()), 342);
    std::vector<int32_t> pos(size_t(s.N));
    for (int64_t n = 0; n < s.N; ++n) pos[size_t(n)] = int32_t((n * 5 + 1) % 9);
    auto J = [&] {
      VecF y = x;
      run_rope(y, inv_freq, &pos, s, false);
      return dot(y, R);
    };
    const VecD g = fd_float(x, 1e-2f, J);
    VecD xd = to_d(x);
    const VecD gd = fd_double(xd, 1e-6, [&] { return dot(rope_ref(xd, inv_freq, &pos, s, false), R); });
    VecF dx = R;
    run_rope(dx, inv_freq, &pos, s, true);
    expect_close(dx, g, 1e-2, "rope backward vs FD(float)");
    expect_close(dx, gd, 1e-5, "rope backward vs FD(double)");
  }
}

TEST(LlamaOps, RopeBf16StorageIsTheFp32ResultRounded) {
  for (const RopeShape& s : {kRopeShapes[0], kRopeShapes[3]}) {
    SCOPED_TRACE(s.name());
    const VecF inv_freq = inv_freq_of(s.rot);
    const VecF x0 = round_bf16(randn(size_t(s.size()), 351));
    for (bool inverse : {false, true}) {
      VecF x = x0;
      run_rope(x, inv_freq, nullptr, s, inverse);
      VecH xh = to_bf16(x0);
      cpu().rope(bf(xh), inv_freq.data(), nullptr, s.N, s.S, s.H, s.KV, s.D, s.rot, s.interleaved, inverse);
      expect_bf16_rounding_of(xh, x, inverse ? "bf16 rope inverse" : "bf16 rope");
    }
  }
}

// ================================================================================================
// Attention with KV heads: qkv (B, T, (H + 2 KV) D), query head h with key/value head h / (H / KV)

// Multi-head attention in double on qkv (B, T, 3, H, D) (gradcheck_test.cpp's AttentionRef).
struct MhaRef {
  int64_t B, T, H, D;
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

// The grouped tensor (B, T, (H + 2 KV) D) as a multi-head one (B, T, 3, H, D): key and value head
// h / (H / KV) repeated for each query head h.
template <class V>
V repeat_kv(const V& gqa, int64_t BT, int64_t H, int64_t KV, int64_t D) {
  const int64_t rg = (H + 2 * KV) * D, rm = 3 * H * D, Q = H / KV;
  V mha(size_t(BT * rm));
  for (int64_t n = 0; n < BT; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t e = 0; e < D; ++e) {
        mha[size_t(n * rm + h * D + e)] = gqa[size_t(n * rg + h * D + e)];
        mha[size_t(n * rm + H * D + h * D + e)] = gqa[size_t(n * rg + H * D + (h / Q) * D + e)];
        mha[size_t(n * rm + 2 * H * D + h * D + e)] = gqa[size_t(n * rg + (H + KV) * D + (h / Q) * D + e)];
      }
  return mha;
}

TEST(LlamaOps, GqaAttentionForwardMatchesRepeatedHeads) {
  const int64_t B = 2, T = 6, H = 4, D = 3;
  for (int64_t KV : {int64_t(2), int64_t(1)}) {
    SCOPED_TRACE("KV = " + std::to_string(KV));
    const VecF qkv = randn(size_t(B * T * (H + 2 * KV) * D), 401, 1.5f);
    VecF out(size_t(B * T * H * D), 9.0f), lse(size_t(B * H * T), 9.0f);
    cpu().attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, D);
    // the double reference: multi-head attention with each group's key and value repeated
    VecD lse_d;
    const VecD out_d = MhaRef{B, T, H, D}.forward(repeat_kv(to_d(qkv), B * T, H, KV, D), &lse_d);
    expect_close(out, out_d, 1e-5, "GQA out vs double reference", 0.01);
    expect_close(lse, lse_d, 1e-5, "GQA lse vs double reference", 0.01);
    // the CPU's multi-head attention on the repeated heads: the same arithmetic, bit for bit
    const VecF mha = repeat_kv(qkv, B * T, H, KV, D);
    VecF out_m(out.size()), lse_m(lse.size());
    cpu().attention_forward(out_m.data(), lse_m.data(), mha.data(), B, T, H, H, D);
    expect_bitwise(out, out_m, "GQA out vs CPU MHA on repeated heads");
    expect_bitwise(lse, lse_m, "GQA lse vs CPU MHA on repeated heads");
  }
}

TEST(LlamaOps, GqaAttentionBackwardAgainstFiniteDifferences) {
  const int64_t B = 2, T = 5, H = 4, D = 3;
  for (int64_t KV : {int64_t(2), int64_t(1)}) {
    SCOPED_TRACE("KV = " + std::to_string(KV));
    const int64_t row = (H + 2 * KV) * D, n = B * T * row;
    VecF qkv = randn(size_t(n), 411), R = randn(size_t(B * T * H * D), 412);
    VecF out(size_t(B * T * H * D)), lse(size_t(B * H * T));
    auto J = [&] {
      cpu().attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, D);
      return dot(out, R);
    };
    const VecD g = fd_float(qkv, 1e-2f, J);
    // the double objective through the repeated heads: the chain rule sums dK, dV over each group
    const MhaRef ref{B, T, H, D};
    VecD qd = to_d(qkv);
    const VecD gd = fd_double(qd, 1e-6, [&] { return dot(ref.forward(repeat_kv(qd, B * T, H, KV, D)), R); });

    J();
    VecF dqkv(static_cast<size_t>(n), 5.0f), scratch(size_t(B * H * T), 3.0f);  // "=": stale contents must not leak in
    cpu().attention_backward(dqkv.data(), scratch.data(), R.data(), qkv.data(), out.data(), lse.data(), B, T, H, KV,
                             D);
    expect_close(dqkv, g, 1e-2, "GQA dqkv vs FD(float)");
    expect_close(dqkv, gd, 1e-4, "GQA dqkv vs FD(double)");

    // against the CPU's multi-head backward on the repeated heads: dq the same, each kv head's dK and
    // dV the sum of its group's
    const VecF mha = repeat_kv(qkv, B * T, H, KV, D);
    VecF out_m(out.size()), lse_m(lse.size());
    cpu().attention_forward(out_m.data(), lse_m.data(), mha.data(), B, T, H, H, D);
    VecF dm(size_t(B * T * 3 * H * D), 5.0f), scratch_m(size_t(B * H * T));
    cpu().attention_backward(dm.data(), scratch_m.data(), R.data(), mha.data(), out_m.data(), lse_m.data(), B, T, H,
                             H, D);
    VecD summed(static_cast<size_t>(n), 0.0);
    const int64_t Q = H / KV, rm = 3 * H * D;
    for (int64_t t = 0; t < B * T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t e = 0; e < D; ++e) {
          summed[size_t(t * row + h * D + e)] = dm[size_t(t * rm + h * D + e)];
          summed[size_t(t * row + H * D + (h / Q) * D + e)] += dm[size_t(t * rm + H * D + h * D + e)];
          summed[size_t(t * row + (H + KV) * D + (h / Q) * D + e)] += dm[size_t(t * rm + 2 * H * D + h * D + e)];
        }
    expect_close(dqkv, summed, 1e-5, "GQA dqkv vs MHA's, dK and dV summed over the group", 0.01);
  }
}

// ---- the CPU's multi-head attention as it was before grouped-query attention (core/cpu/cpu_ops.cpp
// at 072ab30^, qkv (B, T, 3, H, D)), one (sequence, head) at a time: what KV = H must still compute.

void legacy_mha_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t D) {
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t row = 3 * H * D;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const float* base = qkv + b * T * row;
      std::vector<float> p(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) {
        const float* q = base + t * row + h * D;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s <= t; ++s) {
          const float* k = base + s * row + H * D + h * D;
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
          p[size_t(s)] = dot * scale;
          mx = std::max(mx, p[size_t(s)]);
        }
        float sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          p[size_t(s)] = fast_exp(p[size_t(s)] - mx);
          sum += p[size_t(s)];
        }
        lse[(b * H + h) * T + t] = mx + std::log(sum);
        const float inv = 1.0f / sum;
        float* o = out + (b * T + t) * H * D + h * D;
        for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
        for (int64_t s = 0; s <= t; ++s) {
          const float* v = base + s * row + 2 * H * D + h * D;
          const float ps = p[size_t(s)] * inv;
          for (int64_t d = 0; d < D; ++d) o[d] += ps * v[d];
        }
      }
    }
}

void legacy_mha_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int64_t B, int64_t T,
                         int64_t H, int64_t D) {
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t row = 3 * H * D;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const float* base = qkv + b * T * row;
      float* dbase = dqkv + b * T * row;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t w = 0; w < 3; ++w) std::memset(dbase + t * row + w * H * D + h * D, 0, size_t(D) * sizeof(float));
      std::vector<float> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) {
        const float* q = base + t * row + h * D;
        const float* dy = dout + (b * T + t) * H * D + h * D;
        const float lse_t = lse[(b * H + h) * T + t];
        float sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          const float* k = base + s * row + H * D + h * D;
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
          p[size_t(s)] = fast_exp(dot * scale - lse_t);
          sum += p[size_t(s)];
        }
        const float inv = 1.0f / sum;
        float dot_pdp = 0;
        for (int64_t s = 0; s <= t; ++s) {
          const float* v = base + s * row + 2 * H * D + h * D;
          float* dv = dbase + s * row + 2 * H * D + h * D;
          float d_ps = 0;
          const float ps = p[size_t(s)] * inv;
#pragma omp simd reduction(+ : d_ps)
          for (int64_t d = 0; d < D; ++d) {
            d_ps += dy[d] * v[d];
            dv[d] += ps * dy[d];
          }
          p[size_t(s)] = ps;
          dp[size_t(s)] = d_ps;
          dot_pdp += ps * d_ps;
        }
        float* dq = dbase + t * row + h * D;
        for (int64_t s = 0; s <= t; ++s) {
          const float ds = p[size_t(s)] * (dp[size_t(s)] - dot_pdp) * scale;
          const float* k = base + s * row + H * D + h * D;
          float* dk = dbase + s * row + H * D + h * D;
          for (int64_t d = 0; d < D; ++d) {
            dq[d] += ds * k[d];
            dk[d] += ds * q[d];
          }
        }
      }
    }
}

TEST(LlamaOps, AttentionWithKvEqualHeadsIsTheMultiHeadKernelBitwise) {
  struct Case {
    int64_t B, T, H, D;
  };
  for (const Case& c : {Case{2, 7, 3, 8}, Case{1, 9, 4, 5}, Case{2, 5, 2, 16}}) {
    SCOPED_TRACE("H=" + std::to_string(c.H) + " D=" + std::to_string(c.D));
    const int64_t n = c.B * c.T * 3 * c.H * c.D, no = c.B * c.T * c.H * c.D;
    const VecF qkv = randn(size_t(n), 421, 1.5f), dy = randn(size_t(no), 422);
    VecF out(static_cast<size_t>(no)), lse(size_t(c.B * c.H * c.T)), out_l(static_cast<size_t>(no)), lse_l(lse.size());
    cpu().attention_forward(out.data(), lse.data(), qkv.data(), c.B, c.T, c.H, c.H, c.D);
    legacy_mha_forward(out_l.data(), lse_l.data(), qkv.data(), c.B, c.T, c.H, c.D);
    expect_bitwise(out, out_l, "out (KV = H)");
    expect_bitwise(lse, lse_l, "lse (KV = H)");
    VecF dqkv(static_cast<size_t>(n), 5.0f), scratch(lse.size()), dqkv_l(static_cast<size_t>(n), 5.0f);
    cpu().attention_backward(dqkv.data(), scratch.data(), dy.data(), qkv.data(), out.data(), lse.data(), c.B, c.T,
                             c.H, c.H, c.D);
    legacy_mha_backward(dqkv_l.data(), dy.data(), qkv.data(), lse_l.data(), c.B, c.T, c.H, c.D);
    expect_bitwise(dqkv, dqkv_l, "dqkv (KV = H)");
    // and the double reference, so that the kernel copied above is itself right
    expect_close(out, MhaRef{c.B, c.T, c.H, c.D}.forward(to_d(qkv)), 1e-5, "out vs double reference", 0.01);
  }
}

TEST(LlamaOps, GqaAttentionBf16StorageIsTheFp32ResultRounded) {
  const int64_t B = 2, T = 6, H = 4, KV = 2, D = 8;
  const int64_t n = B * T * (H + 2 * KV) * D, no = B * T * H * D;
  const VecF qkv = round_bf16(randn(size_t(n), 431)), dy = round_bf16(randn(size_t(no), 432));
  VecF out(static_cast<size_t>(no)), lse(size_t(B * H * T)), dqkv(static_cast<size_t>(n)), scratch(lse.size());
  cpu().attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, D);
  cpu().attention_backward(dqkv.data(), scratch.data(), dy.data(), qkv.data(), out.data(), lse.data(), B, T, H, KV,
                           D);
  const VecH qh = to_bf16(qkv), dyh = to_bf16(dy);
  VecH outh(static_cast<size_t>(no)), dqh(static_cast<size_t>(n), 0x4040);
  VecF lse_h(lse.size()), scratch_h(lse.size());
  cpu().attention_forward(bf(outh), lse_h.data(), cbf(qh), B, T, H, KV, D);
  cpu().attention_backward(bf(dqh), scratch_h.data(), cbf(dyh), cbf(qh), cbf(outh), lse_h.data(), B, T, H, KV, D);
  expect_bf16_rounding_of(outh, out, "bf16 GQA out");
  expect_bitwise(lse_h, lse, "bf16 GQA lse (fp32)");
  expect_bf16_rounding_of(dqh, dqkv, "bf16 GQA dqkv (=)");
}

}  // namespace
}  // namespace tpt
