// The LLaMA family's Ops kernels (core/ops.h; CPU: core/cpu/kernels.h, core/cpu/cpu_ops.cpp) in
// gradcheck_test.cpp's style, on the CPU backend with two threads:
//   - every forward against a double-precision reference written here by hand (RoPE against an
//     independent formulation: complex multiplication of the pairs);
//   - every backward against central finite differences of the op's own float forward and of the
//     double reference, with the "=" / "+=" contract of each gradient output;
//   - 16-bit storage: a bf16 call gives the fp32 call's result (on the bf16-rounded inputs) rounded
//     once, as the header promises;
//   - RMSNorm fused with the residual add reads the residual as stored; the QKV regroup's placement
//     and exact round trip; RoPE's positions (explicit or n % S), partial rotary, inverse and
//     backward. (Grouped-query attention's kernels: attention_gqa_test.cpp.)
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
#include "tests/common/storage_checks.h"

namespace tpt {
namespace {

using namespace test;  // tests/common/gradcheck.h, storage_checks.h

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

}  // namespace
}  // namespace tpt
