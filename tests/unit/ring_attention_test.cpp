// Context parallelism's ring attention (parallel/context_parallel.h) on CP thread ranks of the CPU
// backend against a direct full-sequence causal attention written here in double precision: the
// forward output, the log-sum-exp and the gradients of q, k and v, for CP 1..4 with grouped-query
// attention (G < H), fp32 and bf16 storage, also on the CP groups of a TP x CP grid; the token
// layout of the load-balanced chunks; and the GPU's cuDNN calls of each ring block (their masks).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/cuda/attention/ring_calls.h"
#include "core/ops.h"
#include "parallel/context_parallel.h"
#include "parallel/thread_comm.h"

namespace tpt {
namespace {

struct Shape {
  int64_t B, S, H, KV, D;
  int64_t row() const { return (H + 2 * KV) * D; }
};

// Direct causal attention over the whole sequence: out (B, S, H D), lse (B, H, S), and from dout
// the gradient dqkv (B, S, (H + 2 KV) D) by the softmax's backward.
struct Reference {
  std::vector<double> out, lse, dqkv;
};
Reference direct_attention(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  Reference r;
  const int64_t row = s.row(), Q = s.H / s.KV;
  r.out.assign(size_t(s.B * s.S * s.H * s.D), 0.0);
  r.lse.assign(size_t(s.B * s.H * s.S), 0.0);
  r.dqkv.assign(size_t(s.B * s.S * row), 0.0);
  const double scale = 1.0 / std::sqrt(double(s.D));
  auto q = [&](int64_t b, int64_t t, int64_t h) { return &qkv[size_t((b * s.S + t) * row + h * s.D)]; };
  auto k = [&](int64_t b, int64_t t, int64_t g) { return &qkv[size_t((b * s.S + t) * row + (s.H + g) * s.D)]; };
  auto v = [&](int64_t b, int64_t t, int64_t g) { return &qkv[size_t((b * s.S + t) * row + (s.H + s.KV + g) * s.D)]; };
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t g = h / Q;
      for (int64_t i = 0; i < s.S; ++i) {
        std::vector<double> p(size_t(i + 1)), dp(size_t(i + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d) dot += double(q(b, i, h)[d]) * k(b, j, g)[d];
          p[size_t(j)] = dot * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        double sum = 0;
        for (double& x : p) sum += std::exp(x - mx);
        const double lse = mx + std::log(sum);
        r.lse[size_t((b * s.H + h) * s.S + i)] = lse;
        const float* dy = &dout[size_t((b * s.S + i) * s.H * s.D + h * s.D)];
        double* o = &r.out[size_t((b * s.S + i) * s.H * s.D + h * s.D)];
        double pdp = 0;
        for (int64_t j = 0; j <= i; ++j) {
          p[size_t(j)] = std::exp(p[size_t(j)] - lse);
          double x = 0;
          for (int64_t d = 0; d < s.D; ++d) {
            o[d] += p[size_t(j)] * v(b, j, g)[d];
            x += double(dy[d]) * v(b, j, g)[d];
          }
          dp[size_t(j)] = x;
          pdp += p[size_t(j)] * x;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[size_t(j)] * (dp[size_t(j)] - pdp) * scale;
          double* dq = &r.dqkv[size_t((b * s.S + i) * row + h * s.D)];
          double* dk = &r.dqkv[size_t((b * s.S + j) * row + (s.H + g) * s.D)];
          double* dv = &r.dqkv[size_t((b * s.S + j) * row + (s.H + s.KV + g) * s.D)];
          for (int64_t d = 0; d < s.D; ++d) {
            dq[d] += ds * k(b, j, g)[d];
            dk[d] += ds * q(b, i, h)[d];
            dv[d] += p[size_t(j)] * dy[d];
          }
        }
      }
    }
  return r;
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(gen);
  return v;
}

// rows (B, S, w) -> this CP rank's rows (B, S / cp, w)
std::vector<float> local_rows(const std::vector<float>& x, int64_t B, int64_t S, int64_t w, int cp, int r) {
  std::vector<int64_t> idx(static_cast<size_t>(S)), mine(static_cast<size_t>(S / cp));
  for (int64_t i = 0; i < S; ++i) idx[size_t(i)] = i;
  cp_select(mine.data(), idx.data(), S, cp, r);
  std::vector<float> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t : mine) out.insert(out.end(), x.begin() + (b * S + t) * w, x.begin() + (b * S + t + 1) * w);
  return out;
}

// Runs the ring on cp thread ranks (each its own CPU backend) with the values stored in dtype t and
// checks every rank's out, lse and dqkv against the direct attention of the same (rounded) inputs.
// tp = 1: the cp ranks are a TP group of that size; tp > 1: a TP x CP grid, whose tp CP rings
// (the grid's cp_group) run at once, each over the same sequence.
void check_ring(const Shape& s, int cp, DType t, double tol, int tp = 1) {
  std::vector<float> qkv = randn(size_t(s.B * s.S * s.row()), 11), dout = randn(size_t(s.B * s.S * s.H * s.D), 12);
  for (float& x : qkv) x = round_to(x, t);
  for (float& x : dout) x = round_to(x, t);
  const Reference ref = direct_attention(s, qkv, dout);
  const int64_t T = s.S / cp;
  const GridShape grid = tp == 1 ? GridShape{cp, 1, 1, 1} : GridShape{tp, cp, 1, 1};
  run_thread_ranks(grid, false, [&](Grid& g) {
    const int r = tp == 1 ? g.tp_rank : g.cp_rank;
    Comm& ring_group = tp == 1 ? *g.tp_group : *g.cp_group;
    auto ops = make_cpu_ops(1);
    auto upload = [&](const std::vector<float>& host) {
      Buf b = ops->alloc(int64_t(host.size()), DType::F32);
      ops->to_device(b, host.data(), int64_t(host.size()));
      Buf c = ops->alloc(int64_t(host.size()), t);
      ops->convert(c, b, int64_t(host.size()));
      ops->free(b.p);
      return c;
    };
    Buf q = upload(local_rows(qkv, s.B, s.S, s.row(), cp, r));
    Buf dy = upload(local_rows(dout, s.B, s.S, s.H * s.D, cp, r));
    Buf out = ops->alloc(s.B * T * s.H * s.D, t), dqkv = ops->alloc(s.B * T * s.row(), t);
    float* lse = ops->alloc(size_t(s.B * s.H * T));
    RingAttention ring(*ops, ring_group, s.B, T, s.H, s.KV, s.D, t);
    ring.forward(out, lse, q);
    ring.backward(dqkv, dy, q, out, lse);
    auto host = [&](CBuf x, int64_t n) {
      std::vector<float> f(static_cast<size_t>(n));
      Buf tmp = ops->alloc(n, DType::F32);
      ops->convert(tmp, x, n);
      ops->to_host(f.data(), tmp, n);
      ops->free(tmp.p);
      return f;
    };
    const std::vector<float> got_out = host(out, s.B * T * s.H * s.D), got_d = host(dqkv, s.B * T * s.row());
    std::vector<float> got_lse(size_t(s.B * s.H * T));
    ops->to_host(got_lse.data(), lse, int64_t(got_lse.size()));
    std::vector<int64_t> idx(static_cast<size_t>(s.S)), mine(static_cast<size_t>(T));
    for (int64_t i = 0; i < s.S; ++i) idx[size_t(i)] = i;
    cp_select(mine.data(), idx.data(), s.S, cp, r);
    double worst[3] = {0, 0, 0};
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t lt = 0; lt < T; ++lt) {
        const int64_t gt = mine[size_t(lt)];
        for (int64_t e = 0; e < s.H * s.D; ++e)
          worst[0] = std::max(worst[0], std::fabs(got_out[size_t((b * T + lt) * s.H * s.D + e)] -
                                                  ref.out[size_t((b * s.S + gt) * s.H * s.D + e)]));
        for (int64_t h = 0; h < s.H; ++h)
          worst[1] = std::max(worst[1], std::fabs(got_lse[size_t((b * s.H + h) * T + lt)] -
                                                  ref.lse[size_t((b * s.H + h) * s.S + gt)]));
        for (int64_t e = 0; e < s.row(); ++e)
          worst[2] = std::max(worst[2], std::fabs(got_d[size_t((b * T + lt) * s.row() + e)] -
                                                  ref.dqkv[size_t((b * s.S + gt) * s.row() + e)]));
      }
    EXPECT_LT(worst[0], tol) << "out, cp " << cp << " rank " << r;
    EXPECT_LT(worst[1], tol) << "lse, cp " << cp << " rank " << r;
    EXPECT_LT(worst[2], 4 * tol) << "dqkv, cp " << cp << " rank " << r;
    for (void* p : {out.p, dqkv.p, q.p, dy.p, static_cast<void*>(lse)}) ops->free(p);
  });
}

TEST(RingAttention, MatchesDirectAttentionForCp1To4WithGqa) {
  const Shape s{2, 24, 4, 2, 8};  // G = 2 < H = 4; 24 tokens split into 2, 4, 6, 8 chunks
  for (int cp = 1; cp <= 4; ++cp) check_ring(s, cp, DType::F32, 2e-5);
}

TEST(RingAttention, MatchesDirectAttentionInBf16AndMultiHead) {
  for (int cp : {2, 3}) check_ring({1, 12, 2, 1, 4}, cp, DType::F32, 2e-5);  // one key/value head
  for (int cp : {2, 4}) check_ring({2, 16, 2, 2, 8}, cp, DType::BF16, 3e-2);
}

TEST(RingAttention, RunsOnTheCpGroupsOfATp2xCp2Grid) {
  check_ring({2, 16, 4, 2, 4}, 2, DType::F32, 2e-5, 2);
  check_ring({1, 12, 2, 1, 4}, 3, DType::BF16, 3e-2, 2);
}

TEST(RingAttention, ChunkLayoutIsLoadBalanced) {
  // S = 8, CP 2: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
  const int v[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  int got[4];
  cp_select(got, v, 8, 2, 0);
  EXPECT_EQ(std::vector<int>(got, got + 4), (std::vector<int>{0, 1, 6, 7}));
  cp_select(got, v, 8, 2, 1);
  EXPECT_EQ(std::vector<int>(got, got + 4), (std::vector<int>{2, 3, 4, 5}));
  // every rank's queries see the same number of keys over the whole ring
  const int64_t S = 24, cp = 3, c = S / (2 * cp);
  int64_t work[3] = {0, 0, 0};
  for (int r = 0; r < cp; ++r)
    for (int src = 0; src < cp; ++src) {
      RingBlock b = cp_local_block(c, int(cp), r);
      b.k_chunks[0] = src, b.k_chunks[1] = 2 * cp - 1 - src;
      for (int64_t t = 0; t < 2 * c; ++t) {
        int64_t n[2];
        b.visible(t, n);
        work[r] += n[0] + n[1];
      }
    }
  EXPECT_EQ(work[0], work[1]);
  EXPECT_EQ(work[1], work[2]);
  EXPECT_EQ(work[0] * cp, S * (S + 1) / 2);
}

// The cuDNN calls of every ring block (core/cuda/attention/ring_calls.h), per pair and merged: each
// (query token, key token) of the block is in exactly one call and there masked as RingBlock::visible
// says (a call's causal mask: its key row <= its query row, its rows being the chunks' in local
// order); merged, every block of CP 1..8 is one call of a shape that ring_shapes(true) lists (the
// graphs the GPU builds at start-up).
TEST(RingCalls, CoverEveryVisiblePairOnceWithItsMask) {
  const int64_t c = 3;
  for (int cp = 1; cp <= 8; ++cp)
    for (int r = 0; r < cp; ++r)
      for (int s = 0; s < cp; ++s) {
        RingBlock b = cp_local_block(c, cp, r);
        const int src = ((r - s) % cp + cp) % cp;  // RingAttention::block
        b.k_chunks[0] = src, b.k_chunks[1] = 2 * cp - 1 - src;
        for (bool merge : {false, true}) {
          SCOPED_TRACE("cp " + std::to_string(cp) + " rank " + std::to_string(r) + " step " + std::to_string(s) +
                       (merge ? " merged" : " per pair"));
          const std::vector<cuda::RingCall> calls = cuda::ring_calls(b, merge);
          std::vector<int> seen(size_t(4 * c * c), 0), masked(size_t(4 * c * c), 0);
          for (const cuda::RingCall& k : calls)
            for (int64_t i = 0; i < k.qn * c; ++i)
              for (int64_t j = 0; j < k.kn * c; ++j) {
                const size_t at = size_t((k.q0 * c + i) * 2 * c + k.k0 * c + j);
                ++seen[at];
                masked[at] = k.causal && j > i;
              }
          for (int64_t t = 0; t < 2 * c; ++t) {
            int64_t n[2];
            b.visible(t, n);
            for (int64_t key = 0; key < 2 * c; ++key) {
              const bool visible = key % c < n[key / c];
              const size_t at = size_t(t * 2 * c + key);
              if (visible) {
                EXPECT_EQ(seen[at], 1) << "query " << t << " key " << key;
                EXPECT_FALSE(masked[at]) << "query " << t << " key " << key;
              } else {
                EXPECT_TRUE(seen[at] == 0 || masked[at]) << "query " << t << " key " << key;
              }
            }
          }
          if (merge) {
            ASSERT_EQ(calls.size(), 1u);
            bool listed = false;
            for (const cuda::RingCall& k : cuda::ring_shapes(true))
              listed = listed || (k.qn == calls[0].qn && k.kn == calls[0].kn && k.causal == calls[0].causal);
            EXPECT_TRUE(listed) << calls[0].qn << " x " << calls[0].kn << (calls[0].causal ? " causal" : "");
          } else {
            for (const cuda::RingCall& k : calls) EXPECT_TRUE(k.qn == 1 && k.kn == 1);
          }
        }
      }
}

}  // namespace
}  // namespace tpt
