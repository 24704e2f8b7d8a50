// Every CudaOps method against the CPU backend on random inputs of awkward sizes (no multiples of
// 8, 16 or 32, and some that are, for the vectorised and fused paths), in fp32, bf16 and fp16
// storage: same arguments, same initial contents of "+=" outputs, results compared element by
// element. Both backends compute in fp32 and round once where they store, so element-wise results
// agree bit for bit (or within one rounding step where fast_exp / FMA contraction may differ), and
// sums agree up to their order: fp32 GEMMs with TF32 off to summation order, 16-bit outputs to one
// rounding step more. The embedding gradient, casts and the AdamW update agree bit for bit or nearly.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "core/cuda/gemm.h"
#include "core/cuda/kernels.h"
#include "gpu_test_util.h"

namespace tpt::gpu_test {
namespace {

constexpr DType kAllTypes[] = {DType::F32, DType::BF16, DType::F16};

// sums of K products in another order: errors grow like sqrt(K) (a wrong index is off by O(1))
double gemm_atol(int64_t K) { return 2e-5 * std::sqrt(double(K)); }

struct LinearCase {
  int64_t N, I, O;
  bool bias, epilogues;
  DType t;
};

std::string linear_name(const ::testing::TestParamInfo<LinearCase>& info) {
  const LinearCase& c = info.param;
  return std::to_string(c.N) + "x" + std::to_string(c.I) + "x" + std::to_string(c.O) + (c.bias ? "_bias" : "") +
         (c.epilogues ? "_epilogues" : "_kernels") + "_" + dtype_name(c.t);
}

class GpuLinear : public ::testing::TestWithParam<LinearCase> {};

// linear_forward / linear_backward (= and +=, with and without bias and input gradient); operands
// and 16-bit outputs stored in the case's dtype, weight and bias gradients fp32.
TEST_P(GpuLinear, ForwardAndBackwardMatchCpu) {
  const LinearCase c = GetParam();
  const DType t = c.t;
  auto cpu = cpu_ops();
  CudaOptions opt;
  opt.gemm_epilogues = c.epilogues;
  auto gpu = gpu_ops(opt);
  const double r = 1e-5 + 2 * ulp(t);  // 16-bit outputs: one rounding step either side
  Pair inp(*cpu, *gpu, randn(size_t(c.N * c.I), 1), t), w(*cpu, *gpu, randn(size_t(c.O * c.I), 2, 0.3f), t),
      b(*cpu, *gpu, randn(size_t(c.O), 3), t), out(*cpu, *gpu, randn(size_t(c.N * c.O), 4), t);
  cpu->linear_forward(out.cpu, inp.cpu, w.cpu, c.bias ? CBuf(b.cpu.buf()) : CBuf{}, c.N, c.I, c.O);
  gpu->linear_forward(out.gpu, inp.gpu, w.gpu, c.bias ? CBuf(b.gpu.buf()) : CBuf{}, c.N, c.I, c.O);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), r, gemm_atol(c.I))) << "out";

  Pair dout(*cpu, *gpu, randn(size_t(c.N * c.O), 5), t), dinp(*cpu, *gpu, randn(size_t(c.N * c.I), 6), t),
      dw(*cpu, *gpu, randn(size_t(c.O * c.I), 7)), db(*cpu, *gpu, randn(size_t(c.O), 8));
  for (bool acc : {false, true}) {
    SCOPED_TRACE(acc ? "accumulate dinp" : "assign dinp");
    cpu->linear_backward(dinp.cpu, dw.cpu, c.bias ? db.cpu.f32() : nullptr, dout.cpu, inp.cpu, w.cpu, c.N, c.I, c.O,
                         acc);
    gpu->linear_backward(dinp.gpu, dw.gpu, c.bias ? db.gpu.f32() : nullptr, dout.gpu, inp.gpu, w.gpu, c.N, c.I, c.O,
                         acc);
    EXPECT_TRUE(close(dinp.gpu.host(), dinp.cpu.host(), r, gemm_atol(c.O))) << "dinp";
    EXPECT_TRUE(close(dw.gpu.host(), dw.cpu.host(), 1e-5, 3 * gemm_atol(c.N))) << "dw";
    EXPECT_TRUE(close(db.gpu.host(), db.cpu.host(), 1e-5, 3 * gemm_atol(c.N))) << "dbias";
  }
  // no input gradient (the first layer's)
  cpu->linear_backward(nullptr, dw.cpu, nullptr, dout.cpu, inp.cpu, w.cpu, c.N, c.I, c.O, false);
  gpu->linear_backward(nullptr, dw.gpu, nullptr, dout.gpu, inp.gpu, w.gpu, c.N, c.I, c.O, false);
  EXPECT_TRUE(close(dw.gpu.host(), dw.cpu.host(), 1e-5, 5 * gemm_atol(c.N))) << "dw without dinp";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuLinear,
    ::testing::Values(LinearCase{37, 45, 67, true, true, DType::F32}, LinearCase{37, 45, 67, true, false, DType::F32},
                      LinearCase{37, 45, 67, false, true, DType::F32}, LinearCase{1, 3, 5, true, true, DType::F32},
                      LinearCase{257, 130, 771, true, true, DType::F32},
                      LinearCase{300, 769, 2307, true, true, DType::F32},
                      LinearCase{53, 99, 131, true, true, DType::BF16}, LinearCase{53, 99, 131, true, false, DType::BF16},
                      LinearCase{64, 96, 128, true, true, DType::BF16}, LinearCase{64, 96, 128, true, false, DType::BF16},
                      LinearCase{37, 45, 67, false, true, DType::BF16}, LinearCase{1, 3, 5, true, true, DType::BF16},
                      LinearCase{53, 99, 131, true, true, DType::F16}, LinearCase{64, 96, 128, true, true, DType::F16},
                      LinearCase{64, 96, 128, true, false, DType::F16}),
    linear_name);

// ZB-H1's split backward (GPTStage::BackwardPart) on the op: linear_backward with no dw (B: dinp,
// and the bias gradient when it goes with B), then with no dinp (W: dw, and the bias gradient when
// it goes with W), against one call with everything on the same backend, and against the CPU's one
// call. On the same backend:
//  - dinp is bitwise: B runs the full call's dinp GEMM (epilogue and GELU fallback included) unchanged;
//  - dw and dbias are bitwise whenever W makes the full call's cuBLASLt calls: no bias, the bias
//    with W, or the full call's bias gradient not fused (epilogues off, or cuBLASLt has no BGRADB
//    algorithm: epilogue_stats tells). With the bias in B and BGRADB fused in the full call, the
//    calls differ -- the full call's dw GEMM carries the BGRADB epilogue (its own algorithm), W's is
//    a plain GEMM, and B sums dbias with the column-sum kernel -- so dw and dbias are the same fp32
//    sums of N products / rows in another order: within gemm_atol(N), the tolerance this file allows
//    any reordered sum of N terms (a third of what the CPU comparison below allows);
// against the CPU: the tolerances of GpuLinear (and GpuLinearGelu for the GELU derivative).
// fp32 and bf16 storage; dinp assigned, accumulated, and with the GELU derivative (gelu_pre).
struct SplitCase {
  int64_t N, I, O;
  bool epilogues;
  DType t;
};

std::string split_name(const ::testing::TestParamInfo<SplitCase>& info) {
  const SplitCase& c = info.param;
  return std::to_string(c.N) + "x" + std::to_string(c.I) + "x" + std::to_string(c.O) +
         (c.epilogues ? "_epilogues" : "_kernels") + "_" + dtype_name(c.t);
}

class GpuLinearSplit : public ::testing::TestWithParam<SplitCase> {};

TEST_P(GpuLinearSplit, InputThenWeightEqualsOneCall) {
  const SplitCase c = GetParam();
  const DType t = c.t;
  auto cpu = cpu_ops();
  CudaOptions opt;
  opt.gemm_epilogues = c.epilogues;
  auto gpu = gpu_ops(opt);
  // against the CPU, as GpuLinear and GpuLinearGelu
  const double r = 1e-5 + 2 * ulp(t), r_gelu = t == DType::F32 ? 1e-5 : r + 1e-3;
  const double a_gelu = t == DType::F32 ? 1e-5 : 1e-3;
  Pair dout(*cpu, *gpu, randn(size_t(c.N * c.O), 301), t), inp(*cpu, *gpu, randn(size_t(c.N * c.I), 302), t),
      w(*cpu, *gpu, randn(size_t(c.O * c.I), 303, 0.3f), t), pre(*cpu, *gpu, randn(size_t(c.N * c.I), 304), t);
  const VecF dinp0 = randn(size_t(c.N * c.I), 305), dw0 = randn(size_t(c.O * c.I), 306), db0 = randn(size_t(c.O), 307);
  enum class Dinp { Assign, Accumulate, Gelu };
  enum class Bias { None, WithInput, WithWeight };
  for (Dinp mode : {Dinp::Assign, Dinp::Accumulate, Dinp::Gelu})
    for (Bias bias : {Bias::None, Bias::WithInput, Bias::WithWeight}) {
      SCOPED_TRACE(std::string(mode == Dinp::Assign ? "assign dinp" : mode == Dinp::Accumulate ? "accumulate dinp"
                                                                                              : "dinp with dGELU") +
                   (bias == Bias::None ? ", no dbias" : bias == Bias::WithInput ? ", dbias with dX" : ", dbias with dW"));
      const bool acc = mode == Dinp::Accumulate, with_bias = bias != Bias::None;
      const CBuf pre_gpu = mode == Dinp::Gelu ? CBuf(pre.gpu.buf()) : CBuf{};
      const CBuf pre_cpu = mode == Dinp::Gelu ? CBuf(pre.cpu.buf()) : CBuf{};
      // "+=" outputs start from the same contents everywhere
      Pair dx_one(*cpu, *gpu, dinp0, t), dw_one(*cpu, *gpu, dw0), db_one(*cpu, *gpu, db0);
      Dev dx_split(*gpu, dinp0, t), dw_split(*gpu, dw0), db_split(*gpu, db0);

      // one call (GPU and CPU)
      const cuda::EpilogueStats s0 = cuda::epilogue_stats();
      gpu->linear_backward(dx_one.gpu, dw_one.gpu, with_bias ? db_one.gpu.f32() : nullptr, dout.gpu, inp.gpu, w.gpu,
                           c.N, c.I, c.O, acc, pre_gpu);
      const cuda::EpilogueStats s1 = cuda::epilogue_stats();
      const int bgrad = int(cuda::Epilogue::BiasGrad);
      const bool bgrad_fused = s1.fused[bgrad] > s0.fused[bgrad];
      cpu->linear_backward(dx_one.cpu, dw_one.cpu, with_bias ? db_one.cpu.f32() : nullptr, dout.cpu, inp.cpu, w.cpu,
                           c.N, c.I, c.O, acc, pre_cpu);
      // B: no dw (inp not read), then W: no dinp (w and gelu_pre not read)
      gpu->linear_backward(dx_split, nullptr, bias == Bias::WithInput ? db_split.f32() : nullptr, dout.gpu, CBuf{},
                           w.gpu, c.N, c.I, c.O, acc, pre_gpu);
      gpu->linear_backward(Buf{}, dw_split, bias == Bias::WithWeight ? db_split.f32() : nullptr, dout.gpu, inp.gpu,
                           CBuf{}, c.N, c.I, c.O, false);

      const VecF dx = dx_split.host(), dw = dw_split.host(), db = db_split.host();
      EXPECT_TRUE(bitwise(dx, dx_one.gpu.host())) << "dinp: B makes the one call's dinp GEMM";
      const bool same_calls = !(bias == Bias::WithInput && bgrad_fused);
      if (same_calls) {
        EXPECT_TRUE(bitwise(dw, dw_one.gpu.host())) << "dw: W makes the one call's weight GEMM";
        EXPECT_TRUE(bitwise(db, db_one.gpu.host())) << "dbias: the one call's bias-gradient path";
      } else {
        EXPECT_TRUE(close(dw, dw_one.gpu.host(), 1e-6, gemm_atol(c.N))) << "dw: plain GEMM vs the BGRADB GEMM";
        EXPECT_TRUE(close(db, db_one.gpu.host(), 1e-6, gemm_atol(c.N))) << "dbias: column sums vs BGRADB";
      }
      EXPECT_FALSE(bitwise(dw, dw0)) << "the weight gradient was added";
      if (with_bias) {
        EXPECT_FALSE(bitwise(db, db0)) << "the bias gradient was added";
      } else {
        EXPECT_TRUE(bitwise(db, db0)) << "no bias gradient asked for";
      }

      // against the CPU's one call
      if (mode == Dinp::Gelu)
        EXPECT_TRUE(close(dx, dx_one.cpu.host(), r_gelu, gemm_atol(c.O) + a_gelu)) << "dinp vs CPU";
      else
        EXPECT_TRUE(close(dx, dx_one.cpu.host(), r, gemm_atol(c.O))) << "dinp vs CPU";
      EXPECT_TRUE(close(dw, dw_one.cpu.host(), 1e-5, 3 * gemm_atol(c.N))) << "dw vs CPU";
      EXPECT_TRUE(close(db, db_one.cpu.host(), 1e-5, 3 * gemm_atol(c.N))) << "dbias vs CPU";
    }
}

// Awkward sizes (no epilogue fuses where widths are not multiples of 8) and aligned ones (BGRADB and,
// in bf16, DGELU fuse), with cuBLASLt's epilogues and with the separate kernels.
INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuLinearSplit,
    ::testing::Values(SplitCase{37, 45, 67, true, DType::F32}, SplitCase{37, 45, 67, false, DType::F32},
                      SplitCase{64, 96, 128, true, DType::F32}, SplitCase{64, 96, 128, false, DType::F32},
                      SplitCase{257, 130, 771, true, DType::F32}, SplitCase{1, 3, 5, true, DType::F32},
                      SplitCase{53, 99, 131, true, DType::BF16}, SplitCase{53, 99, 131, false, DType::BF16},
                      SplitCase{64, 96, 128, true, DType::BF16}, SplitCase{64, 96, 128, false, DType::BF16},
                      SplitCase{300, 768, 2304, true, DType::BF16}, SplitCase{1, 8, 16, true, DType::BF16}),
    split_name);

// fc1 with its GELU fused (linear_forward with gelu_pre) and fc2's backward through it
// (linear_backward with gelu_pre): fc1 (N, I) -> (N, F), fc2 (N, F) -> (N, I). F % 8 == 0 lets
// cuBLASLt's GELU_AUX(_BIAS) / DGELU epilogues run (bf16 / fp16), else and in fp32 the kernels do.
struct GeluCase {
  int64_t N, I, F;
  bool bias, epilogues;
  DType t;
};

std::string gelu_name(const ::testing::TestParamInfo<GeluCase>& info) {
  const GeluCase& c = info.param;
  return std::to_string(c.N) + "x" + std::to_string(c.I) + "x" + std::to_string(c.F) + (c.bias ? "_bias" : "") +
         (c.epilogues ? "_epilogues" : "_kernels") + "_" + dtype_name(c.t);
}

class GpuLinearGelu : public ::testing::TestWithParam<GeluCase> {};

TEST_P(GpuLinearGelu, FusedForwardAndBackwardMatchCpu) {
  const GeluCase c = GetParam();
  const DType t = c.t;
  auto cpu = cpu_ops();
  CudaOptions opt;
  opt.gemm_epilogues = c.epilogues;
  auto gpu = gpu_ops(opt);
  // cuBLASLt's GELU is its own tanh approximation: in 16-bit runs allow it a little beyond rounding
  const double r = 1e-5 + 2 * ulp(t), r_gelu = t == DType::F32 ? 1e-5 : r + 1e-3;
  const double a_gelu = t == DType::F32 ? 1e-5 : 1e-3;
  Pair x(*cpu, *gpu, randn(size_t(c.N * c.I), 201), t), w1(*cpu, *gpu, randn(size_t(c.F * c.I), 202, 0.2f), t),
      b1(*cpu, *gpu, randn(size_t(c.F), 203), t), h(*cpu, *gpu, VecF(size_t(c.N * c.F)), t),
      pre(*cpu, *gpu, VecF(size_t(c.N * c.F)), t);
  const CBuf bc = c.bias ? CBuf(b1.cpu.buf()) : CBuf{}, bg = c.bias ? CBuf(b1.gpu.buf()) : CBuf{};
  cpu->linear_forward(h.cpu, x.cpu, w1.cpu, bc, c.N, c.I, c.F, pre.cpu);
  gpu->linear_forward(h.gpu, x.gpu, w1.gpu, bg, c.N, c.I, c.F, pre.gpu);
  EXPECT_TRUE(close(pre.gpu.host(), pre.cpu.host(), r, gemm_atol(c.I))) << "pre-activation";
  EXPECT_TRUE(close(h.gpu.host(), h.cpu.host(), r_gelu, gemm_atol(c.I) + a_gelu)) << "gelu(pre)";
  // fc2's backward from the CPU's forward (both backends get the same h and pre)
  const VecF h_host = h.cpu.host(), pre_host = pre.cpu.host();
  h.gpu.upload(h_host);
  pre.gpu.upload(pre_host);
  Pair w2(*cpu, *gpu, randn(size_t(c.I * c.F), 204, 0.2f), t), dy(*cpu, *gpu, randn(size_t(c.N * c.I), 205), t),
      dh(*cpu, *gpu, randn(size_t(c.N * c.F), 206), t), dw2(*cpu, *gpu, randn(size_t(c.I * c.F), 207)),
      db2(*cpu, *gpu, randn(size_t(c.I), 208));
  cpu->linear_backward(dh.cpu, dw2.cpu, db2.cpu, dy.cpu, h.cpu, w2.cpu, c.N, c.F, c.I, false, pre.cpu);
  gpu->linear_backward(dh.gpu, dw2.gpu, db2.gpu, dy.gpu, h.gpu, w2.gpu, c.N, c.F, c.I, false, pre.gpu);
  EXPECT_TRUE(close(dh.gpu.host(), dh.cpu.host(), r_gelu, gemm_atol(c.I) + a_gelu)) << "d pre-activation";
  EXPECT_TRUE(close(dw2.gpu.host(), dw2.cpu.host(), 1e-5, 3 * gemm_atol(c.N))) << "dw";
  EXPECT_TRUE(close(db2.gpu.host(), db2.cpu.host(), 1e-5, 3 * gemm_atol(c.N))) << "dbias";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuLinearGelu,
    ::testing::Values(GeluCase{37, 45, 67, true, true, DType::F32}, GeluCase{64, 96, 128, true, true, DType::F32},
                      GeluCase{64, 96, 128, true, true, DType::BF16}, GeluCase{64, 96, 128, true, false, DType::BF16},
                      GeluCase{64, 96, 128, false, true, DType::BF16}, GeluCase{53, 99, 131, true, true, DType::BF16},
                      GeluCase{1, 8, 16, true, true, DType::BF16}, GeluCase{64, 96, 128, true, true, DType::F16},
                      GeluCase{53, 99, 131, true, true, DType::F16}),
    gelu_name);

// Which cuBLASLt epilogues run on this GPU at GPT-2 124M's shapes in bf16 (the rest fall back to
// separate kernels: correct, slower). Printed for scripts/gpu_check.sh, not asserted.
TEST(GpuLinearEpilogues, ReportWhichFuseAtGpt2Shapes) {
  const DType t = DType::BF16;
  auto gpu = gpu_ops();
  const int64_t N = 512, C = 768, F = 3072;
  Dev x(*gpu, randn(size_t(N * C), 211), t), w1(*gpu, randn(size_t(F * C), 212, 0.02f), t),
      b1(*gpu, randn(size_t(F), 213), t), h(*gpu, size_t(N * F), t), pre(*gpu, size_t(N * F), t),
      w2(*gpu, randn(size_t(C * F), 214, 0.02f), t), b2(*gpu, randn(size_t(C), 215), t), y(*gpu, size_t(N * C), t),
      dy(*gpu, randn(size_t(N * C), 216), t), dh(*gpu, size_t(N * F), t), dw1(*gpu, size_t(F * C)),
      db1(*gpu, size_t(F)), dw2(*gpu, size_t(C * F)), db2(*gpu, size_t(C)), dx(*gpu, size_t(N * C), t);
  const cuda::EpilogueStats before = cuda::epilogue_stats();
  gpu->linear_forward(h, x, w1, b1, N, C, F, pre);                  // GELU_AUX_BIAS
  gpu->linear_forward(y, h, w2, b2, N, F, C);                       // BIAS
  gpu->linear_backward(dh, dw2, db2, dy, h, w2, N, F, C, false, pre);  // DGELU, BGRADB
  gpu->linear_backward(dx, dw1, db1, dh, x, w1, N, C, F, false);       // BGRADB
  const cuda::EpilogueStats after = cuda::epilogue_stats();
  const char* names[] = {"none", "bias", "gelu_aux", "dgelu", "bgradb"};
  std::string line = "cuBLASLt epilogues (bf16, GPT-2 124M shapes):";
  for (int k = 1; k < cuda::kEpilogueKinds; ++k)
    line += std::string(" ") + names[k] + " " + std::to_string(after.fused[k] - before.fused[k]) + " fused / " +
            std::to_string(after.fell_back[k] - before.fell_back[k]) + " fell back;";
  std::printf("%s\n", line.c_str());
  EXPECT_FALSE(gpu->has_nonfinite(dw1, F * C));
}

TEST(GpuLinearTf32, CloseToFp32) {
  const int64_t N = 61, I = 250, O = 77;
  auto cpu = cpu_ops();
  CudaOptions opt;
  opt.tf32 = true;
  auto gpu = gpu_ops(opt);
  Pair inp(*cpu, *gpu, randn(size_t(N * I), 21)), w(*cpu, *gpu, randn(size_t(O * I), 22, 0.1f)),
      out(*cpu, *gpu, VecF(size_t(N * O)));
  cpu->linear_forward(out.cpu, inp.cpu, w.cpu, nullptr, N, I, O);
  gpu->linear_forward(out.gpu, inp.gpu, w.gpu, nullptr, N, I, O);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-2, 1e-2));  // TF32: 10-bit mantissa products
}

class GpuLayerNorm : public ::testing::TestWithParam<DType> {};

TEST_P(GpuLayerNorm, ForwardResidualAndBackwardMatchCpu) {
  const DType t = GetParam();
  const double r = 1e-5 + 2 * ulp(t);
  for (int64_t C : {int64_t(77), int64_t(1031), int64_t(5), int64_t(768)}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const int64_t N = 43;
    auto cpu = cpu_ops();
    auto gpu = gpu_ops();
    VecF x = randn(size_t(N * C), 31, 2.0f);
    for (float& v : x) v += 3.0f;  // a mean far from 0
    Pair inp(*cpu, *gpu, x, t), w(*cpu, *gpu, randn(size_t(C), 32), t), b(*cpu, *gpu, randn(size_t(C), 33), t),
        out(*cpu, *gpu, VecF(size_t(N * C)), t), mean(*cpu, *gpu, VecF(size_t(N))), rstd(*cpu, *gpu, VecF(size_t(N)));
    cpu->layernorm_forward(out.cpu, mean.cpu, rstd.cpu, inp.cpu, w.cpu, b.cpu, N, C, 1e-5f);
    gpu->layernorm_forward(out.gpu, mean.gpu, rstd.gpu, inp.gpu, w.gpu, b.gpu, N, C, 1e-5f);
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), r, 1e-5));
    EXPECT_TRUE(close(mean.gpu.host(), mean.cpu.host(), 1e-6, 1e-6));
    EXPECT_TRUE(close(rstd.gpu.host(), rstd.cpu.host(), 1e-6, 1e-6));

    // residual add + LayerNorm in one pass: res as the CPU stores it, LN of that
    Pair a(*cpu, *gpu, randn(size_t(N * C), 38, 2.0f), t), res(*cpu, *gpu, VecF(size_t(N * C)), t);
    cpu->residual_layernorm_forward(res.cpu, out.cpu, mean.cpu, rstd.cpu, a.cpu, inp.cpu, w.cpu, b.cpu, N, C, 1e-5f);
    gpu->residual_layernorm_forward(res.gpu, out.gpu, mean.gpu, rstd.gpu, a.gpu, inp.gpu, w.gpu, b.gpu, N, C, 1e-5f);
    EXPECT_TRUE(bitwise(res.gpu.host(), res.cpu.host())) << "residual";
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), r, 1e-5)) << "residual LN";
    EXPECT_TRUE(close(mean.gpu.host(), mean.cpu.host(), 1e-6, 1e-6)) << "residual LN mean";
    EXPECT_TRUE(close(rstd.gpu.host(), rstd.cpu.host(), 1e-6, 1e-6)) << "residual LN rstd";
    // in place: res aliases a (the model's residual stream)
    cpu->residual_layernorm_forward(a.cpu, out.cpu, mean.cpu, rstd.cpu, a.cpu, inp.cpu, w.cpu, b.cpu, N, C, 1e-5f);
    gpu->residual_layernorm_forward(a.gpu, out.gpu, mean.gpu, rstd.gpu, a.gpu, inp.gpu, w.gpu, b.gpu, N, C, 1e-5f);
    EXPECT_TRUE(bitwise(a.gpu.host(), a.cpu.host())) << "residual in place";
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), r, 1e-5)) << "residual LN in place";

    Pair dout(*cpu, *gpu, randn(size_t(N * C), 34), t), dinp(*cpu, *gpu, randn(size_t(N * C), 35), t),
        dw(*cpu, *gpu, randn(size_t(C), 36)), db(*cpu, *gpu, randn(size_t(C), 37));
    cpu->layernorm_backward(dinp.cpu, dw.cpu, db.cpu, dout.cpu, inp.cpu, w.cpu, mean.cpu, rstd.cpu, N, C);
    gpu->layernorm_backward(dinp.gpu, dw.gpu, db.gpu, dout.gpu, inp.gpu, w.gpu, mean.gpu, rstd.gpu, N, C);
    EXPECT_TRUE(close(dinp.gpu.host(), dinp.cpu.host(), r, 2e-5));
    EXPECT_TRUE(close(dw.gpu.host(), dw.cpu.host(), 1e-5, 5e-5));
    EXPECT_TRUE(close(db.gpu.host(), db.cpu.host(), 1e-5, 5e-5));
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GpuLayerNorm, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

class GpuElementwise : public ::testing::TestWithParam<DType> {};

// Each map on the vectorised path (aligned, n not a multiple of the vector) and on the scalar path
// (every pointer one element off).
TEST_P(GpuElementwise, MatchCpu) {
  const DType t = GetParam();
  const int64_t n = 100003;
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  VecF x = randn(size_t(n), 61, 3.0f);
  x[0] = 0.0f, x[1] = -12.0f, x[2] = 12.0f, x[3] = 100.0f, x[4] = -100.0f;
  x[8] = 0.0f, x[9] = -12.0f, x[10] = 12.0f, x[11] = 100.0f, x[12] = -100.0f;
  Pair a(*cpu, *gpu, x, t), b(*cpu, *gpu, randn(size_t(n), 62), t), out(*cpu, *gpu, VecF(size_t(n)), t);
  for (int64_t off : {int64_t(0), int64_t(1)}) {
    SCOPED_TRACE(off ? "scalar path" : "vector path");
    const int64_t m = n - off;
    auto C = [&](const Dev& d) { return CBuf(d.buf()) + off; };
    auto O = [&](const Dev& d) { return d.buf() + off; };
    cpu->gelu_forward(O(out.cpu), C(a.cpu), m);
    gpu->gelu_forward(O(out.gpu), C(a.gpu), m);
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-6 + ulp(t), 1e-7)) << "gelu";
    cpu->gelu_backward(O(out.cpu), C(b.cpu), C(a.cpu), m);
    gpu->gelu_backward(O(out.gpu), C(b.gpu), C(a.gpu), m);
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-6 + ulp(t), 1e-7)) << "gelu backward";
    {  // finite for every input, +-12 and +-100 included (close() would let nan match nan)
      const VecF g = out.gpu.host();
      EXPECT_EQ(std::count_if(g.begin(), g.end(), [](float v) { return !std::isfinite(v); }), 0) << "gelu backward";
    }
    cpu->add(O(out.cpu), C(a.cpu), C(b.cpu), m);
    gpu->add(O(out.gpu), C(a.gpu), C(b.gpu), m);
    EXPECT_TRUE(bitwise(out.gpu.host(), out.cpu.host())) << "add";
    cpu->accumulate(O(out.cpu), C(a.cpu), m);
    gpu->accumulate(O(out.gpu), C(a.gpu), m);
    EXPECT_TRUE(bitwise(out.gpu.host(), out.cpu.host())) << "accumulate";
  }
  // the tensor-parallel sum of 3 stacked rows, in order, rounded once (n a multiple of the vector
  // width, and not)
  for (int64_t k_n : {int64_t(4096), int64_t(1001)}) {
    Pair parts(*cpu, *gpu, randn(size_t(3 * k_n), 63, 10.0f), t), sum(*cpu, *gpu, VecF(size_t(k_n)), t);
    cpu->sum_parts(sum.cpu, parts.cpu, 3, k_n);
    gpu->sum_parts(sum.gpu, parts.gpu, 3, k_n);
    EXPECT_TRUE(bitwise(sum.gpu.host(), sum.cpu.host())) << "sum_parts n = " << k_n;
    cpu->sum_parts(sum.cpu, parts.cpu, 1, k_n);
    gpu->sum_parts(sum.gpu, parts.gpu, 1, k_n);
    EXPECT_TRUE(bitwise(sum.gpu.host(), sum.cpu.host())) << "sum_parts of one row, n = " << k_n;
  }
  if (t == DType::F32) {
    Pair y(*cpu, *gpu, x);
    cpu->scale(y.cpu, 0.37f, n);
    gpu->scale(y.gpu, 0.37f, n);
    EXPECT_TRUE(bitwise(y.gpu.host(), y.cpu.host())) << "scale";
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GpuElementwise, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

class GpuEmbedding : public ::testing::TestWithParam<DType> {};

TEST_P(GpuEmbedding, VocabParallelForwardBackward) {
  const DType t = GetParam();
  for (int64_t C : {int64_t(45), int64_t(64)}) {  // row copies of 2 / 4 bytes, and of 16
    SCOPED_TRACE("C = " + std::to_string(C));
    const int64_t N = 67, v0 = 40, rows = 37;  // this shard: ids [40, 77)
    auto cpu = cpu_ops();
    auto gpu = gpu_ops();
    std::mt19937 gen(71);
    std::uniform_int_distribution<int32_t> tok(0, 100);
    std::vector<int32_t> tokens(static_cast<size_t>(N));
    for (auto& tk : tokens) tk = tok(gen);
    tokens[3] = tokens[9] = tokens[30] = tokens[66] = 41;            // repeats inside the shard
    tokens[4] = 40, tokens[5] = 76, tokens[6] = 77, tokens[7] = 39;  // both edges
    Pair tk(*cpu, *gpu, tokens), wte(*cpu, *gpu, randn(size_t(rows * C), 72), t),
        out(*cpu, *gpu, randn(size_t(N * C), 73), t);
    cpu->embedding_forward(out.cpu, tk.cpu.ints(), wte.cpu, N, C, v0, rows);
    gpu->embedding_forward(out.gpu, tk.gpu.ints(), wte.gpu, N, C, v0, rows);
    EXPECT_TRUE(bitwise(out.gpu.host(), out.cpu.host()));
    Pair dout(*cpu, *gpu, randn(size_t(N * C), 74), t), dwte(*cpu, *gpu, randn(size_t(rows * C), 75));
    cpu->embedding_backward(dwte.cpu, tk.cpu.ints(), dout.cpu, N, C, v0, rows);
    gpu->embedding_backward(dwte.gpu, tk.gpu.ints(), dout.gpu, N, C, v0, rows);
    EXPECT_TRUE(bitwise(dwte.gpu.host(), dwte.cpu.host())) << "sums in position order, as on the CPU";
  }
}

TEST_P(GpuEmbedding, PositionForwardBackward) {
  const DType t = GetParam();
  for (int64_t C : {int64_t(23), int64_t(64)}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const int64_t B = 3, T = 19;
    auto cpu = cpu_ops();
    auto gpu = gpu_ops();
    Pair wpe(*cpu, *gpu, randn(size_t(T * C), 81), t), out(*cpu, *gpu, randn(size_t(B * T * C), 82), t),
        dwpe(*cpu, *gpu, randn(size_t(T * C), 83));
    cpu->add_position_embedding(out.cpu, wpe.cpu, B, T, C);
    gpu->add_position_embedding(out.gpu, wpe.gpu, B, T, C);
    EXPECT_TRUE(bitwise(out.gpu.host(), out.cpu.host()));
    cpu->position_embedding_backward(dwpe.cpu, out.cpu, B, T, C);
    gpu->position_embedding_backward(dwpe.gpu, out.gpu, B, T, C);
    EXPECT_TRUE(bitwise(dwpe.gpu.host(), dwpe.cpu.host()));
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GpuEmbedding, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The three vocab-parallel cross-entropy passes on one shard: columns [v0, v0 + Vl) of a padded
// vocabulary whose valid ids end inside (or before) the shard; the logits in dtype t, overwritten
// by dlogits in pass 3. The GPU against a double-precision reference on the stored logits (every
// shape), and against the CPU backend on narrow rows (a wide row's sum-exp is summed sequentially
// in fp32 on the CPU, a few 1e-5 off: issue 14 makes the CPU's as accurate).
struct XentReference {
  VecF stats;    // row_max, target_logit, sum_exp, losses (4 N)
  VecF dlogits;  // rounded to t
};

XentReference xent_reference(const VecF& l, const std::vector<int32_t>& targets, int64_t N, int64_t Vl, int64_t v0,
                             int64_t valid_vocab, float dloss_scale, DType t) {
  const int64_t nvalid = std::clamp<int64_t>(valid_vocab - v0, 0, Vl);
  XentReference r{VecF(size_t(4 * N)), VecF(size_t(N * Vl))};
  for (int64_t n = 0; n < N; ++n) {
    const float* row = l.data() + n * Vl;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < nvalid; ++j) mx = std::max(mx, row[j]);
    const int64_t tj = int64_t(targets[size_t(n)]) - v0;
    const float target = tj >= 0 && tj < nvalid ? row[tj] : 0.0f;
    double se = 0;
    for (int64_t j = 0; j < nvalid; ++j) se += std::exp(double(row[j]) - double(mx));
    r.stats[size_t(n)] = mx;
    r.stats[size_t(N + n)] = target;
    r.stats[size_t(2 * N + n)] = float(se);
    r.stats[size_t(3 * N + n)] = float(std::log(se) + double(mx) - double(target));
    for (int64_t j = 0; j < Vl; ++j) {
      double v = 0;
      if (j < nvalid) v = std::exp(double(row[j]) - double(mx)) / se * dloss_scale - (j == tj ? dloss_scale : 0.0);
      r.dlogits[size_t(n * Vl + j)] = round_to(float(v), t);
    }
  }
  return r;
}

void check_xent(int64_t Vl, int64_t v0, int64_t valid_vocab, DType t) {
  SCOPED_TRACE(dtype_name(t));
  const int64_t N = 29;
  const float dloss_scale = 0.125f;
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  std::mt19937 gen(91);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(valid_vocab) - 1);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (auto& tg : targets) tg = tok(gen);
  targets[0] = int32_t(v0), targets[1] = int32_t(valid_vocab - 1);
  Pair tg(*cpu, *gpu, targets), logits(*cpu, *gpu, VecF(size_t(N * Vl)), t), stats(*cpu, *gpu, VecF(size_t(4 * N)));
  auto run = [&](Ops& ops, const Dev& l, const Dev& st, const Dev& tgt, bool want_grad) {
    float *row_max = st.f32(), *target_logit = st.f32() + N, *sum_exp = st.f32() + 2 * N, *losses = st.f32() + 3 * N;
    ops.xent_local_max(row_max, target_logit, l, tgt.ints(), N, Vl, v0, valid_vocab);
    ops.xent_local_sumexp(sum_exp, l, row_max, N, Vl, v0, valid_vocab);
    ops.xent_loss_grad(l, losses, row_max, sum_exp, target_logit, tgt.ints(), N, Vl, v0, valid_vocab, dloss_scale,
                       want_grad);
  };
  for (bool want_grad : {false, true}) {
    SCOPED_TRACE(want_grad ? "with gradient" : "loss only");
    const VecF l = rounded(randn(size_t(N * Vl), want_grad ? 92 : 93, 4.0f), t);  // as stored
    logits.cpu.upload(l);
    logits.gpu.upload(l);
    run(*cpu, logits.cpu, stats.cpu, tg.cpu, want_grad);
    run(*gpu, logits.gpu, stats.gpu, tg.gpu, want_grad);
    const XentReference ref = xent_reference(l, targets, N, Vl, v0, valid_vocab, dloss_scale, t);
    const VecF g = stats.gpu.host();
    const VecF g_max(g.begin(), g.begin() + 2 * N), r_max(ref.stats.begin(), ref.stats.begin() + 2 * N);
    EXPECT_TRUE(bitwise(g_max, r_max)) << "max, target logit vs reference";
    EXPECT_TRUE(close(VecF(g.begin() + 2 * N, g.end()), VecF(ref.stats.begin() + 2 * N, ref.stats.end()), 2e-6, 2e-6))
        << "sum exp, loss vs reference";
    if (want_grad)
      EXPECT_TRUE(close(logits.gpu.host(), ref.dlogits, 1e-5 + ulp(t), 2e-7)) << "dlogits vs reference";
    else
      EXPECT_TRUE(bitwise(logits.gpu.host(), l)) << "logits untouched";
    // both backends sum the exps in double (issue 14: the CPU's fp32 sum was 7e-5 off on the wide row)
    const VecF c = stats.cpu.host();
    EXPECT_TRUE(close(VecF(c.begin() + 2 * N, c.end()), VecF(ref.stats.begin() + 2 * N, ref.stats.end()), 2e-6, 2e-6))
        << "CPU sum exp, loss vs reference";
    EXPECT_TRUE(close(g, c, 1e-5, 1e-6)) << "max, target logit, sum exp, loss vs CPU";
    EXPECT_TRUE(close(logits.gpu.host(), logits.cpu.host(), 1e-5 + ulp(t), 1e-7))
        << (want_grad ? "dlogits vs CPU" : "logits untouched");
  }
}

class GpuCrossEntropy : public ::testing::TestWithParam<DType> {};

TEST_P(GpuCrossEntropy, FirstShardNoPadding) { check_xent(53, 0, 200, GetParam()); }
TEST_P(GpuCrossEntropy, ShardWithPadding) { check_xent(53, 159, 200, GetParam()); }
TEST_P(GpuCrossEntropy, AllPaddingShard) { check_xent(53, 212, 200, GetParam()); }
TEST_P(GpuCrossEntropy, AlignedShardWithPadding) { check_xent(64, 128, 180, GetParam()); }
TEST_P(GpuCrossEntropy, WideRow) { check_xent(50304, 0, 50257, GetParam()); }

INSTANTIATE_TEST_SUITE_P(Types, GpuCrossEntropy, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// convert between every pair of dtypes: bitwise the shared conversions (core/dtype.h), specials
// included, on the vector and the scalar path.
TEST(GpuPrecision, ConvertIsBitwiseTheSharedConversions) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  const float inf = std::numeric_limits<float>::infinity();
  VecF x = randn(10007, 101, 100.0f);
  const float specials[] = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 65504.0f, 65520.0f,
                            1e-8f, -3e-7f, 5.9604645e-8f, 2.9802322e-8f, 3.4e38f, 1.17e-38f, 1.0f + 1.0f / 256.0f};
  for (size_t i = 0; i < std::size(specials); ++i) x[i] = specials[i];
  const int64_t n = int64_t(x.size());
  for (DType from : kAllTypes)
    for (DType to : kAllTypes)
      for (int64_t off : {int64_t(0), int64_t(1)}) {
        SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to) + (off ? ", scalar path" : ""));
        Pair src(*cpu, *gpu, x, from), dst(*cpu, *gpu, VecF(x.size()), to);
        cpu->convert(dst.cpu.buf() + off, CBuf(src.cpu.buf()) + off, n - off);
        gpu->convert(dst.gpu.buf() + off, CBuf(src.gpu.buf()) + off, n - off);
        EXPECT_TRUE(bitwise(dst.gpu.host(), dst.cpu.host()));
      }
}

TEST(GpuReductions, SumSquaresAndNonfinite) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  for (int64_t n : {int64_t(1), int64_t(1000003), int64_t(7)}) {
    VecF x = randn(size_t(n), 111);
    Pair a(*cpu, *gpu, x);
    const double c = cpu->sum_squares(a.cpu, n), g = gpu->sum_squares(a.gpu, n);
    EXPECT_NEAR(g, c, 1e-12 * c + 1e-30) << "n = " << n;
    EXPECT_FALSE(gpu->has_nonfinite(a.gpu, n));
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      VecF y = x;
      y[size_t(n - 1)] = bad;
      Dev b(*gpu, y);
      EXPECT_TRUE(gpu->has_nonfinite(b, n));
      EXPECT_FALSE(gpu->has_nonfinite(b, n - 1));
    }
  }
  EXPECT_EQ(gpu->sum_squares(nullptr, 0), 0.0);
}

// AdamW on fp32 state, writing the compute copy in its dtype (or none) in the same pass; n not a
// multiple of 4, and an offset start (scalar path).
TEST(GpuOptimizer, AdamWMatchesCpu) {
  const int64_t n = 1001;
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  AdamWParams a{};
  a.lr = 3e-3f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f;
  a.one_minus_beta1 = float(1.0 - 0.9), a.one_minus_beta2 = float(1.0 - 0.95);
  for (int variant = 0; variant < 5; ++variant) {
    const bool has_copy = variant < 4;
    const DType t = variant == 1 ? DType::BF16 : variant == 2 || variant == 3 ? DType::F16 : DType::F32;
    const int64_t off = variant == 3 ? 1 : 0;
    SCOPED_TRACE(has_copy ? std::string("compute copy ") + dtype_name(t) + (off ? ", offset" : "") : "no copy");
    Pair p(*cpu, *gpu, randn(size_t(n), 121)), g(*cpu, *gpu, randn(size_t(n), 122)),
        m(*cpu, *gpu, randn(size_t(n), 123, 0.1f)), v(*cpu, *gpu, VecF(size_t(n), 0.01f)), c(*cpu, *gpu, VecF(size_t(n)), t);
    for (int step = 1; step <= 3; ++step) {
      a.bias_correction1 = float(1.0 - std::pow(0.9, step));
      a.bias_correction2 = float(1.0 - std::pow(0.95, step));
      cpu->adamw(p.cpu.f32() + off, g.cpu.f32() + off, m.cpu.f32() + off, v.cpu.f32() + off, n - off, a, step != 2,
                 has_copy ? c.cpu.buf() + off : Buf{});
      gpu->adamw(p.gpu.f32() + off, g.gpu.f32() + off, m.gpu.f32() + off, v.gpu.f32() + off, n - off, a, step != 2,
                 has_copy ? c.gpu.buf() + off : Buf{});
    }
    // compute copies of p: equal unless p straddles a rounding edge
    EXPECT_TRUE(close(c.gpu.host(), c.cpu.host(), 1e-6 + ulp(t), 1e-7));
    EXPECT_TRUE(close(p.gpu.host(), p.cpu.host(), 1e-6, 1e-7));
    EXPECT_TRUE(close(m.gpu.host(), m.cpu.host(), 1e-6, 1e-7));
    EXPECT_TRUE(close(v.gpu.host(), v.cpu.host(), 1e-6, 1e-9));
  }
}

TEST(GpuMemory, AllocZeroCopyTransfersAndAccounting) {
  auto gpu = gpu_ops();
  const int64_t before = gpu->allocated_bytes();
  const int64_t n = 1237;
  float* a = gpu->alloc(size_t(n));
  const Buf b = gpu->alloc(n, DType::BF16);
  EXPECT_EQ(gpu->allocated_bytes() - before, int64_t((n * 4 + 255) / 256 * 256 + (n * 2 + 255) / 256 * 256))
      << "allocations rounded up to 256 bytes";
  VecF h(size_t(n), 1.0f);
  gpu->to_host(h.data(), a, n);
  EXPECT_TRUE(std::all_of(h.begin(), h.end(), [](float v) { return v == 0.0f; })) << "alloc zeroes";
  std::vector<uint16_t> hb(size_t(n), 1);
  gpu->to_host(hb.data(), b, n);
  EXPECT_TRUE(std::all_of(hb.begin(), hb.end(), [](uint16_t v) { return v == 0; })) << "alloc zeroes (bf16)";
  const VecF x = randn(size_t(n), 131);
  gpu->to_device(a, x.data(), n);
  float* c = gpu->alloc(size_t(n));
  gpu->copy(c, a, n);
  gpu->to_host(h.data(), c, n);
  EXPECT_EQ(h, x);
  gpu->zero(Buf(c) + 10, n - 20);
  gpu->to_host(h.data(), c, n);
  EXPECT_EQ(h[9], x[9]);
  EXPECT_EQ(h[10], 0.0f);
  EXPECT_EQ(h[size_t(n - 11)], 0.0f);
  EXPECT_EQ(h[size_t(n - 10)], x[size_t(n - 10)]);
  // 16-bit: element offsets and counts
  for (size_t i = 0; i < hb.size(); ++i) hb[i] = uint16_t(i + 1);
  gpu->to_device(b, hb.data(), n);
  const Buf b2 = gpu->alloc(n, DType::BF16);
  gpu->copy(b2 + 3, CBuf(b) + 5, n - 5);
  gpu->zero(b2 + 7, 2);
  std::vector<uint16_t> hb2(static_cast<size_t>(n));
  gpu->to_host(hb2.data(), b2, n);
  EXPECT_EQ(hb2[2], 0);
  EXPECT_EQ(hb2[3], 6);
  EXPECT_EQ(hb2[6], 9);
  EXPECT_EQ(hb2[7], 0);
  EXPECT_EQ(hb2[8], 0);
  EXPECT_EQ(hb2[9], 12);
  EXPECT_EQ(hb2[size_t(n - 3)], uint16_t(n));
  EXPECT_EQ(hb2[size_t(n - 2)], 0);
  gpu->free(a);
  gpu->free(b.p);
  gpu->free(b2.p);
  gpu->free(c);
  EXPECT_EQ(gpu->allocated_bytes(), before);
  EXPECT_GE(gpu->peak_allocated_bytes(), int64_t(2 * n * sizeof(float)));
  EXPECT_NE(gpu->name().find("cuda"), std::string::npos);
}

}  // namespace
}  // namespace tpt::gpu_test
