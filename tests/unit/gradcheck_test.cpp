// Gradient checks of every backward in the Ops interface (core/ops.h) on the CPU backend.
// Each test takes a random scalar objective J = sum(out * R) and compares
//   - the analytic gradient (the op's backward, in float) with central finite differences of the
//     op's own float forward (eps ~1e-2, relative tolerance ~1e-2: a wrong sign, a missing term or a
//     factor of 2 fails), and
//   - the float forward and backward with a double-precision reference written here by hand
//     (tight tolerances), whose own gradient is checked by finite differences in double.
// Also: the "=" / "+=" contract of every gradient output, GELU and AdamW against hand values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/math.h"
#include "core/ops.h"
#include "tests/common/gradcheck.h"

namespace tpt {
namespace {


using namespace test;  // tests/common/gradcheck.h

// ------------------------------------------------------------------------------------------------
// linear: out (N, O) = inp (N, I) @ w (O, I)^T + bias (O)

struct LinearRef {
  int64_t N, I, O;
  VecD forward(const VecD& x, const VecD& w, const VecD* b) const {
    VecD y(static_cast<size_t>(N * O));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        double s = b ? (*b)[size_t(o)] : 0.0;
        for (int64_t i = 0; i < I; ++i) s += x[size_t(n * I + i)] * w[size_t(o * I + i)];
        y[size_t(n * O + o)] = s;
      }
    return y;
  }
};

TEST(GradCheck, LinearForwardMatchesDoubleReference) {
  const int64_t N = 5, I = 7, O = 6;
  VecF x = randn(N * I, 1), w = randn(O * I, 2), b = randn(O, 3);
  VecF y(N * O, 123.0f);
  cpu().linear_forward(y.data(), x.data(), w.data(), b.data(), N, I, O);
  LinearRef ref{N, I, O};
  VecD bd = to_d(b);
  expect_close(y, ref.forward(to_d(x), to_d(w), &bd), 1e-5, "linear out (bias)", 0.01);
  VecF y0(N * O, 123.0f);
  cpu().linear_forward(y0.data(), x.data(), w.data(), nullptr, N, I, O);
  expect_close(y0, ref.forward(to_d(x), to_d(w), nullptr), 1e-5, "linear out (no bias)", 0.01);
}

TEST(GradCheck, LinearBackwardAgainstFiniteDifferences) {
  const int64_t N = 5, I = 7, O = 6;
  VecF x = randn(N * I, 11), w = randn(O * I, 12), b = randn(O, 13), R = randn(N * O, 14);
  auto J = [&] {
    VecF y(N * O);
    cpu().linear_forward(y.data(), x.data(), w.data(), b.data(), N, I, O);
    return dot(y, R);
  };
  const VecD gx = fd_float(x, 1e-2f, J), gw = fd_float(w, 1e-2f, J), gb = fd_float(b, 1e-2f, J);

  // Double reference gradients by finite differences of the double forward.
  LinearRef ref{N, I, O};
  VecD xd = to_d(x), wd = to_d(w), bd = to_d(b);
  auto Jd = [&] { return dot(ref.forward(xd, wd, &bd), R); };
  const VecD gxd = fd_double(xd, 1e-6, Jd), gwd = fd_double(wd, 1e-6, Jd), gbd = fd_double(bd, 1e-6, Jd);

  // dinp "=" (accumulate_dinp false): stale contents are overwritten. dw, dbias "+=".
  const VecF dx0(N * I, 7.0f), dw0 = randn(O * I, 15), db0 = randn(O, 16);
  VecF dx = dx0, dw = dw0, db = db0;
  cpu().linear_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, I, O, false);
  VecD dxv(dx.begin(), dx.end());
  expect_close(dxv, gx, 1e-2, "linear dinp vs FD(float)");
  expect_close(minus(dw, dw0), gw, 1e-2, "linear dw (+=) vs FD(float)");
  expect_close(minus(db, db0), gb, 1e-2, "linear dbias (+=) vs FD(float)");
  expect_close(dxv, gxd, 1e-5, "linear dinp vs FD(double)");
  expect_close(minus(dw, dw0), gwd, 1e-5, "linear dw vs FD(double)");
  expect_close(minus(db, db0), gbd, 1e-5, "linear dbias vs FD(double)");

  // accumulate_dinp true: dinp += .
  VecF dxa = randn(N * I, 17);
  const VecF dxa0 = dxa;
  VecF dw2(O * I), db2(O);
  cpu().linear_backward(dxa.data(), dw2.data(), db2.data(), R.data(), x.data(), w.data(), N, I, O, true);
  expect_close(minus(dxa, dxa0), gxd, 1e-5, "linear dinp (accumulate_dinp) vs FD(double)");

  // dbias may be null; dw still accumulates.
  VecF dw3 = dw0, dx3(N * I);
  cpu().linear_backward(dx3.data(), dw3.data(), nullptr, R.data(), x.data(), w.data(), N, I, O, false);
  expect_close(minus(dw3, dw0), gwd, 1e-5, "linear dw (no bias)");
}

// More output columns than one block of the CPU column-sum kernel, several rows.
TEST(GradCheck, LinearBiasGradientWideOutput) {
  const int64_t N = 9, I = 3, O = 300;
  VecF x = randn(N * I, 21), w = randn(O * I, 22), R = randn(N * O, 23);
  VecF dx(N * I), dw(O * I), db(O, 1.0f);
  cpu().linear_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, I, O, false);
  VecD want(O);
  for (int64_t o = 0; o < O; ++o) {
    double s = 1.0;
    for (int64_t n = 0; n < N; ++n) s += R[size_t(n * O + o)];
    want[size_t(o)] = s;
  }
  expect_close(db, want, 1e-5, "dbias (O = 300)", 0.01);
}

// ------------------------------------------------------------------------------------------------
// layernorm: out (N, C) = (x - mean) * rstd * w + b

struct LayerNormRef {
  int64_t N, C;
  double eps;
  VecD forward(const VecD& x, const VecD& w, const VecD& b, VecD* mean = nullptr, VecD* rstd = nullptr) const {
    VecD y(static_cast<size_t>(N * C));
    for (int64_t n = 0; n < N; ++n) {
      double m = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) m += x[size_t(n * C + c)];
      m /= double(C);
      for (int64_t c = 0; c < C; ++c) v += (x[size_t(n * C + c)] - m) * (x[size_t(n * C + c)] - m);
      v /= double(C);
      const double r = 1.0 / std::sqrt(v + eps);
      for (int64_t c = 0; c < C; ++c)
        y[size_t(n * C + c)] = (x[size_t(n * C + c)] - m) * r * w[size_t(c)] + b[size_t(c)];
      if (mean) mean->push_back(m);
      if (rstd) rstd->push_back(r);
    }
    return y;
  }
};

TEST(GradCheck, LayerNormForwardMatchesDoubleReference) {
  const int64_t N = 6, C = 10;
  const float eps = 1e-5f;
  VecF x = randn(N * C, 31, 2.0f, 0.7f), w = randn(C, 32, 0.5f, 1.0f), b = randn(C, 33);
  VecF y(N * C), mean(N), rstd(N);
  cpu().layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
  LayerNormRef ref{N, C, eps};
  VecD md, rd;
  VecD yd = ref.forward(to_d(x), to_d(w), to_d(b), &md, &rd);
  expect_close(y, yd, 1e-5, "layernorm out", 0.01);
  expect_close(mean, md, 1e-5, "layernorm mean", 0.01);
  expect_close(rstd, rd, 1e-5, "layernorm rstd", 0.01);
}

TEST(GradCheck, LayerNormBackwardAgainstFiniteDifferences) {
  const int64_t N = 6, C = 10;
  const float eps = 1e-5f;
  VecF x = randn(N * C, 41, 2.0f, 0.7f), w = randn(C, 42, 0.5f, 1.0f), b = randn(C, 43), R = randn(N * C, 44);
  VecF y(N * C), mean(N), rstd(N);
  auto J = [&] {
    cpu().layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
    return dot(y, R);
  };
  const VecD gx = fd_float(x, 1e-2f, J), gw = fd_float(w, 1e-2f, J), gb = fd_float(b, 1e-2f, J);
  LayerNormRef ref{N, C, eps};
  VecD xd = to_d(x), wd = to_d(w), bd = to_d(b);
  auto Jd = [&] { return dot(ref.forward(xd, wd, bd), R); };
  const VecD gxd = fd_double(xd, 1e-6, Jd), gwd = fd_double(wd, 1e-6, Jd), gbd = fd_double(bd, 1e-6, Jd);

  J();  // mean, rstd of the unperturbed input
  // All three outputs accumulate ("+=").
  const VecF dx0 = randn(N * C, 45), dw0 = randn(C, 46), db0 = randn(C, 47);
  VecF dx = dx0, dw = dw0, db = db0;
  cpu().layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(),
                           rstd.data(), N, C);
  expect_close(minus(dx, dx0), gx, 1e-2, "layernorm dinp (+=) vs FD(float)");
  expect_close(minus(dw, dw0), gw, 1e-2, "layernorm dw (+=) vs FD(float)");
  expect_close(minus(db, db0), gb, 1e-2, "layernorm db (+=) vs FD(float)");
  expect_close(minus(dx, dx0), gxd, 1e-4, "layernorm dinp vs FD(double)");
  expect_close(minus(dw, dw0), gwd, 1e-4, "layernorm dw vs FD(double)");
  expect_close(minus(db, db0), gbd, 1e-4, "layernorm db vs FD(double)");
}

// ------------------------------------------------------------------------------------------------
// attention: qkv (B, T, 3, H, D) -> out (B, T, H*D), causal, scaled by 1/sqrt(D) (the double
// reference: tests/common/gradcheck.h AttentionRef)

TEST(GradCheck, AttentionForwardMatchesDoubleReference) {
  const int64_t B = 2, T = 5, H = 2, D = 3;
  VecF qkv = randn(B * T * 3 * H * D, 51);
  VecF out(B * T * H * D, 9.0f), lse(B * H * T, 9.0f);
  cpu().attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, H, D);
  const AttentionRef ref{B, T, H, D};
  expect_close(out, ref.forward(to_d(qkv)), 1e-5, "attention out", 0.01);
  expect_close(lse, ref.lse(to_d(qkv)), 1e-5, "attention lse", 0.01);
}

TEST(GradCheck, AttentionBackwardAgainstFiniteDifferences) {
  const int64_t B = 2, T = 5, H = 2, D = 3;
  const int64_t n = B * T * 3 * H * D;
  VecF qkv = randn(n, 61), R = randn(B * T * H * D, 62);
  VecF out(B * T * H * D), lse(B * H * T);
  auto J = [&] {
    cpu().attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, H, D);
    return dot(out, R);
  };
  const VecD g = fd_float(qkv, 1e-2f, J);
  AttentionRef ref{B, T, H, D};
  VecD qd = to_d(qkv);
  const VecD gd = fd_double(qd, 1e-6, [&] { return dot(ref.forward(qd), R); });

  J();
  VecF dqkv(n, 5.0f), scratch(B * H * T, 3.0f);  // "=": stale contents must not leak in
  cpu().attention_backward(dqkv.data(), scratch.data(), R.data(), qkv.data(), out.data(), lse.data(), B, T, H, H, D);
  expect_close(dqkv, g, 1e-2, "attention dqkv vs FD(float)");
  expect_close(dqkv, gd, 1e-4, "attention dqkv vs FD(double)");
}

// Causality: an objective that reads only position t0 must give exactly zero gradient to q, k and v
// of every later position (and the finite differences agree that the output does not depend on them).
TEST(GradCheck, AttentionFuturePositionsGetZeroGradient) {
  const int64_t B = 2, T = 6, H = 2, D = 4, t0 = 2;
  const int64_t row = 3 * H * D, n = B * T * row;
  VecF qkv = randn(n, 71), R = randn(B * T * H * D, 72);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      if (t != t0)
        for (int64_t i = 0; i < H * D; ++i) R[size_t((b * T + t) * H * D + i)] = 0.0f;
  VecF out(B * T * H * D), lse(B * H * T);
  auto J = [&] {
    cpu().attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, H, D);
    return dot(out, R);
  };
  const VecD g = fd_float(qkv, 1e-2f, J);
  J();
  VecF dqkv(n, 5.0f), scratch(B * H * T);
  cpu().attention_backward(dqkv.data(), scratch.data(), R.data(), qkv.data(), out.data(), lse.data(), B, T, H, H, D);
  double past = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < row; ++i) {
        const size_t e = size_t(b * T * row + t * row + i);
        if (t > t0) {
          EXPECT_EQ(dqkv[e], 0.0f) << "gradient into future position t=" << t << " (b=" << b << ", i=" << i << ")";
          EXPECT_EQ(g[e], 0.0) << "output at t0 depends on future position t=" << t;
        } else {
          past += std::fabs(dqkv[e]);
        }
      }
  EXPECT_GT(past, 0.0);
  expect_close(dqkv, g, 1e-2, "attention dqkv (one position) vs FD(float)");
}

// ------------------------------------------------------------------------------------------------
// GELU (tanh form)

TEST(GradCheck, GeluAgainstHandValues) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) and its derivative, evaluated in double by hand.
  struct Case { float x; double y, dy; };
  const Case cases[] = {
      {0.0f, 0.0, 0.5},
      {1.0f, 0.8411919906082768, 1.0829640838457826},
      {-1.0f, -0.15880800939172324, -0.08296408384578255},
      {2.0f, 1.954597694087775, 1.0860992566236183},
      {-3.0f, -0.0036373920817729943, -0.011584166630969516},
      {0.5f, 0.34571400982514394, 0.8673699035346424},
      {5.0f, 4.999999770820381, 1.0000015463619876},
  };
  VecF x, dout;
  for (const Case& c : cases) {
    EXPECT_NEAR(gelu(c.x), c.y, 2e-7 + 1e-6 * std::fabs(c.y)) << "gelu(" << c.x << ")";
    EXPECT_NEAR(gelu_grad(c.x), c.dy, 2e-7 + 1e-6 * std::fabs(c.dy)) << "gelu_grad(" << c.x << ")";
    x.push_back(c.x);
    dout.push_back(0.5f + c.x);
  }
  const int64_t n = int64_t(x.size());
  VecF y(n), dx(n, 9.0f);
  cpu().gelu_forward(y.data(), x.data(), n);
  cpu().gelu_backward(dx.data(), dout.data(), x.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(y[size_t(i)], cases[i].y, 2e-7 + 1e-6 * std::fabs(cases[i].y));
    // 1e-6 relative: gelu_grad loses a few ulp to the cancellation in 1 - tanh^2 for large x
    EXPECT_NEAR(dx[size_t(i)], dout[size_t(i)] * cases[i].dy, 1e-6 * (1 + std::fabs(dout[size_t(i)] * cases[i].dy)));
  }
}

TEST(GradCheck, GeluBackwardAgainstFiniteDifferences) {
  const int64_t n = 40;
  VecF x = randn(n, 81, 2.0f), R = randn(n, 82);
  VecF y(n);
  auto J = [&] {
    cpu().gelu_forward(y.data(), x.data(), n);
    return dot(y, R);
  };
  const VecD g = fd_float(x, 1e-2f, J);
  VecF dx(n, 9.0f);
  cpu().gelu_backward(dx.data(), R.data(), x.data(), n);
  expect_close(dx, g, 1e-2, "gelu dinp vs FD(float)");
  // In place (dinp == dout), as the model uses it.
  VecF inplace = R;
  cpu().gelu_backward(inplace.data(), inplace.data(), x.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(inplace[size_t(i)], dx[size_t(i)]);
}

// ------------------------------------------------------------------------------------------------
// vocab-parallel embedding

// A full vocabulary of 11 rows split into shards of 4 rows ([0,4), [4,8), [8,12) with row 11 padding);
// tokens repeat and fall inside and outside each shard.
TEST(GradCheck, EmbeddingVocabParallelForwardBackward) {
  const int64_t V = 11, Vl = 4, C = 70, N = 9;  // C > 64: more than one column block of the CPU kernel
  const std::vector<int32_t> tokens = {5, 0, 5, 10, 3, 5, 7, 4, 0};
  VecF full = randn(V * C, 91);
  VecF R = randn(N * C, 92);
  VecF sum_out(N * C, 0.0f);
  for (int64_t v0 = 0; v0 < 12; v0 += Vl) {
    const int64_t rows = Vl;  // the local table; rows >= V stay zero (padding)
    VecF wte(rows * C, 0.0f);
    for (int64_t r = 0; r < rows && v0 + r < V; ++r)
      std::copy_n(full.begin() + (v0 + r) * C, C, wte.begin() + r * C);
    VecF out(N * C, 9.0f);
    auto J = [&] {
      cpu().embedding_forward(out.data(), tokens.data(), wte.data(), N, C, v0, rows);
      return dot(out, R);
    };
    J();
    // forward: own rows copied, other tokens give zero rows
    for (int64_t n = 0; n < N; ++n) {
      const int64_t r = tokens[size_t(n)] - v0;
      const bool in = r >= 0 && r < rows;
      for (int64_t c = 0; c < C; ++c) {
        EXPECT_EQ(out[size_t(n * C + c)], in ? wte[size_t(r * C + c)] : 0.0f) << "v0=" << v0 << " n=" << n;
        sum_out[size_t(n * C + c)] += out[size_t(n * C + c)];
      }
    }
    const VecD g = fd_float(wte, 1e-2f, J);
    // backward "+=": the sum of R rows of every (repeated) token of this shard
    const VecF dw0 = randn(rows * C, 93);
    VecF dw = dw0;
    cpu().embedding_backward(dw.data(), tokens.data(), R.data(), N, C, v0, rows);
    VecD want(size_t(rows * C), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t r = tokens[size_t(n)] - v0;
      if (r < 0 || r >= rows) continue;
      for (int64_t c = 0; c < C; ++c) want[size_t(r * C + c)] += R[size_t(n * C + c)];
    }
    const VecD got = minus(dw, dw0);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << "v0=" << v0 << " i=" << i;
      EXPECT_NEAR(got[i], g[i], 1e-2 * (1 + std::fabs(g[i]))) << "vs FD, v0=" << v0 << " i=" << i;
    }
    // rows of tokens that never occur (and padding rows) get nothing
    for (int64_t r = 0; r < rows; ++r) {
      if (std::find(tokens.begin(), tokens.end(), int32_t(v0 + r)) != tokens.end()) continue;
      for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dw[size_t(r * C + c)], dw0[size_t(r * C + c)]);
    }
  }
  // the shards' outputs sum to the full embedding (what the TP all-reduce relies on)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      EXPECT_EQ(sum_out[size_t(n * C + c)], full[size_t(tokens[size_t(n)] * C + c)]);
}

TEST(GradCheck, PositionEmbeddingForwardBackward) {
  const int64_t B = 3, T = 4, C = 5;
  VecF wpe = randn(T * C, 101), R = randn(B * T * C, 102), base = randn(B * T * C, 103);
  VecF out(B * T * C);
  auto J = [&] {
    out = base;
    cpu().add_position_embedding(out.data(), wpe.data(), B, T, C);
    return dot(out, R);
  };
  J();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const size_t e = size_t((b * T + t) * C + c);
        EXPECT_EQ(out[e], base[e] + wpe[size_t(t * C + c)]);
      }
  const VecD g = fd_float(wpe, 1e-2f, J);
  const VecF dw0 = randn(T * C, 104);
  VecF dw = dw0;
  cpu().position_embedding_backward(dw.data(), R.data(), B, T, C);
  VecD want(size_t(T * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T * C; ++i) want[size_t(i)] += R[size_t(b * T * C + i)];
  expect_close(minus(dw, dw0), want, 1e-5, "dwpe (+=) vs sum over B", 0.01);
  expect_close(minus(dw, dw0), g, 1e-2, "dwpe vs FD(float)");
}

// ------------------------------------------------------------------------------------------------
// vocab-parallel cross-entropy: the three steps on every shard, with the TP reductions done by hand.

struct XentShards {
  int64_t N, Vp, Vl, V;
  std::vector<int32_t> targets;
  float dloss_scale;
  // Runs the three steps over the shards of `logits` (N, Vp); returns per-token losses; if dlogits is
  // given, it receives the stitched gradient (N, Vp).
  VecF run(const VecF& logits, VecF* dlogits) const {
    const int64_t T = Vp / Vl;
    std::vector<VecF> shard(size_t(T), VecF(size_t(N * Vl)));
    for (int64_t r = 0; r < T; ++r)
      for (int64_t n = 0; n < N; ++n)
        std::copy_n(logits.begin() + n * Vp + r * Vl, Vl, shard[size_t(r)].begin() + n * Vl);
    // step 1 on each shard, then all-reduce max and sum of target logits
    VecF row_max(size_t(N), -std::numeric_limits<float>::infinity()), target(size_t(N), 0.0f);
    for (int64_t r = 0; r < T; ++r) {
      VecF mx(size_t(N), 7.0f), tl(size_t(N), 7.0f);
      cpu().xent_local_max(mx.data(), tl.data(), shard[size_t(r)].data(), targets.data(), N, Vl, r * Vl, V);
      for (int64_t n = 0; n < N; ++n) {
        row_max[size_t(n)] = std::max(row_max[size_t(n)], mx[size_t(n)]);
        target[size_t(n)] += tl[size_t(n)];
      }
    }
    // step 2, then all-reduce the sums
    VecF sum_exp(size_t(N), 0.0f);
    for (int64_t r = 0; r < T; ++r) {
      VecF se(size_t(N), 7.0f);
      cpu().xent_local_sumexp(se.data(), shard[size_t(r)].data(), row_max.data(), N, Vl, r * Vl, V);
      for (int64_t n = 0; n < N; ++n) sum_exp[size_t(n)] += se[size_t(n)];
    }
    // step 3 on each shard: the losses agree on every shard
    VecF losses(static_cast<size_t>(N));
    for (int64_t r = 0; r < T; ++r) {
      VecF l(size_t(N), 7.0f);
      VecF& s = shard[size_t(r)];
      const VecF before = s;
      cpu().xent_loss_grad(s.data(), l.data(), row_max.data(), sum_exp.data(), target.data(), targets.data(), N,
                           Vl, r * Vl, V, dloss_scale, dlogits != nullptr);
      if (!dlogits) {
        EXPECT_EQ(s, before) << "want_grad = false must leave the logits alone";
      }
      if (r == 0) {
        losses = l;
      } else {
        EXPECT_EQ(l, losses) << "shard " << r << " computed different losses";
      }
      if (dlogits)
        for (int64_t n = 0; n < N; ++n)
          std::copy_n(s.begin() + n * Vl, Vl, dlogits->begin() + n * Vp + r * Vl);
    }
    return losses;
  }
};

// Per-token loss in double over the valid columns only.
VecD xent_ref(const VecF& logits, const std::vector<int32_t>& targets, int64_t N, int64_t Vp, int64_t V) {
  VecD out(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(logits[size_t(n * Vp + j)]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(logits[size_t(n * Vp + j)]) - mx);
    out[size_t(n)] = std::log(s) + mx - logits[size_t(n * Vp + targets[size_t(n)])];
  }
  return out;
}

void check_cross_entropy(int64_t Vl, int64_t Vp) {
  SCOPED_TRACE("Vl=" + std::to_string(Vl) + " Vp=" + std::to_string(Vp));
  const int64_t N = 7, V = 10;
  XentShards xs{N, Vp, Vl, V, {0, 9, 3, 4, 9, 7, 1}, 0.25f};
  VecF logits = randn(N * Vp, 111, 2.0f);
  // Padding columns get large values: if they leaked into the max or the sum, the loss would change.
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = V; j < Vp; ++j) logits[size_t(n * Vp + j)] = 30.0f + float(j);

  const VecF losses = xs.run(logits, nullptr);
  const VecD ref = xent_ref(logits, xs.targets, N, Vp, V);
  expect_close(losses, ref, 1e-5, "per-token losses vs double reference", 0.01);

  // J = dloss_scale * sum(losses): the analytic gradient is (softmax - onehot) * dloss_scale.
  auto J = [&] {
    VecF l = xs.run(logits, nullptr);
    double s = 0;
    for (float x : l) s += x;
    return s * xs.dloss_scale;
  };
  const VecD g = fd_float(logits, 1e-2f, J);
  VecF dl(size_t(N * Vp), 99.0f);
  const VecF losses_g = xs.run(logits, &dl);
  EXPECT_EQ(losses_g, losses);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = V; j < Vp; ++j) {
      EXPECT_EQ(dl[size_t(n * Vp + j)], 0.0f) << "padded column " << j << " has a gradient";
      EXPECT_EQ(g[size_t(n * Vp + j)], 0.0) << "padded column " << j << " changes the loss";
    }
  expect_close(dl, g, 1e-2, "dlogits vs FD(float)");
  // and against the closed form in double
  VecD want(size_t(N * Vp), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(logits[size_t(n * Vp + j)]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(logits[size_t(n * Vp + j)]) - mx);
    for (int64_t j = 0; j < V; ++j)
      want[size_t(n * Vp + j)] = xs.dloss_scale * (std::exp(double(logits[size_t(n * Vp + j)]) - mx) / s -
                                                   (j == xs.targets[size_t(n)] ? 1.0 : 0.0));
  }
  expect_close(dl, want, 1e-5, "dlogits vs closed form", 0.01);
}

TEST(GradCheck, CrossEntropySingleShardWithPadding) { check_cross_entropy(12, 12); }
TEST(GradCheck, CrossEntropyThreeShardsPaddingInLastShard) { check_cross_entropy(4, 12); }
// The last of four shards holds nothing but padding (its local max is -inf).
TEST(GradCheck, CrossEntropyFourShardsOneAllPadding) { check_cross_entropy(4, 16); }

// A GPT-2-wide row (50257 ids in a 50304 shard): the sum of exps is accurate to a few ulp of fp32
// against a double-precision sum (a plain fp32 accumulation over 50k terms is not: issue 14).
TEST(GradCheck, CrossEntropyWideRowSumExpIsAccurate) {
  const int64_t N = 4, Vl = 50304, V = 50257;
  VecF logits = randn(N * Vl, 121, 3.0f);
  std::vector<int32_t> targets = {0, 17, 50256, 4096};
  VecF row_max(N), target(N), sum_exp(N);
  cpu().xent_local_max(row_max.data(), target.data(), logits.data(), targets.data(), N, Vl, 0, V);
  cpu().xent_local_sumexp(sum_exp.data(), logits.data(), row_max.data(), N, Vl, 0, V);
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(logits[size_t(n * Vl + j)]) - double(row_max[size_t(n)]));
    EXPECT_NEAR(sum_exp[size_t(n)], s, 5e-7 * s) << "row " << n;
  }
}

// ------------------------------------------------------------------------------------------------
// AdamW against torch.optim.AdamW

TEST(GradCheck, AdamWMatchesTorchSteps) {
  // torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd) in float64, three
  // steps with the gradients below; p after each step (printed by torch 2.x).
  const double g[3][4] = {{0.5, -0.2, 0.0, 1.5}, {0.1, 0.3, -0.4, -1.0}, {-0.7, 0.05, 0.2, 0.6}};
  const double torch_decay[3][4] = {
      {0.890000002, -0.39500000499999977, 0.2475, 1.8800000006666666},
      {0.8007959063646517, -0.41582018559194284, 0.31943867972643514, 1.846747947801735},
      {0.8079146757855139, -0.43940808694731165, 0.3391083296199268, 1.7974930982071475}};
  const double torch_nodecay[3][4] = {
      {0.900000002, -0.40000000499999977, 0.25, 1.9000000006666666},
      {0.8196959063846518, -0.42477018564194285, 0.32441367972643514, 1.8855479478084016},
      {0.8348226348691605, -0.4525162888532311, 0.3472777164171912, 1.8547605776918314}};
  const double m_final[4] = {-0.02049999999999999, 0.01579999999999999, -0.016, 0.0915};
  const double v_final[4] = {0.0007494902500000006, 0.0001323300400000001, 0.00019984000000000023,
                             0.003604502250000003};
  for (bool decay : {true, false}) {
    SCOPED_TRACE(decay ? "decay" : "no decay");
    VecF p = {1.0f, -0.5f, 0.25f, 2.0f}, m(4, 0.0f), v(4, 0.0f);
    VecF p1 = p, m1 = m, v1 = v;  // through adamw_update directly
    for (int s = 1; s <= 3; ++s) {
      AdamWParams a{0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, float(1.0 - std::pow(0.9, s)), float(1.0 - std::pow(0.999, s)),
                    float(1.0 - 0.9), float(1.0 - 0.999)};
      VecF gf(4);
      for (int i = 0; i < 4; ++i) gf[size_t(i)] = float(g[s - 1][i]);
      std::vector<uint16_t> c(4);  // the bf16 compute copy
      cpu().adamw(p.data(), gf.data(), m.data(), v.data(), 4, a, decay, Buf(c.data(), DType::BF16));
      for (int i = 0; i < 4; ++i) adamw_update(p1[size_t(i)], gf[size_t(i)], m1[size_t(i)], v1[size_t(i)], a, decay);
      for (int i = 0; i < 4; ++i) {
        const double want = decay ? torch_decay[s - 1][i] : torch_nodecay[s - 1][i];
        EXPECT_NEAR(p[size_t(i)], want, 3e-6) << "step " << s << " element " << i;
        EXPECT_EQ(p1[size_t(i)], p[size_t(i)]);
        EXPECT_EQ(c[size_t(i)], master_to_bf16(p[size_t(i)]));  // the compute copy, in the same pass
      }
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(m[size_t(i)], m_final[i], 1e-6 * std::fabs(m_final[i]));
      EXPECT_NEAR(v[size_t(i)], v_final[i], 2e-6 * v_final[i]);  // (1 - beta) computed in double, as torch does
    }
  }
}

// One step by hand: p = 1, g = 0.5, lr = 0.1, wd = 0.1, betas (0.9, 0.999), step 1:
// p = 1 * (1 - 0.01) = 0.99; m = 0.05; v = 0.00025; m_hat = 0.5; v_hat = 0.25; p -= 0.1 * 0.5 / (0.5 + eps).
TEST(GradCheck, AdamWOneStepByHand) {
  AdamWParams a{0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.1f, 0.001f, float(1.0 - 0.9), float(1.0 - 0.999)};
  float p = 1.0f, m = 0.0f, v = 0.0f;
  adamw_update(p, 0.5f, m, v, a, true);
  EXPECT_NEAR(p, 0.89, 1e-6);
  EXPECT_NEAR(m, 0.05, 1e-6 * 0.05);
  EXPECT_NEAR(v, 0.00025, 2e-6 * 0.00025);
  // without decay the first step moves by exactly lr (sign of g)
  p = 1.0f, m = 0.0f, v = 0.0f;
  adamw_update(p, -3.0f, m, v, a, false);
  EXPECT_NEAR(p, 1.1, 1e-6);
}

}  // namespace
}  // namespace tpt

namespace tpt {
namespace {
// fast_exp (the CPU cross-entropy's exp) against libm in double, over the whole useful range.
TEST(GradCheck, FastExpWithin2UlpOfExp) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.37f; x += 0.0137f) {
    const double want = std::exp(double(x));
    const double got = fast_exp(x);
    const double ulp = std::nextafter(float(want), INFINITY) - float(want);
    worst = std::max(worst, std::fabs(got - want) / ulp);
  }
  EXPECT_LT(worst, 2.0);
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
  EXPECT_GT(fast_exp(-1000.0f), 0.0f);
  EXPECT_LT(fast_exp(-1000.0f), 1e-37f);
  EXPECT_TRUE(std::isnan(fast_exp(NAN)));  // a nan stays a nan (the clamp's fmaxf would drop it)
  EXPECT_TRUE(std::isnan(gelu_grad(NAN)));
  // finite above the range: the clamp keeps the power of two below the infinity exponent
  for (float x : {88.37f, 88.38f, 88.5f, 88.72f, 89.0f, 1000.0f, INFINITY}) {
    EXPECT_TRUE(std::isfinite(fast_exp(x))) << x;
    EXPECT_GT(fast_exp(x), 2e38f) << x;
  }
}

// GELU's derivative tends to 1 for large x (0 for very negative x) and stays finite for every
// input: one large fc1 pre-activation must not turn a step's gradients into nans (it did above
// x ~ 10.1, where exp(2u) overflowed 4 e / (e + 1)^2 into inf / inf).
TEST(GradCheck, GeluGradFiniteForLargeInputs) {
  for (float x : {6.0f, 6.7f, 8.0f, 10.0f, 10.3f, 12.0f, 30.0f, 100.0f, 1e6f, 1e30f}) {
    EXPECT_NEAR(gelu_grad(x), 1.0f, 1e-6f) << x;
    EXPECT_EQ(gelu(x), x) << x;
  }
  for (float x : {-10.0f, -12.0f, -100.0f, -1e6f, -1e30f}) {
    EXPECT_TRUE(std::isfinite(gelu_grad(x))) << x;
    EXPECT_NEAR(gelu_grad(x), 0.0f, 1e-6f) << x;
  }
  VecF x = {10.3f, 12.0f, 100.0f, -100.0f}, dout = {2.0f, 3.0f, 4.0f, 5.0f}, dx(4, 9.0f);
  cpu().gelu_backward(dx.data(), dout.data(), x.data(), 4);
  EXPECT_EQ(dx[0], 2.0f);
  EXPECT_EQ(dx[1], 3.0f);
  EXPECT_EQ(dx[2], 4.0f);
  EXPECT_NEAR(dx[3], 0.0f, 1e-6f);
}
}  // namespace
}  // namespace tpt
