// Grouped-query attention in the CPU backend's attention kernels (core/ops.h attention_forward /
// attention_backward; split from llama_ops_test.cpp, in its style): query head h reads key/value
// head h / (H / KV). Against multi-head attention on repeated K/V heads (a double reference) and
// finite differences; KV = H bit for bit equal to the multi-head kernel as it was before
// grouped-query attention (a frozen copy below); bf16 storage is the fp32 result rounded once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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
// Attention with KV heads: qkv (B, T, (H + 2 KV) D), query head h with key/value head h / (H / KV)

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
    const VecD out_d = AttentionRef{B, T, H, D}.forward(repeat_kv(to_d(qkv), B * T, H, KV, D), &lse_d);
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
    const AttentionRef ref{B, T, H, D};
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
    expect_close(out, AttentionRef{c.B, c.T, c.H, c.D}.forward(to_d(qkv)), 1e-5, "out vs double reference", 0.01);
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
