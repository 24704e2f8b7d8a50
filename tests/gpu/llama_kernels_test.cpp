// The LLaMA family's CudaOps methods against the CPU backend (kernels_test.cpp's conventions: random
// inputs of awkward sizes and of vector-friendly ones, fp32, bf16 and fp16 storage, the same
// initial contents of "+=" outputs): RMSNorm (with the fused residual add) and its backward,
// SwiGLU and its backward, the grouped-query QKV regroup, and RoPE (rotate-half and interleaved,
// partial rotary, explicit positions, the inverse rotation). Both backends compute in fp32 and round
// once where they store: element-wise results agree bit for bit or within one rounding step (FMA
// contraction, libm's cosf / sinf against CUDA's), row and column sums up to their order.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace tpt::gpu_test {
namespace {

constexpr DType kAllTypes[] = {DType::F32, DType::BF16, DType::F16};

std::string type_name(const ::testing::TestParamInfo<DType>& info) { return dtype_name(info.param); }

// ---- RMSNorm

class GpuRmsNorm : public ::testing::TestWithParam<DType> {};

TEST_P(GpuRmsNorm, ForwardResidualAndBackwardMatchCpu) {
  const DType t = GetParam();
  const double r = 1e-5 + 2 * ulp(t);
  for (int64_t C : {int64_t(77), int64_t(1031), int64_t(5), int64_t(768), int64_t(4096)}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const int64_t N = 43;
    auto cpu = cpu_ops();
    auto gpu = gpu_ops();
    VecF x = randn(size_t(N * C), 131, 2.0f);
    for (float& v : x) v += 1.0f;  // a mean away from 0 (RMSNorm does not remove it)
    Pair inp(*cpu, *gpu, x, t), w(*cpu, *gpu, randn(size_t(C), 132), t), out(*cpu, *gpu, VecF(size_t(N * C)), t),
        rstd(*cpu, *gpu, VecF(size_t(N)));
    cpu->rmsnorm_forward(out.cpu, rstd.cpu, inp.cpu, w.cpu, N, C, 1e-5f);
    gpu->rmsnorm_forward(out.gpu, rstd.gpu, inp.gpu, w.gpu, N, C, 1e-5f);
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), r, 1e-5)) << "out";
    EXPECT_TRUE(close(rstd.gpu.host(), rstd.cpu.host(), 1e-6, 1e-6)) << "rstd";

    // residual add + RMSNorm in one pass: res as the CPU stores it, RMSNorm of that
    Pair a(*cpu, *gpu, randn(size_t(N * C), 133, 2.0f), t), res(*cpu, *gpu, VecF(size_t(N * C)), t);
    cpu->residual_rmsnorm_forward(res.cpu, out.cpu, rstd.cpu, a.cpu, inp.cpu, w.cpu, N, C, 1e-5f);
    gpu->residual_rmsnorm_forward(res.gpu, out.gpu, rstd.gpu, a.gpu, inp.gpu, w.gpu, N, C, 1e-5f);
    EXPECT_TRUE(bitwise(res.gpu.host(), res.cpu.host())) << "residual";
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), r, 1e-5)) << "residual RMSNorm";
    EXPECT_TRUE(close(rstd.gpu.host(), rstd.cpu.host(), 1e-6, 1e-6)) << "residual RMSNorm rstd";
    // in place: res aliases a (the model's residual stream)
    cpu->residual_rmsnorm_forward(a.cpu, out.cpu, rstd.cpu, a.cpu, inp.cpu, w.cpu, N, C, 1e-5f);
    gpu->residual_rmsnorm_forward(a.gpu, out.gpu, rstd.gpu, a.gpu, inp.gpu, w.gpu, N, C, 1e-5f);
    EXPECT_TRUE(bitwise(a.gpu.host(), a.cpu.host())) << "residual in place";
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), r, 1e-5)) << "residual RMSNorm in place";

    // backward from the forward's rstd (the same on both: the CPU's)
    rstd.gpu.upload(rstd.cpu.host());
    Pair dout(*cpu, *gpu, randn(size_t(N * C), 134), t), dinp(*cpu, *gpu, randn(size_t(N * C), 135), t),
        dw(*cpu, *gpu, randn(size_t(C), 136));
    cpu->rmsnorm_backward(dinp.cpu, dw.cpu, dout.cpu, a.cpu, w.cpu, rstd.cpu, N, C);
    gpu->rmsnorm_backward(dinp.gpu, dw.gpu, dout.gpu, a.gpu, w.gpu, rstd.gpu, N, C);
    EXPECT_TRUE(close(dinp.gpu.host(), dinp.cpu.host(), r, 2e-5)) << "dinp (+=)";
    EXPECT_TRUE(close(dw.gpu.host(), dw.cpu.host(), 1e-5, 5e-5)) << "dw (+=)";
  }
}

// The backward against finite differences of the GPU's own forward (fp32, double-checked math):
// d/dx of sum(dout * rmsnorm(x)).
TEST(GpuRmsNormGrad, MatchesFiniteDifferences) {
  const int64_t N = 3, C = 19;
  auto gpu = gpu_ops();
  const VecF x = randn(size_t(N * C), 141), w = randn(size_t(C), 142), dy = randn(size_t(N * C), 143);
  Dev xd(*gpu, x), wd(*gpu, w), out(*gpu, size_t(N * C)), rstd(*gpu, size_t(N)), dout(*gpu, dy),
      dinp(*gpu, size_t(N * C)), dw(*gpu, size_t(C));
  gpu->rmsnorm_forward(out, rstd, xd, wd, N, C, 1e-5f);
  gpu->rmsnorm_backward(dinp, dw, dout, xd, wd, rstd, N, C);
  const VecF gx = dinp.host(), gw = dw.host();
  auto loss = [&](const VecF& xv, const VecF& wv) {
    double l = 0;
    for (int64_t n = 0; n < N; ++n) {
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += double(xv[size_t(n * C + c)]) * xv[size_t(n * C + c)];
      const double r = 1.0 / std::sqrt(ss / double(C) + 1e-5);
      for (int64_t c = 0; c < C; ++c) l += double(dy[size_t(n * C + c)]) * xv[size_t(n * C + c)] * r * wv[size_t(c)];
    }
    return l;
  };
  const double h = 1e-3;
  for (size_t i = 0; i < x.size(); i += 7) {
    VecF xp = x, xm = x;
    xp[i] += float(h), xm[i] -= float(h);
    const double fd = (loss(xp, w) - loss(xm, w)) / (double(xp[i]) - double(xm[i]));
    EXPECT_NEAR(gx[i], fd, 2e-3 * (1 + std::fabs(fd))) << "dx " << i;
  }
  for (size_t c = 0; c < w.size(); ++c) {
    VecF wp = w, wm = w;
    wp[c] += float(h), wm[c] -= float(h);
    const double fd = (loss(x, wp) - loss(x, wm)) / (double(wp[c]) - double(wm[c]));
    EXPECT_NEAR(gw[c], fd, 2e-3 * (1 + std::fabs(fd))) << "dw " << c;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GpuRmsNorm, ::testing::ValuesIn(kAllTypes), type_name);

// ---- SwiGLU

class GpuSwiglu : public ::testing::TestWithParam<DType> {};

// F a multiple of every vector width (vector path), of fp32's only, and of none (scalar path);
// gates with large magnitudes (the sigmoid's tails) included.
TEST_P(GpuSwiglu, ForwardAndBackwardMatchCpu) {
  const DType t = GetParam();
  for (int64_t F : {int64_t(256), int64_t(100), int64_t(13)}) {
    SCOPED_TRACE("F = " + std::to_string(F));
    const int64_t N = 37;
    auto cpu = cpu_ops();
    auto gpu = gpu_ops();
    VecF x = randn(size_t(N * 2 * F), 151, 3.0f);
    x[0] = 0.0f, x[1] = -30.0f, x[2] = 30.0f, x[3] = 100.0f, x[4] = -100.0f;
    Pair inp(*cpu, *gpu, x, t), out(*cpu, *gpu, randn(size_t(N * F), 152), t);
    cpu->swiglu_forward(out.cpu, inp.cpu, N, F);
    gpu->swiglu_forward(out.gpu, inp.gpu, N, F);
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-6 + ulp(t), 1e-7)) << "swiglu";
    // dinp is "=": it starts as garbage
    Pair dout(*cpu, *gpu, randn(size_t(N * F), 153), t), dinp(*cpu, *gpu, randn(size_t(N * 2 * F), 154), t);
    cpu->swiglu_backward(dinp.cpu, dout.cpu, inp.cpu, N, F);
    gpu->swiglu_backward(dinp.gpu, dout.gpu, inp.gpu, N, F);
    // silu'(g) = s (1 + g (1 - s)) cancels near g = -1.28: an absolute error of a few fp32 steps
    EXPECT_TRUE(close(dinp.gpu.host(), dinp.cpu.host(), 1e-6 + ulp(t), 1e-6)) << "swiglu backward";
  }
}

// Misaligned tensors (one element into their buffers): the scalar path.
TEST_P(GpuSwiglu, MisalignedMatchesCpu) {
  const DType t = GetParam();
  const int64_t N = 9, F = 64;
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  Pair inp(*cpu, *gpu, randn(size_t(N * 2 * F + 1), 155, 2.0f), t), out(*cpu, *gpu, VecF(size_t(N * F + 1)), t),
      dout(*cpu, *gpu, randn(size_t(N * F + 1), 156), t), dinp(*cpu, *gpu, VecF(size_t(N * 2 * F + 1)), t);
  cpu->swiglu_forward(out.cpu.buf() + 1, CBuf(inp.cpu.buf()) + 1, N, F);
  gpu->swiglu_forward(out.gpu.buf() + 1, CBuf(inp.gpu.buf()) + 1, N, F);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-6 + ulp(t), 1e-7)) << "swiglu";
  cpu->swiglu_backward(dinp.cpu.buf() + 1, CBuf(dout.cpu.buf()) + 1, CBuf(inp.cpu.buf()) + 1, N, F);
  gpu->swiglu_backward(dinp.gpu.buf() + 1, CBuf(dout.gpu.buf()) + 1, CBuf(inp.gpu.buf()) + 1, N, F);
  EXPECT_TRUE(close(dinp.gpu.host(), dinp.cpu.host(), 1e-6 + ulp(t), 1e-6)) << "swiglu backward";
}

INSTANTIATE_TEST_SUITE_P(Types, GpuSwiglu, ::testing::ValuesIn(kAllTypes), type_name);

// ---- the grouped-query QKV regroup: a permutation, bit for bit

class GpuQkvRegroup : public ::testing::TestWithParam<DType> {};

TEST_P(GpuQkvRegroup, PermutationMatchesCpuAndRoundTrips) {
  const DType t = GetParam();
  struct Shape {
    int64_t N, G, Q, D;
  };
  for (const Shape& sh : {Shape{13, 2, 4, 24}, Shape{7, 3, 1, 5}, Shape{5, 1, 8, 64}, Shape{4, 8, 1, 16}}) {
    SCOPED_TRACE("N " + std::to_string(sh.N) + " G " + std::to_string(sh.G) + " Q " + std::to_string(sh.Q) + " D " +
                 std::to_string(sh.D));
    const size_t n = size_t(sh.N * sh.G * (sh.Q + 2) * sh.D);
    auto cpu = cpu_ops();
    auto gpu = gpu_ops();
    Pair grouped(*cpu, *gpu, randn(n, 161), t), heads(*cpu, *gpu, VecF(n), t), back(*cpu, *gpu, VecF(n), t);
    cpu->qkv_regroup(heads.cpu, grouped.cpu, sh.N, sh.G, sh.Q, sh.D, true);
    gpu->qkv_regroup(heads.gpu, grouped.gpu, sh.N, sh.G, sh.Q, sh.D, true);
    const VecF h = heads.gpu.host();
    EXPECT_TRUE(bitwise(h, heads.cpu.host())) << "to heads";
    // spot check the layout itself: token 0's first key is group 0's slot Q
    const VecF g = grouped.gpu.host();
    EXPECT_EQ(h[size_t(sh.G * sh.Q * sh.D)], g[size_t(sh.Q * sh.D)]);
    cpu->qkv_regroup(back.cpu, heads.cpu, sh.N, sh.G, sh.Q, sh.D, false);
    gpu->qkv_regroup(back.gpu, heads.gpu, sh.N, sh.G, sh.Q, sh.D, false);
    EXPECT_TRUE(bitwise(back.gpu.host(), back.cpu.host())) << "to grouped";
    EXPECT_TRUE(bitwise(back.gpu.host(), g)) << "round trip";
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GpuQkvRegroup, ::testing::ValuesIn(kAllTypes), type_name);

// ---- RoPE

class GpuRope : public ::testing::TestWithParam<DType> {};

// inv_freq[j] = base^(-2j / rot), as the model computes it
VecF inv_freq(int64_t rot, double base = 10000.0) {
  VecF f(size_t(rot / 2));
  for (int64_t j = 0; j < rot / 2; ++j) f[size_t(j)] = float(std::pow(base, -2.0 * double(j) / double(rot)));
  return f;
}

// H = 8 query heads and KV = 2 (grouped-query) or 8 key heads, the full head dimension or half of
// it rotated, both pair conventions, forward and inverse, positions n % S and explicit ones (large:
// the angles' argument reduction).
TEST_P(GpuRope, MatchesCpu) {
  const DType t = GetParam();
  const int64_t B = 3, S = 17, N = B * S, H = 8, D = 64;
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) pos[size_t(n)] = int32_t((n * 977 + 3) % 8192);
  Pair positions(*cpu, *gpu, pos);
  for (int64_t KV : {int64_t(2), int64_t(8)})
    for (int64_t rot : {D, D / 2})
      for (bool interleaved : {false, true})
        for (bool explicit_pos : {false, true})
          for (bool inverse : {false, true}) {
            SCOPED_TRACE("KV " + std::to_string(KV) + ", rot " + std::to_string(rot) +
                         (interleaved ? ", interleaved" : ", rotate-half") +
                         (explicit_pos ? ", positions" : ", n % S") + (inverse ? ", inverse" : ""));
            const size_t n = size_t(N * (H + 2 * KV) * D);
            const VecF x = randn(n, 171);
            Pair qkv(*cpu, *gpu, x, t), freq(*cpu, *gpu, inv_freq(rot));
            const int32_t* pc = explicit_pos ? positions.cpu.ints() : nullptr;
            const int32_t* pg = explicit_pos ? positions.gpu.ints() : nullptr;
            cpu->rope(qkv.cpu, freq.cpu, pc, N, S, H, KV, D, rot, interleaved, inverse);
            gpu->rope(qkv.gpu, freq.gpu, pg, N, S, H, KV, D, rot, interleaved, inverse);
            const VecF got = qkv.gpu.host();
            EXPECT_TRUE(close(got, qkv.cpu.host(), 1e-5 + ulp(t), 1e-5));
            // values (and the channels past rot) as stored before
            const VecF stored = rounded(x, t);
            bool untouched = true;
            for (int64_t r = 0; r < N && untouched; ++r)
              for (int64_t c = 0; c < (H + 2 * KV) * D; ++c) {
                const bool value = c >= (H + KV) * D, rotated = !value && c % D < rot;
                const size_t i = size_t(r * (H + 2 * KV) * D + c);
                if (!rotated && got[i] != stored[i]) {
                  untouched = false;
                  ADD_FAILURE() << "token " << r << " column " << c << " changed";
                  break;
                }
              }
          }
}

// The inverse rotation undoes the forward one (fp32; up to rounding), position 0 is the identity.
TEST(GpuRopeInverse, UndoesForward) {
  const int64_t N = 20, S = 10, H = 4, KV = 2, D = 32, rot = 32;
  auto gpu = gpu_ops();
  const VecF x = randn(size_t(N * (H + 2 * KV) * D), 181);
  Dev qkv(*gpu, x), freq(*gpu, inv_freq(rot));
  for (bool interleaved : {false, true}) {
    qkv.upload(x);
    gpu->rope(qkv, freq, nullptr, N, S, H, KV, D, rot, interleaved, false);
    const VecF rotated = qkv.host();
    // token 0 (position 0) unchanged
    for (int64_t c = 0; c < (H + 2 * KV) * D; ++c) EXPECT_EQ(rotated[size_t(c)], x[size_t(c)]) << c;
    gpu->rope(qkv, freq, nullptr, N, S, H, KV, D, rot, interleaved, true);
    EXPECT_TRUE(close(qkv.host(), x, 1e-5, 1e-5)) << (interleaved ? "interleaved" : "rotate-half");
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GpuRope, ::testing::ValuesIn(kAllTypes), type_name);

}  // namespace
}  // namespace tpt::gpu_test
