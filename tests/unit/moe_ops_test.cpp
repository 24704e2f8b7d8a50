// The Mixture-of-Experts token movement ops (core/ops.h gather_rows, combine_rows, row_dots; CPU:
// core/cpu/moe_kernels.cpp behind CpuOps) on the CPU backend with two threads, against
// double-precision references written here:
//   - fp32: gather_rows bit for bit (a copy, or one product rounded), combine_rows and row_dots
//     within fp32 summation error of the double sums (a wrong row or weight is off by O(1));
//   - 16-bit storage (bf16, fp16): inputs exactly representable, each stored result the fp32 call's
//     result on the same values rounded once, and within one rounding of the double reference;
//   - index < 0 (a dropped token: a zero row, a skipped term, a zero dot), scale / w null or given,
//     accumulate false (the output's old contents overwritten) and true, K = 1 and K > 1, rows read
//     more than once, an input longer than the rows read;
//   - the dispatch round trip of an MoE layer: gather_rows to expert-sorted rows, combine_rows back
//     with the routing weights, combine_rows with the inverse indices as gather_rows' adjoint, and
//     row_dots as the derivative of the combination in its weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/ops.h"
#include "tests/common/gradcheck.h"

namespace tpt {
namespace {

using namespace test;  // tests/common/gradcheck.h: cpu(), randn, VecF, VecD
using VecI = std::vector<int32_t>;

constexpr DType kTypes[] = {DType::F32, DType::BF16, DType::F16};
const char* type_name(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F16 ? "fp16" : "fp32"; }

// Values rounded to dtype t: exactly representable in its storage.
VecF representable(VecF v, DType t) {
  for (float& x : v) x = round_to(x, t);
  return v;
}

// A tensor in the storage of dtype t (fp32 values, or 16-bit bits), and its values back as floats.
class Stored {
 public:
  Stored(const VecF& v, DType t) : t_(t), f_(v) {
    if (t == DType::F32) return;
    h_.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) h_[i] = t == DType::BF16 ? fp32_to_bf16(v[i]) : fp32_to_fp16(v[i]);
  }
  Buf buf() { return t_ == DType::F32 ? Buf(f_.data()) : Buf(h_.data(), t_); }
  CBuf cbuf() const { return t_ == DType::F32 ? CBuf(f_.data()) : CBuf(h_.data(), t_); }
  VecF values() const {
    if (t_ == DType::F32) return f_;
    VecF v(h_.size());
    for (size_t i = 0; i < h_.size(); ++i) v[i] = t_ == DType::BF16 ? bf16_to_fp32(h_[i]) : fp16_to_fp32(h_[i]);
    return v;
  }
  const std::vector<uint16_t>& bits() const { return h_; }

 private:
  DType t_;
  VecF f_;
  std::vector<uint16_t> h_;
};

// Indices in [-1, rows) with about one in `drop` negative (-1 or another negative value), every row
// index drawn from `rows` < the count so that rows are read more than once.
VecI random_indices(int64_t n, int64_t rows, uint32_t seed, int drop = 5) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> row(0, int32_t(rows - 1)), coin(0, drop - 1);
  VecI idx(static_cast<size_t>(n));
  for (auto& i : idx) i = coin(gen) == 0 ? (gen() % 2 ? -1 : -7) : row(gen);
  return idx;
}

// |got - want| <= half a rounding step of dtype t at |want| + rel * bound elementwise, bound[i]
// the sum of the magnitudes of element i's terms (the fp32 summation error's scale).
void expect_within(const VecF& got, const VecD& want, const VecD& bound, DType t, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const int mant = t == DType::BF16 ? 8 : t == DType::F16 ? 11 : 24;
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double half_ulp = want[i] == 0 ? 0 : std::ldexp(1.0, std::ilogb(std::fabs(want[i])) - mant);
    if (t == DType::F16) half_ulp = std::max(half_ulp, std::ldexp(1.0, -25));  // fp16's subnormals
    const double tol = half_ulp + rel * bound[i];
    if (!(std::fabs(double(got[i]) - want[i]) <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (tol " << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " elements off";
}

// ================================================================================================
// References in double

// out (R, C): row r = scale[r] * in row idx[r] (scale null: 1), zeros where idx[r] < 0
VecD gather_ref(const VecF& in, const VecI& idx, const VecF* scale, int64_t C) {
  VecD out(idx.size() * size_t(C), 0.0);
  for (size_t r = 0; r < idx.size(); ++r) {
    if (idx[r] < 0) continue;
    const double s = scale ? double((*scale)[r]) : 1.0;
    for (int64_t c = 0; c < C; ++c) out[r * size_t(C) + size_t(c)] = s * in[size_t(idx[r]) * size_t(C) + size_t(c)];
  }
  return out;
}

// out (N, C): row t = (accumulate ? out0 row t : 0) + sum over j of w[t K + j] * in row idx[t K + j];
// *mag: the sums of the terms' magnitudes
VecD combine_ref(const VecF& out0, const VecF& in, const VecI& idx, const VecF* w, int64_t N, int64_t K, int64_t C,
                 bool accumulate, VecD* mag = nullptr) {
  VecD out(size_t(N * C), 0.0), m(size_t(N * C), 0.0);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c) {
      const size_t o = size_t(t * C + c);
      if (accumulate) out[o] = out0[o], m[o] = std::fabs(double(out0[o]));
      for (int64_t j = 0; j < K; ++j) {
        const int32_t r = idx[size_t(t * K + j)];
        if (r < 0) continue;
        const double term = (w ? double((*w)[size_t(t * K + j)]) : 1.0) * in[size_t(r) * size_t(C) + size_t(c)];
        out[o] += term, m[o] += std::fabs(term);
      }
    }
  if (mag) *mag = m;
  return out;
}

// out (N K): dot(a row t, b row idx[t K + j]), 0 where idx < 0; *mag: the sums of |a b|
VecD row_dots_ref(const VecF& a, const VecF& b, const VecI& idx, int64_t N, int64_t K, int64_t C,
                  VecD* mag = nullptr) {
  VecD out(size_t(N * K), 0.0), m(size_t(N * K), 0.0);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = idx[size_t(t * K + j)];
      if (r < 0) continue;
      for (int64_t c = 0; c < C; ++c) {
        const double p = double(a[size_t(t * C + c)]) * b[size_t(r) * size_t(C) + size_t(c)];
        out[size_t(t * K + j)] += p, m[size_t(t * K + j)] += std::fabs(p);
      }
    }
  if (mag) *mag = m;
  return out;
}

// ================================================================================================
// gather_rows

TEST(MoeOps, GatherRowsMatchesDoubleReference) {
  for (DType t : kTypes)
    for (int64_t C : {int64_t(1), int64_t(5), int64_t(130)})
      for (bool scaled : {false, true}) {
        SCOPED_TRACE(std::string(type_name(t)) + " C = " + std::to_string(C) + (scaled ? " scaled" : ""));
        const int64_t M = 11, R = 29;  // R > M rows out of M: repeats
        const VecF x = representable(randn(size_t(M * C), 401, 2.0f), t), s = randn(size_t(R), 402, 0.5f, 0.3f);
        VecI idx = random_indices(R, M - 2, 403);  // the last two input rows are never read ...
        idx[3] = idx[17] = 4;                        // ... a row read three times at least
        idx[0] = -1, idx[R - 1] = -3;                // dropped rows at both ends
        const Stored in(x, t);
        Stored out(VecF(size_t(R * C), 9.0f), t);  // stale contents: every row is written
        cpu().gather_rows(out.buf(), in.cbuf(), idx.data(), scaled ? s.data() : nullptr, R, C);
        const VecD want = gather_ref(x, idx, scaled ? &s : nullptr, C);
        const VecF got = out.values();
        if (!scaled || t == DType::F32) {
          // a copy is exact in every dtype; an fp32 product is the double product rounded once
          VecF w(want.size());
          for (size_t i = 0; i < w.size(); ++i) w[i] = float(want[i]);
          EXPECT_EQ(got, w);
        } else {
          // 16-bit: the fp32 product rounded once to the storage
          VecF f(size_t(R * C));
          cpu().gather_rows(f.data(), x.data(), idx.data(), s.data(), R, C);
          const Stored rounded(f, t);
          EXPECT_EQ(out.bits(), rounded.bits()) << "the fp32 product rounded once";
          VecD mag(want.size());  // and within one rounding (of the fp32 product, rounded again) of the double
          for (size_t i = 0; i < mag.size(); ++i) mag[i] = std::fabs(want[i]);
          expect_within(got, want, mag, t, 1e-7, "gather_rows");
        }
        for (int64_t c = 0; c < C; ++c) {
          EXPECT_EQ(got[size_t(c)], 0.0f) << "idx < 0: a zero row";
          EXPECT_EQ(got[size_t((R - 1) * C + c)], 0.0f) << "idx < 0 (not -1): a zero row";
        }
      }
}

// R = 0 and all rows dropped: no input row is read (the input may be empty / null).
TEST(MoeOps, GatherRowsOfNoRows) {
  for (DType t : kTypes) {
    SCOPED_TRACE(type_name(t));
    const int64_t C = 6;
    cpu().gather_rows(Buf(nullptr, t), CBuf(nullptr, t), nullptr, nullptr, 0, C);
    const VecI idx = {-1, -1, -2};
    Stored out(VecF(size_t(3 * C), 5.0f), t);
    cpu().gather_rows(out.buf(), CBuf(nullptr, t), idx.data(), nullptr, 3, C);
    EXPECT_EQ(out.values(), VecF(size_t(3 * C), 0.0f));
  }
}

// ================================================================================================
// combine_rows

struct CombineCase {
  int64_t N, K, C;
};

TEST(MoeOps, CombineRowsMatchesDoubleReference) {
  for (DType t : kTypes)
    for (CombineCase cc : {CombineCase{9, 1, 5}, CombineCase{13, 2, 37}, CombineCase{7, 4, 130}, CombineCase{5, 8, 3}})
      for (bool weighted : {false, true})
        for (bool accumulate : {false, true}) {
          const int64_t N = cc.N, K = cc.K, C = cc.C, M = std::max<int64_t>(3, N * K / 2);  // M < N K: repeats
          SCOPED_TRACE(std::string(type_name(t)) + " N " + std::to_string(N) + " K " + std::to_string(K) + " C " +
                       std::to_string(C) + (weighted ? " weighted" : "") + (accumulate ? " +=" : " ="));
          const VecF x = representable(randn(size_t(M * C), 411, 1.5f), t),
                     out0 = representable(randn(size_t(N * C), 412), t), w = randn(size_t(N * K), 413, 0.4f, 0.2f);
          VecI idx = random_indices(N * K, M, 414, 4);
          for (int64_t j = 0; j < K; ++j) idx[size_t(K + j)] = -1;  // token 1: every choice dropped
          idx[size_t(2 * K)] = 0;                                  // row 0 read by tokens 2 and 3
          idx[size_t(3 * K)] = 0;
          const Stored in(x, t);
          Stored out(out0, t);
          const float* wp = weighted ? w.data() : nullptr;
          cpu().combine_rows(out.buf(), in.cbuf(), idx.data(), wp, N, K, C, accumulate);
          VecD mag;
          const VecD want = combine_ref(out0, x, idx, weighted ? &w : nullptr, N, K, C, accumulate, &mag);
          const VecF got = out.values();
          expect_within(got, want, mag, t, 2e-6, "combine_rows");
          for (int64_t c = 0; c < C; ++c)  // token 1's row: its old contents, or zeros
            EXPECT_EQ(got[size_t(C + c)], accumulate ? out0[size_t(C + c)] : 0.0f) << "every choice dropped";
          if (t != DType::F32) {
            // the fp32 call on the same values, rounded once to the storage
            VecF f = out0;
            cpu().combine_rows(f.data(), x.data(), idx.data(), wp, N, K, C, accumulate);
            EXPECT_EQ(out.bits(), Stored(f, t).bits()) << "the fp32 sum rounded once";
          }
        }
}

// ================================================================================================
// row_dots

TEST(MoeOps, RowDotsMatchDoubleReference) {
  for (DType t : kTypes)
    for (CombineCase cc : {CombineCase{9, 1, 5}, CombineCase{13, 2, 37}, CombineCase{6, 4, 300}}) {
      const int64_t N = cc.N, K = cc.K, C = cc.C, M = std::max<int64_t>(3, N * K / 2);
      SCOPED_TRACE(std::string(type_name(t)) + " N " + std::to_string(N) + " K " + std::to_string(K) + " C " +
                   std::to_string(C));
      const VecF a = representable(randn(size_t(N * C), 421), t), b = representable(randn(size_t(M * C), 422), t);
      VecI idx = random_indices(N * K, M, 423, 4);
      idx[0] = -1;
      idx[size_t(K)] = idx[size_t(2 * K)] = M - 1;  // the last row, twice
      const Stored as(a, t), bs(b, t);
      VecF got(size_t(N * K), 9.0f);  // stale contents: every entry is written
      cpu().row_dots(got.data(), as.cbuf(), bs.cbuf(), idx.data(), N, K, C);
      VecD mag;
      const VecD want = row_dots_ref(a, b, idx, N, K, C, &mag);
      expect_within(got, want, mag, DType::F32, 2e-6 * std::sqrt(double(C)), "row_dots");
      EXPECT_EQ(got[0], 0.0f) << "idx < 0: a zero dot";
      if (t != DType::F32) {  // the 16-bit operands read exactly: the fp32 call's dots bit for bit
        VecF f(size_t(N * K));
        cpu().row_dots(f.data(), a.data(), b.data(), idx.data(), N, K, C);
        EXPECT_EQ(got, f);
      }
    }
}

// ================================================================================================
// The dispatch of an MoE layer: N tokens, K choices each among E experts (some dropped), the
// assignments sorted by expert (then token): perm[r] = the token of sorted row r, pos[t K + j] = the
// sorted row of token t's choice j (-1: dropped).

struct Dispatch {
  VecI perm, pos;
};

Dispatch route(int64_t N, int64_t K, int64_t E, uint32_t seed) {
  std::mt19937 gen(seed);
  VecI expert(size_t(N * K));
  for (int64_t t = 0; t < N; ++t) {
    VecI e(static_cast<size_t>(E));
    for (int64_t i = 0; i < E; ++i) e[size_t(i)] = int32_t(i);
    std::shuffle(e.begin(), e.end(), gen);  // K distinct experts
    for (int64_t j = 0; j < K; ++j) expert[size_t(t * K + j)] = gen() % 6 == 0 ? -1 : e[size_t(j)];
  }
  Dispatch d;
  d.pos.assign(size_t(N * K), -1);
  for (int32_t e = 0; e < E; ++e)
    for (int64_t t = 0; t < N; ++t)
      for (int64_t j = 0; j < K; ++j)
        if (expert[size_t(t * K + j)] == e) {
          d.pos[size_t(t * K + j)] = int32_t(d.perm.size());
          d.perm.push_back(int32_t(t));
        }
  return d;
}

TEST(MoeOps, DispatchRoundTripAdjointAndWeightGradient) {
  const int64_t N = 17, K = 3, E = 5, C = 12;
  const Dispatch d = route(N, K, E, 431);
  const int64_t R = int64_t(d.perm.size());
  ASSERT_GT(R, N);
  ASSERT_LT(R, N * K);  // some dropped
  const VecF x = randn(size_t(N * C), 432), w = randn(size_t(N * K), 433, 0.3f, 0.3f),
             y = randn(size_t(R * C), 434), dy = randn(size_t(N * C), 435);

  // forward: permute, identity experts, unpermute weighted: token t gets (sum of its kept w) x_t
  VecF sorted(size_t(R * C)), back(size_t(N * C));
  cpu().gather_rows(sorted.data(), x.data(), d.perm.data(), nullptr, R, C);
  cpu().combine_rows(back.data(), sorted.data(), d.pos.data(), w.data(), N, K, C, false);
  VecD want(size_t(N * C));
  for (int64_t t = 0; t < N; ++t) {
    double ws = 0;
    for (int64_t j = 0; j < K; ++j) ws += d.pos[size_t(t * K + j)] >= 0 ? double(w[size_t(t * K + j)]) : 0.0;
    for (int64_t c = 0; c < C; ++c) want[size_t(t * C + c)] = ws * x[size_t(t * C + c)];
  }
  expect_close(back, want, 1e-6, "permute + unpermute");

  // adjoint: <gather(x, perm, s), y> = <x, combine(y, pos, s by pos)>, the permutation's backward
  VecF s(static_cast<size_t>(R)), ws(size_t(N * K), 0.0f);
  for (size_t i = 0; i < ws.size(); ++i)
    if (d.pos[i] >= 0) s[size_t(d.pos[i])] = ws[i] = w[i];
  VecF gx(size_t(R * C)), cy(size_t(N * C));
  cpu().gather_rows(gx.data(), x.data(), d.perm.data(), s.data(), R, C);
  cpu().combine_rows(cy.data(), y.data(), d.pos.data(), ws.data(), N, K, C, false);
  EXPECT_NEAR(dot(gx, y), dot(x, cy), 1e-5 * (1 + std::fabs(dot(x, cy))));

  // weights' gradient: d/dw[t K + j] <dy, combine(y, pos, w)> = row_dots(dy, y, pos), by central
  // differences of the double reference
  VecF g(size_t(N * K));
  cpu().row_dots(g.data(), dy.data(), y.data(), d.pos.data(), N, K, C);
  VecD fd(size_t(N * K));
  for (size_t i = 0; i < fd.size(); ++i) {
    auto loss = [&](float wi) {
      VecF wv = w;
      wv[i] = wi;
      const VecD o = combine_ref(VecF(), y, d.pos, &wv, N, K, C, false);
      double l = 0;
      for (size_t k = 0; k < o.size(); ++k) l += o[k] * dy[k];
      return l;
    };
    const float wp = w[i] + 0.01f, wm = w[i] - 0.01f;  // the rounded steps in the denominator
    fd[i] = (loss(wp) - loss(wm)) / (double(wp) - double(wm));
  }
  expect_close(g, fd, 1e-4, "row_dots as the weights' gradient");
}

}  // namespace
}  // namespace tpt
