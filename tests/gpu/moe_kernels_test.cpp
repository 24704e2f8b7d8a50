// The Mixture-of-Experts token movement (core/ops.h gather_rows, combine_rows, row_dots; CUDA:
// core/cuda/moe_kernels.cu) against the CPU backend, in kernels_test.cpp's conventions: the same
// inputs on both (fp32, bf16 and fp16 storage; the index and weight arrays on each backend's side),
// stale contents in every output that is overwritten and the same initial contents of a "+="
// output; indices < 0 (dropped tokens), rows read more than once, K = 1 to 8, row widths that are
// and are not multiples of the vector widths. Both compute in fp32 and round once where they store:
// gather_rows agrees bit for bit (a copy or one product), combine_rows within one rounding step
// (FMA contraction of the weighted sum), row_dots up to its summation order. Then sizes past the
// 32-bit range: outputs of more than 2^31 elements and row_dots over tens of millions of pairs,
// checked on sampled rows against values computed here.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace tpt::gpu_test {
namespace {

constexpr DType kAllTypes[] = {DType::F32, DType::BF16, DType::F16};

using VecI = std::vector<int32_t>;

// n indices in [0, rows), about one in four negative (-1, or another negative value)
VecI indices(int64_t n, int64_t rows, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> row(0, int32_t(rows - 1)), coin(0, 3);
  VecI idx(static_cast<size_t>(n));
  for (auto& i : idx) i = coin(gen) == 0 ? (gen() % 2 ? -1 : -5) : row(gen);
  return idx;
}

class GpuMoeRows : public ::testing::TestWithParam<DType> {};

TEST_P(GpuMoeRows, GatherRowsMatchCpu) {
  const DType t = GetParam();
  for (int64_t C : {int64_t(1), int64_t(45), int64_t(64), int64_t(4096)}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const int64_t M = 23, R = 71;  // 71 rows of 23: repeats
    auto cpu = cpu_ops();
    auto gpu = gpu_ops();
    VecI idx = indices(R, M, 501);
    idx[0] = M - 1, idx[R - 1] = -1;
    Pair ix(*cpu, *gpu, idx), scale(*cpu, *gpu, randn(size_t(R), 502, 0.7f)),
        in(*cpu, *gpu, randn(size_t(M * C), 503, 2.0f), t), out(*cpu, *gpu, randn(size_t(R * C), 504), t);
    for (bool scaled : {false, true}) {
      const float* sc = scaled ? scale.cpu.f32() : nullptr;
      const float* sg = scaled ? scale.gpu.f32() : nullptr;
      cpu->gather_rows(out.cpu, in.cpu, ix.cpu.ints(), sc, R, C);
      gpu->gather_rows(out.gpu, in.gpu, ix.gpu.ints(), sg, R, C);
      EXPECT_TRUE(bitwise(out.gpu.host(), out.cpu.host())) << (scaled ? "scaled" : "copied");
    }
  }
}

struct Shape {
  int64_t N, K, C;
};

TEST_P(GpuMoeRows, CombineRowsMatchCpu) {
  const DType t = GetParam();
  const double r = 1e-6 + ulp(t);
  for (Shape s : {Shape{67, 1, 45}, Shape{37, 2, 64}, Shape{19, 8, 130}, Shape{11, 2, 4096}}) {
    SCOPED_TRACE("N " + std::to_string(s.N) + " K " + std::to_string(s.K) + " C " + std::to_string(s.C));
    const int64_t N = s.N, K = s.K, C = s.C, M = std::max<int64_t>(2, N * K / 2);  // repeats
    auto cpu = cpu_ops();
    auto gpu = gpu_ops();
    VecI idx = indices(N * K, M, 511);
    for (int64_t j = 0; j < K; ++j) idx[size_t(K + j)] = -1;  // token 1: every choice dropped
    const VecF init = randn(size_t(N * C), 514);
    Pair ix(*cpu, *gpu, idx), w(*cpu, *gpu, randn(size_t(N * K), 512, 0.5f)),
        in(*cpu, *gpu, randn(size_t(M * C), 513, 1.5f), t), out(*cpu, *gpu, init, t);
    for (bool weighted : {false, true})
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(std::string(weighted ? "weighted" : "unweighted") + (accumulate ? " +=" : " ="));
        out.cpu.upload(init), out.gpu.upload(init);
        cpu->combine_rows(out.cpu, in.cpu, ix.cpu.ints(), weighted ? w.cpu.f32() : nullptr, N, K, C, accumulate);
        gpu->combine_rows(out.gpu, in.gpu, ix.gpu.ints(), weighted ? w.gpu.f32() : nullptr, N, K, C, accumulate);
        EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), r, 1e-5));
      }
  }
}

TEST_P(GpuMoeRows, RowDotsMatchCpu) {
  const DType t = GetParam();
  for (Shape s : {Shape{67, 1, 45}, Shape{37, 2, 64}, Shape{19, 8, 130}, Shape{11, 2, 4096}, Shape{5, 3, 7}}) {
    SCOPED_TRACE("N " + std::to_string(s.N) + " K " + std::to_string(s.K) + " C " + std::to_string(s.C));
    const int64_t N = s.N, K = s.K, C = s.C, M = std::max<int64_t>(2, N * K / 2);
    auto cpu = cpu_ops();
    auto gpu = gpu_ops();
    VecI idx = indices(N * K, M, 521);
    idx[0] = -1;
    Pair ix(*cpu, *gpu, idx), a(*cpu, *gpu, randn(size_t(N * C), 522), t), b(*cpu, *gpu, randn(size_t(M * C), 523), t),
        out(*cpu, *gpu, randn(size_t(N * K), 524));
    cpu->row_dots(out.cpu, a.cpu, b.cpu, ix.cpu.ints(), N, K, C);
    gpu->row_dots(out.gpu, a.gpu, b.gpu, ix.gpu.ints(), N, K, C);
    const VecF g = out.gpu.host();
    EXPECT_TRUE(close(g, out.cpu.host(), 1e-5, 2e-5 * std::sqrt(double(C))));
    EXPECT_EQ(g[0], 0.0f) << "idx < 0: a zero dot";
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GpuMoeRows, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- past the 32-bit range (bf16: about 9 GB of device memory)

// Rows [r0, r0 + n) of a (rows, C) device tensor of dtype t, as floats.
VecF rows_of(Ops& ops, const Dev& d, int64_t r0, int64_t n, int64_t C) {
  std::vector<char> raw(size_t(n * C) * sizeof(float));  // room for any dtype's n C elements
  ops.to_host(raw.data(), d.buf() + r0 * C, n * C);
  return from_storage(raw.data(), size_t(n * C), d.dtype());
}

TEST(GpuMoeRowsLarge, OutputsOfMoreThan2To31Elements) {
  const DType t = DType::BF16;
  const int64_t C = 4096, M = 64, R = (int64_t(1) << 19) + 3;  // R C = 2^31 + 3 C elements
  auto gpu = gpu_ops();
  // bf16 values times weights of a few bits: exact fp32 products, so FMA contraction changes nothing
  const VecF x = rounded(randn(size_t(M * C), 531), t);
  VecI idx(static_cast<size_t>(R)), pos(size_t(2 * R));
  VecF s(static_cast<size_t>(R)), w(size_t(2 * R));
  for (int64_t r = 0; r < R; ++r) {
    idx[size_t(r)] = int32_t((r * 7919 + 13) % M);
    s[size_t(r)] = 1.0f + float(r % 5) / 8.0f;
    pos[size_t(2 * r)] = int32_t((r * 31 + 5) % M), pos[size_t(2 * r + 1)] = r % 3 == 0 ? -1 : int32_t(r % M);
    w[size_t(2 * r)] = 0.25f + float(r % 7) / 16.0f, w[size_t(2 * r + 1)] = -0.5f;
  }
  idx[size_t(R - 1)] = -1;
  Dev in(*gpu, x, t), ix(*gpu, idx), sc(*gpu, s), px(*gpu, pos), wd(*gpu, w), out(*gpu, size_t(R * C), t);
  // rows around element 2^31 (row 2^19) and at both ends
  const int64_t checked[] = {0, (int64_t(1) << 19) - 1, int64_t(1) << 19, (int64_t(1) << 19) + 1, R - 1};

  gpu->gather_rows(out, in, ix.ints(), sc.f32(), R, C);
  for (int64_t r : checked) {
    SCOPED_TRACE("gather row " + std::to_string(r));
    VecF want(static_cast<size_t>(C), 0.0f);
    if (idx[size_t(r)] >= 0)
      for (int64_t c = 0; c < C; ++c) want[size_t(c)] = round_to(s[size_t(r)] * x[size_t(idx[size_t(r)] * C + c)], t);
    EXPECT_TRUE(bitwise(rows_of(*gpu, out, r, 1, C), want));
  }

  gpu->combine_rows(out, in, px.ints(), wd.f32(), R, 2, C, false);
  for (int64_t r : checked) {
    SCOPED_TRACE("combine row " + std::to_string(r));
    VecF want(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      float v = w[size_t(2 * r)] * x[size_t(pos[size_t(2 * r)] * C + c)];
      if (pos[size_t(2 * r + 1)] >= 0) v += w[size_t(2 * r + 1)] * x[size_t(pos[size_t(2 * r + 1)] * C + c)];
      want[size_t(c)] = v;
    }
    EXPECT_TRUE(bitwise(rows_of(*gpu, out, r, 1, C), rounded(want, t)));
  }
}

// 2^22 tokens with 8 choices: 2^25 warps, past the launcher's block cap (row_dots strides its grid).
TEST(GpuMoeRowsLarge, RowDotsOverManyPairs) {
  const int64_t N = int64_t(1) << 22, K = 8, C = 6, M = 97;
  auto gpu = gpu_ops();
  std::mt19937 gen(541);
  VecI idx(size_t(N * K));
  for (auto& i : idx) i = int32_t(gen() % (M + 1)) - 1;  // -1 about once in 98
  const VecF a = randn(size_t(N * C), 542), b = randn(size_t(M * C), 543);
  Dev ad(*gpu, a), bd(*gpu, b), ix(*gpu, idx), out(*gpu, VecF(size_t(N * K), NAN));  // stale: NaN
  gpu->row_dots(out, ad, bd, ix.ints(), N, K, C);
  const VecF got = out.host();
  std::vector<int64_t> sampled;
  for (int64_t p = 0; p < N * K; p += 9973) sampled.push_back(p);
  for (int64_t p = N * K - 40; p < N * K; ++p) sampled.push_back(p);  // the grid's last warps
  for (int64_t p : sampled) {
    const int32_t r = idx[size_t(p)];
    double want = 0;
    if (r >= 0)
      for (int64_t c = 0; c < C; ++c) want += double(a[size_t(p / K * C + c)]) * b[size_t(r * C + c)];
    ASSERT_NEAR(got[size_t(p)], want, 1e-5 * (1 + std::fabs(want))) << "pair " << p;
  }
}

}  // namespace
}  // namespace tpt::gpu_test
