// The bf16 gradient buffer on the CPU backend (parallel.grad_reduce_in_bf16; core/ops.h "the gradient
// buffer's dtype"): every call that adds to a weight gradient adds its fp32 contribution to the
// stored value in fp32 and rounds once. Checked against the same call on an fp32 buffer holding the
// same (bf16) values, rounded afterwards -- bit for bit -- and, for the weight-gradient GEMM, against
// a double-precision sum (within one bf16 step, and exact where the fp32 GEMM's error cannot reach a
// rounding boundary). The readers (scale, the gradient norm, AdamW) see the stored values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/math.h"
#include "core/ops.h"

namespace tpt {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = fp32_to_bf16(v[i]);
  return r;
}
std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_to_fp32(v[i]);
  return r;
}

// `op` adds into the gradient buffers it is given (each of the sizes); run once on bf16 buffers and once
// on fp32 buffers holding the same values: the bf16 result is the fp32 one rounded, bit for bit, and
// differs from the start (the call added something).
void expect_one_rounding(const std::vector<int64_t>& sizes, const std::function<void(Ops&, std::vector<Buf>&)>& op) {
  auto ops = make_cpu_ops(1);
  std::vector<std::vector<uint16_t>> start;
  std::vector<Buf> b16, b32;
  for (size_t k = 0; k < sizes.size(); ++k) {
    start.push_back(to_bf16(randn(size_t(sizes[k]), 100 + uint32_t(k), 0.5f)));
    const std::vector<float> f = from_bf16(start.back());
    b16.push_back(ops->alloc(sizes[k], DType::BF16));
    b32.push_back(ops->alloc(sizes[k], DType::F32));
    ops->to_device(b16.back(), start.back().data(), sizes[k]);
    ops->to_device(b32.back(), f.data(), sizes[k]);
  }
  op(*ops, b16);
  op(*ops, b32);
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<uint16_t> got(static_cast<size_t>(sizes[k]));
    std::vector<float> want(static_cast<size_t>(sizes[k]));
    ops->to_host(got.data(), b16[k], sizes[k]);
    ops->to_host(want.data(), b32[k], sizes[k]);
    EXPECT_EQ(got, to_bf16(want)) << "buffer " << k;
    EXPECT_NE(got, start[k]) << "buffer " << k << ": nothing added";
    ops->free(b16[k].p);
    ops->free(b32[k].p);
  }
}

TEST(Bf16GradBuffer, EveryGradientCallRoundsOnce) {
  const int64_t N = 24, I = 16, O = 12, C = 16, V = 10;
  const std::vector<float> dy = randn(size_t(N * O), 1), x = randn(size_t(N * I), 2), w = randn(size_t(O * I), 3);
  const std::vector<float> dc = randn(size_t(N * C), 4), xc = randn(size_t(N * C), 5), g = randn(size_t(C), 6);
  std::vector<float> mean(static_cast<size_t>(N)), rstd(mean), y(static_cast<size_t>(N * C)), dx(y);
  {
    auto ops = make_cpu_ops(1);
    ops->layernorm_forward(y.data(), mean.data(), rstd.data(), xc.data(), g.data(), g.data(), N, C, 1e-5f);
  }
  std::vector<int32_t> tokens(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) tokens[size_t(n)] = int32_t((n * 7) % 13);  // some outside [2, 2 + V)
  expect_one_rounding({O * I, O}, [&](Ops& ops, std::vector<Buf>& b) {
    ops.linear_backward(nullptr, b[0], b[1], dy.data(), x.data(), w.data(), N, I, O, false);
  });
  expect_one_rounding({C, C}, [&](Ops& ops, std::vector<Buf>& b) {
    ops.layernorm_backward(dx.data(), b[0], b[1], dc.data(), xc.data(), g.data(), mean.data(), rstd.data(), N, C);
  });
  expect_one_rounding({C}, [&](Ops& ops, std::vector<Buf>& b) {
    ops.rmsnorm_backward(dx.data(), b[0], dc.data(), xc.data(), g.data(), rstd.data(), N, C);
  });
  expect_one_rounding({V * C}, [&](Ops& ops, std::vector<Buf>& b) {
    ops.embedding_backward(b[0], tokens.data(), dc.data(), N, C, 2, V);
  });
  expect_one_rounding({4 * C}, [&](Ops& ops, std::vector<Buf>& b) {
    ops.position_embedding_backward(b[0], dc.data(), N / 4, 4, C);
  });
  expect_one_rounding({C}, [&](Ops& ops, std::vector<Buf>& b) { ops.bias_backward(b[0], dc.data(), N, C); });
  expect_one_rounding({C}, [&](Ops& ops, std::vector<Buf>& b) { ops.scale(b[0], 1.0f / 3.0f, C); });
}

// The weight-gradient GEMM into bf16 against double: stored = bf16(old + sum dy x), one step at most
// (the fp32 sum's error may cross a rounding boundary), and mostly exact.
TEST(Bf16GradBuffer, WeightGradientGemmAgainstDouble) {
  const int64_t N = 64, I = 32, O = 16;
  const std::vector<float> dy = randn(size_t(N * O), 11), x = randn(size_t(N * I), 12);
  const std::vector<uint16_t> old = to_bf16(randn(size_t(O * I), 13, 4.0f));
  auto ops = make_cpu_ops(1);
  Buf dw = ops->alloc(O * I, DType::BF16);
  ops->to_device(dw, old.data(), O * I);
  ops->linear_backward(nullptr, dw, nullptr, dy.data(), x.data(), nullptr, N, I, O, false);
  std::vector<uint16_t> got(static_cast<size_t>(O * I));
  ops->to_host(got.data(), dw, O * I);
  int exact = 0;
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i) {
      double s = bf16_to_fp32(old[size_t(o * I + i)]);
      for (int64_t n = 0; n < N; ++n) s += double(dy[size_t(n * O + o)]) * double(x[size_t(n * I + i)]);
      const uint16_t want = fp32_to_bf16(float(s));
      const uint16_t g = got[size_t(o * I + i)];
      EXPECT_LE(std::abs(int(g) - int(want)), 1) << o << "," << i;
      exact += g == want;
    }
  EXPECT_GE(exact, O * I * 99 / 100);
  ops->free(dw.p);
}

// The readers: the norm and the nan/inf check of bf16 gradients, and AdamW stepping from them, are
// those of an fp32 buffer holding the same values.
TEST(Bf16GradBuffer, NormAndAdamWReadTheStoredValues) {
  const int64_t n = 300;
  std::vector<uint16_t> g16 = to_bf16(randn(size_t(n), 21));
  const std::vector<float> g32 = from_bf16(g16);
  auto ops = make_cpu_ops(1);
  Buf a = ops->alloc(n, DType::BF16), b = ops->alloc(n, DType::F32);
  ops->to_device(a, g16.data(), n);
  ops->to_device(b, g32.data(), n);
  const std::vector<TensorSegment> segs = {{0, 0, 100, true}, {100, 100, 200, false}};
  const GradStats s16 = ops->grad_stats(a, segs), s32 = ops->grad_stats(b, segs);
  EXPECT_EQ(s16.sum_squares, s32.sum_squares);
  EXPECT_FALSE(s16.nonfinite);
  AdamWParams p{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 0.1f, 0.05f};
  std::vector<float> out[2];
  for (int k = 0; k < 2; ++k) {
    AdamWBuffers buf;
    buf.master = ops->alloc(size_t(n));
    buf.m = ops->alloc(size_t(n));
    buf.v = ops->alloc(size_t(n));
    const std::vector<float> w = randn(size_t(n), 22);
    ops->to_device(buf.master, w.data(), n);
    buf.grads = k == 0 ? CBuf(a) : CBuf(b);
    ops->adamw_segments(buf, segs, p, 0.5f);
    out[k].resize(size_t(n));
    ops->to_host(out[k].data(), buf.master, n);
    ops->free(buf.master.p);
    ops->free(buf.m.p);
    ops->free(buf.v.p);
  }
  EXPECT_EQ(out[0], out[1]);
  g16[7] = 0x7fc0;  // a NaN
  ops->to_device(a, g16.data(), n);
  EXPECT_TRUE(ops->grad_stats(a, segs).nonfinite);
  ops->free(a.p);
  ops->free(b.p);
}

}  // namespace
}  // namespace tpt
