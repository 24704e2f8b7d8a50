// Attention on the GPU against the CPU backend and the naive reference kernels: the flash-style
// CUDA-core and tensor-core kernels, and cuDNN's fused attention with its dispatch and fallbacks
// (split from kernels_test.cpp; the same helpers, tolerances and conventions). Every path also with
// grouped-query attention: qkv (B, T, (H + 2 KV) D) with KV < H key / value heads (KV = 1: one
// shared by all query heads), next to the KV = H cases of multi-head attention.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "core/cuda/attention/cudnn_attention.h"
#include "core/cuda/kernels.h"
#include "gpu_test_util.h"

namespace tpt::gpu_test {
namespace {

struct AttnCase {
  int64_t B, T, H, KV, D;
};

// Elements of qkv (B, T, (H + 2 KV) D).
size_t qkv_size(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) { return size_t(B * T * (H + 2 * KV) * D); }

class GpuAttention : public ::testing::TestWithParam<AttnCase> {};

// The Ops methods (flash-style kernels) against the CPU backend, and against the naive reference
// kernels on a (B, H, T, T) buffer.
TEST_P(GpuAttention, ForwardAndBackwardMatchCpuAndReference) {
  const auto [B, T, H, KV, D] = GetParam();
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  const size_t nqkv = qkv_size(B, T, H, KV, D), nout = size_t(B * T * H * D), nl = size_t(B * H * T),
               np = size_t(B * H * T * T);
  Pair qkv(*cpu, *gpu, randn(nqkv, 41)), out(*cpu, *gpu, randn(nout, 42)), lse(*cpu, *gpu, randn(nl, 43));
  cpu->attention_forward(out.cpu, lse.cpu, qkv.cpu, B, T, H, KV, D);
  gpu->attention_forward(out.gpu, lse.gpu, qkv.gpu, B, T, H, KV, D);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-5, 1e-5)) << "out";
  EXPECT_TRUE(close(lse.gpu.host(), lse.cpu.host(), 1e-5, 1e-5)) << "lse";
  Pair dout(*cpu, *gpu, randn(nout, 44)), dqkv(*cpu, *gpu, randn(nqkv, 45)), scratch(*cpu, *gpu, randn(nl, 46));
  cpu->attention_backward(dqkv.cpu, scratch.cpu, dout.cpu, qkv.cpu, out.cpu, lse.cpu, B, T, H, KV, D);
  gpu->attention_backward(dqkv.gpu, scratch.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, B, T, H, KV, D);
  EXPECT_TRUE(close(dqkv.gpu.host(), dqkv.cpu.host(), 1e-4, 2e-5)) << "dqkv";

  Dev ref_out(*gpu, nout), ref_lse(*gpu, nl), probs(*gpu, np), dscores(*gpu, np), ref_dqkv(*gpu, nqkv);
  cudaStream_t s = cuda::compute_stream();
  cuda::reference_attention_forward(ref_out, ref_lse, probs, qkv.gpu, B, T, H, KV, D, s);
  cuda::reference_attention_backward(ref_dqkv, dscores, dout.gpu, qkv.gpu, probs, B, T, H, KV, D, s);
  EXPECT_TRUE(close(out.gpu.host(), ref_out.host(), 1e-5, 1e-5)) << "out vs reference";
  EXPECT_TRUE(close(lse.gpu.host(), ref_lse.host(), 1e-5, 1e-5)) << "lse vs reference";
  EXPECT_TRUE(close(dqkv.gpu.host(), ref_dqkv.host(), 1e-4, 2e-5)) << "dqkv vs reference";
  EXPECT_TRUE(close(ref_dqkv.host(), dqkv.cpu.host(), 1e-4, 2e-5)) << "reference dqkv vs cpu";
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttention,
                         ::testing::Values(AttnCase{2, 37, 3, 3, 5}, AttnCase{1, 1, 1, 1, 7}, AttnCase{3, 70, 2, 2, 16},
                                           AttnCase{2, 129, 4, 4, 64}, AttnCase{1, 100, 2, 2, 128},
                                           AttnCase{1, 300, 1, 1, 33},
                                           // grouped-query: 4 and 8 query heads per key / value head, and KV = H
                                           AttnCase{2, 70, 8, 2, 16}, AttnCase{1, 129, 8, 2, 64},
                                           AttnCase{2, 45, 8, 8, 24}, AttnCase{1, 77, 8, 1, 40}),
                         [](const ::testing::TestParamInfo<AttnCase>& info) {
                           const AttnCase& c = info.param;
                           return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" + std::to_string(c.H) +
                                  "_KV" + std::to_string(c.KV) + "_D" + std::to_string(c.D);
                         });

// 16-bit tensors on the CUDA-core kernels (head dimension 24: no tensor-core path; cuDNN off): q,
// k, v, dout read as stored, fp32 math as on the CPU, out and dqkv stored rounded.
TEST(GpuAttention16, SixteenBitStorageMatchesCpu) {
  for (const auto& [t, KV] : {std::pair{DType::BF16, int64_t(6)}, std::pair{DType::BF16, int64_t(2)},
                              std::pair{DType::F16, int64_t(6)}, std::pair{DType::F16, int64_t(2)}}) {
    SCOPED_TRACE(std::string(dtype_name(t)) + ", KV " + std::to_string(KV));
    const int64_t B = 2, T = 45, H = 6, D = 24;
    auto cpu = cpu_ops();
    auto gpu = gpu_ops(own_attention());
    const size_t nqkv = qkv_size(B, T, H, KV, D), nout = size_t(B * T * H * D), nl = size_t(B * H * T);
    Pair qkv(*cpu, *gpu, randn(nqkv, 51), t), out(*cpu, *gpu, VecF(nout), t), lse(*cpu, *gpu, VecF(nl));
    cpu->attention_forward(out.cpu, lse.cpu, qkv.cpu, B, T, H, KV, D);
    gpu->attention_forward(out.gpu, lse.gpu, qkv.gpu, B, T, H, KV, D);
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-5 + 2 * ulp(t), 1e-5));
    EXPECT_TRUE(close(lse.gpu.host(), lse.cpu.host(), 1e-5, 1e-5));
    Pair dout(*cpu, *gpu, randn(nout, 52), t), dqkv(*cpu, *gpu, VecF(nqkv), t), scratch(*cpu, *gpu, VecF(nl));
    cpu->attention_backward(dqkv.cpu, scratch.cpu, dout.cpu, qkv.cpu, out.cpu, lse.cpu, B, T, H, KV, D);
    gpu->attention_backward(dqkv.gpu, scratch.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, B, T, H, KV, D);
    // the GPU's softmax-backward term sum(dout * out) reads the 16-bit out; the CPU's sum(p * dp) does not
    EXPECT_TRUE(close(dqkv.gpu.host(), dqkv.cpu.host(), 2e-2, 2e-2));
  }
}

// The tensor-core kernels on 16-bit tensors: against the CPU backend (which keeps the probabilities
// and their gradient in fp32: bf16 / fp16 rounding apart) and the CUDA-core flash kernels on the GPU.
struct TcCase {
  int64_t B, T, H, KV, D;
  DType t;
};
class GpuTcAttention : public ::testing::TestWithParam<TcCase> {};

TEST_P(GpuTcAttention, MatchCpuAndCudaCoreKernels) {
  const auto [B, T, H, KV, D, t] = GetParam();
  if (!cuda::tc_attention_supported(D, t)) GTEST_SKIP() << "head dimension " << D << ": too little shared memory here";
  auto cpu = cpu_ops();
  auto gpu = gpu_ops(own_attention());  // attention_forward / backward: the tensor-core path on 16-bit tensors
  const size_t nqkv = qkv_size(B, T, H, KV, D), nout = size_t(B * T * H * D), nl = size_t(B * H * T);
  const double u = ulp(t);
  Pair qkv(*cpu, *gpu, randn(nqkv, 71), t), out(*cpu, *gpu, VecF(nout), t), lse(*cpu, *gpu, VecF(nl));
  ASSERT_TRUE(cuda::tc_attention_aligned(qkv.gpu, {}));
  cpu->attention_forward(out.cpu, lse.cpu, qkv.cpu, B, T, H, KV, D);
  gpu->attention_forward(out.gpu, lse.gpu, qkv.gpu, B, T, H, KV, D);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-2 + u, 1e-2)) << "out";  // probabilities rounded for P @ V
  EXPECT_TRUE(close(lse.gpu.host(), lse.cpu.host(), 1e-5, 1e-5)) << "lse";      // scores and sums in fp32
  // both backwards get the CPU's out and lse
  out.gpu.upload(out.cpu.host());
  lse.gpu.upload(lse.cpu.host());
  Pair dout(*cpu, *gpu, randn(nout, 72), t), dqkv(*cpu, *gpu, VecF(nqkv), t), scratch(*cpu, *gpu, VecF(nl));
  cpu->attention_backward(dqkv.cpu, scratch.cpu, dout.cpu, qkv.cpu, out.cpu, lse.cpu, B, T, H, KV, D);
  gpu->attention_backward(dqkv.gpu, scratch.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, B, T, H, KV, D);
  EXPECT_TRUE(close(dqkv.gpu.host(), dqkv.cpu.host(), 2e-2 + u, 2e-2)) << "dqkv";  // dscores rounded
  // the CUDA-core kernels on the same 16-bit inputs: the same up to the 16-bit rounding of P and dS
  Dev out2(*gpu, nout, t), lse2(*gpu, nl), dqkv2(*gpu, nqkv, t), delta2(*gpu, nl);
  cudaStream_t s = cuda::compute_stream();
  cuda::flash_attention_forward(out2, lse2, qkv.gpu, B, T, H, KV, D, s);
  cuda::flash_attention_backward(dqkv2, delta2, dout.gpu, qkv.gpu, out.gpu, lse.gpu, B, T, H, KV, D, s);
  EXPECT_TRUE(close(lse.cpu.host(), lse2.host(), 1e-5, 1e-5)) << "CUDA-core kernel lse";
  EXPECT_TRUE(close(dqkv.gpu.host(), dqkv2.host(), 2e-2 + u, 2e-2)) << "dqkv vs CUDA-core kernels";
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuTcAttention,
                         ::testing::Values(TcCase{2, 100, 3, 3, 64, DType::BF16},
                                           TcCase{1, 129, 2, 2, 128, DType::BF16},
                                           TcCase{3, 64, 2, 2, 32, DType::BF16}, TcCase{1, 1, 1, 1, 64, DType::BF16},
                                           TcCase{2, 200, 1, 1, 32, DType::F16}, TcCase{1, 300, 2, 2, 64, DType::F16},
                                           TcCase{1, 65, 1, 1, 128, DType::F16},
                                           // grouped-query, and KV = H with 8 heads
                                           TcCase{2, 100, 8, 2, 64, DType::BF16},
                                           TcCase{1, 129, 8, 2, 128, DType::F16},
                                           TcCase{2, 70, 8, 1, 32, DType::BF16},
                                           TcCase{1, 130, 8, 8, 64, DType::F16}));

// ---- cuDNN's fused attention (core/cuda/attention/cudnn_attention.h): the CudaOps methods on 16-bit tensors
// take it when the build has it. Against the CPU backend (probabilities and their gradient in fp32)
// and the naive reference on the widened 16-bit inputs, with the tolerances of the tensor-core
// kernels (cuDNN also rounds P and dS to the 16-bit type for their products), and against those
// own kernels on the GPU. Each case asserts that cuDNN ran it.

bool cudnn_forced_off() {
  const char* env = std::getenv("TPTRAIN_CUDNN_ATTENTION");
  return env && std::strcmp(env, "0") == 0;
}

// The own kernels the CudaOps methods fall back to (tensor cores where they run, else CUDA cores).
void own_attention_forward(Buf out, float* lse, CBuf qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  cudaStream_t s = cuda::compute_stream();
  if (cuda::tc_attention_supported(D, qkv.t) && cuda::tc_attention_aligned(qkv, {}))
    cuda::tc_flash_attention_forward(out, lse, qkv, B, T, H, KV, D, s);
  else
    cuda::flash_attention_forward(out, lse, qkv, B, T, H, KV, D, s);
}
void own_attention_backward(Buf dqkv, float* delta, CBuf dout, CBuf qkv, CBuf out, const float* lse, int64_t B,
                            int64_t T, int64_t H, int64_t KV, int64_t D) {
  cudaStream_t s = cuda::compute_stream();
  if (cuda::tc_attention_supported(D, qkv.t) && cuda::tc_attention_aligned(qkv, dout))
    cuda::tc_flash_attention_backward(dqkv, delta, dout, qkv, out, lse, B, T, H, KV, D, s);
  else
    cuda::flash_attention_backward(dqkv, delta, dout, qkv, out, lse, B, T, H, KV, D, s);
}

struct CudnnCase {
  int64_t B, T, H, KV, D;
  DType t;
};
std::string cudnn_name(const ::testing::TestParamInfo<CudnnCase>& info) {
  const CudnnCase& c = info.param;
  return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" + std::to_string(c.H) + "_KV" +
         std::to_string(c.KV) + "_D" + std::to_string(c.D) + "_" + dtype_name(c.t);
}
class GpuCudnnAttention : public ::testing::TestWithParam<CudnnCase> {};

TEST_P(GpuCudnnAttention, MatchesCpuOwnKernelsAndReference) {
  const auto [B, T, H, KV, D, t] = GetParam();
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN (TPTRAIN_CUDNN)";
  if (cudnn_forced_off()) GTEST_SKIP() << "TPTRAIN_CUDNN_ATTENTION=0";
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();  // attention_forward / backward through cuDNN on 16-bit tensors
  const size_t nqkv = qkv_size(B, T, H, KV, D), nout = size_t(B * T * H * D), nl = size_t(B * H * T),
               np = size_t(B * H * T * T);
  const double u = ulp(t);
  const VecF hqkv = randn(nqkv, 81), hdout = randn(nout, 82);
  Pair qkv(*cpu, *gpu, hqkv, t), out(*cpu, *gpu, randn(nout, 83), t), lse(*cpu, *gpu, randn(nl, 84));

  // forward
  const cuda::CudnnAttentionStats s0 = cuda::cudnn_attention_stats();
  cpu->attention_forward(out.cpu, lse.cpu, qkv.cpu, B, T, H, KV, D);
  gpu->attention_forward(out.gpu, lse.gpu, qkv.gpu, B, T, H, KV, D);
  const cuda::CudnnAttentionStats s1 = cuda::cudnn_attention_stats();
  ASSERT_EQ(s1.forward, s0.forward + 1) << "cuDNN did not run the forward (its warning above says why)";
  const VecF out_cudnn = out.gpu.host(), lse_cudnn = lse.gpu.host();
  EXPECT_TRUE(close(out_cudnn, out.cpu.host(), 1e-2 + u, 1e-2)) << "out vs CPU";  // P rounded for P @ V
  EXPECT_TRUE(close(lse_cudnn, lse.cpu.host(), 1e-4, 1e-4)) << "lse vs CPU";      // scores and sums in fp32

  // backward, both from the CPU's out and lse (cuDNN's stats convention is the lse's); dqkv starts
  // as garbage: "=", not "+="
  out.gpu.upload(out.cpu.host());
  lse.gpu.upload(lse.cpu.host());
  Pair dout(*cpu, *gpu, hdout, t), dqkv(*cpu, *gpu, randn(nqkv, 85), t), scratch(*cpu, *gpu, randn(nl, 86));
  cpu->attention_backward(dqkv.cpu, scratch.cpu, dout.cpu, qkv.cpu, out.cpu, lse.cpu, B, T, H, KV, D);
  gpu->attention_backward(dqkv.gpu, scratch.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, B, T, H, KV, D);
  const cuda::CudnnAttentionStats s2 = cuda::cudnn_attention_stats();
  ASSERT_EQ(s2.backward, s1.backward + 1) << "cuDNN did not run the backward (its warning above says why)";
  EXPECT_EQ(s2.fell_back, s0.fell_back);
  const VecF dqkv_cudnn = dqkv.gpu.host();
  EXPECT_TRUE(close(dqkv_cudnn, dqkv.cpu.host(), 2e-2 + u, 2e-2)) << "dqkv vs CPU";  // dS rounded

  // the own kernels on the same inputs (forward; backward from the CPU's out and lse)
  Dev out2(*gpu, nout, t), lse2(*gpu, nl), dqkv2(*gpu, nqkv, t), delta2(*gpu, nl);
  own_attention_forward(out2, lse2, qkv.gpu, B, T, H, KV, D);
  own_attention_backward(dqkv2, delta2, dout.gpu, qkv.gpu, out.gpu, lse.gpu, B, T, H, KV, D);
  EXPECT_TRUE(close(out_cudnn, out2.host(), 1e-2 + u, 1e-2)) << "out vs own kernels";
  EXPECT_TRUE(close(lse_cudnn, lse2.host(), 1e-4, 1e-4)) << "lse vs own kernels";
  EXPECT_TRUE(close(dqkv_cudnn, dqkv2.host(), 2e-2 + u, 2e-2)) << "dqkv vs own kernels";

  // the naive reference on the 16-bit values widened to fp32 (probabilities exact)
  Dev qkv32(*gpu, rounded(hqkv, t)), dout32(*gpu, rounded(hdout, t));
  Dev ref_out(*gpu, nout), ref_lse(*gpu, nl), probs(*gpu, np), dscores(*gpu, np), ref_dqkv(*gpu, nqkv);
  cudaStream_t s = cuda::compute_stream();
  cuda::reference_attention_forward(ref_out, ref_lse, probs, qkv32, B, T, H, KV, D, s);
  cuda::reference_attention_backward(ref_dqkv, dscores, dout32, qkv32, probs, B, T, H, KV, D, s);
  EXPECT_TRUE(close(out_cudnn, ref_out.host(), 1e-2 + u, 1e-2)) << "out vs reference";
  EXPECT_TRUE(close(lse_cudnn, ref_lse.host(), 1e-4, 1e-4)) << "lse vs reference";
  EXPECT_TRUE(close(dqkv_cudnn, ref_dqkv.host(), 2e-2 + u, 2e-2)) << "dqkv vs reference";
}

// GPT-2's shape (B 4 of its 16), then T not a multiple of 64, three heads, head dimensions 32 and 128
INSTANTIATE_TEST_SUITE_P(Shapes, GpuCudnnAttention,
                         ::testing::Values(CudnnCase{4, 1024, 12, 12, 64, DType::BF16},
                                           CudnnCase{4, 1024, 12, 12, 64, DType::F16},
                                           CudnnCase{2, 100, 3, 3, 64, DType::BF16},
                                           CudnnCase{1, 129, 2, 2, 128, DType::BF16},
                                           CudnnCase{3, 77, 3, 3, 32, DType::BF16},
                                           CudnnCase{2, 300, 2, 2, 128, DType::F16},
                                           CudnnCase{1, 65, 3, 3, 32, DType::F16},
                                           CudnnCase{2, 200, 3, 3, 64, DType::F16},
                                           // grouped-query (LLaMA-style 4 and 8 query heads per key / value
                                           // head), and KV = H with 8 heads
                                           CudnnCase{2, 256, 8, 2, 64, DType::BF16},
                                           CudnnCase{1, 129, 8, 2, 128, DType::F16},
                                           CudnnCase{2, 100, 8, 1, 64, DType::BF16},
                                           CudnnCase{2, 200, 8, 8, 64, DType::F16}),
                         cudnn_name);

// Which attention runs: cuDNN when built in (and said so in the backend's name), the own kernels
// for head dimensions cuDNN cannot take (not a multiple of 8), misaligned tensors, fp32, and with
// TPTRAIN_CUDNN_ATTENTION=0; the results then are the own kernels'.
TEST(GpuCudnnAttentionDispatch, FallsBackWhereCudnnCannotRun) {
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN (TPTRAIN_CUDNN)";
  if (cudnn_forced_off()) GTEST_SKIP() << "TPTRAIN_CUDNN_ATTENTION=0";
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  EXPECT_NE(gpu->name().find("cuDNN SDPA"), std::string::npos) << gpu->name();
  std::printf("%s\n", gpu->name().c_str());
  const DType t = DType::BF16;
  {  // head dimension 12: cuDNN refuses, the CUDA-core kernels run it (grouped-query)
    const int64_t B = 2, T = 40, H = 4, KV = 2, D = 12;
    const size_t nqkv = qkv_size(B, T, H, KV, D), nout = size_t(B * T * H * D), nl = size_t(B * H * T);
    Pair qkv(*cpu, *gpu, randn(nqkv, 91), t), out(*cpu, *gpu, VecF(nout), t), lse(*cpu, *gpu, VecF(nl));
    Pair dout(*cpu, *gpu, randn(nout, 92), t), dqkv(*cpu, *gpu, VecF(nqkv), t), scratch(*cpu, *gpu, VecF(nl));
    const cuda::CudnnAttentionStats s0 = cuda::cudnn_attention_stats();
    gpu->attention_forward(out.gpu, lse.gpu, qkv.gpu, B, T, H, KV, D);
    gpu->attention_backward(dqkv.gpu, scratch.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, B, T, H, KV, D);
    const cuda::CudnnAttentionStats s1 = cuda::cudnn_attention_stats();
    EXPECT_EQ(s1.forward, s0.forward);
    EXPECT_EQ(s1.backward, s0.backward);
    EXPECT_EQ(s1.fell_back, s0.fell_back + 2);
    cpu->attention_forward(out.cpu, lse.cpu, qkv.cpu, B, T, H, KV, D);
    cpu->attention_backward(dqkv.cpu, scratch.cpu, dout.cpu, qkv.cpu, out.cpu, lse.cpu, B, T, H, KV, D);
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-5 + 2 * ulp(t), 1e-5)) << "out, D 12";
    EXPECT_TRUE(close(lse.gpu.host(), lse.cpu.host(), 1e-5, 1e-5)) << "lse, D 12";
    EXPECT_TRUE(close(dqkv.gpu.host(), dqkv.cpu.host(), 2e-2, 2e-2)) << "dqkv, D 12";
  }
  {  // qkv one element into its buffer (2 bytes: not 16-byte aligned): the CUDA-core kernels
    const int64_t B = 1, T = 50, H = 2, KV = 2, D = 64;
    const size_t nqkv = qkv_size(B, T, H, KV, D), nout = size_t(B * T * H * D), nl = size_t(B * H * T);
    VecF host = randn(nqkv + 1, 93);
    Pair raw(*cpu, *gpu, host, t), out(*cpu, *gpu, VecF(nout), t), lse(*cpu, *gpu, VecF(nl));
    const CBuf qc = raw.cpu.buf() + 1, qg = raw.gpu.buf() + 1;
    const cuda::CudnnAttentionStats s0 = cuda::cudnn_attention_stats();
    gpu->attention_forward(out.gpu, lse.gpu, qg, B, T, H, KV, D);
    const cuda::CudnnAttentionStats s1 = cuda::cudnn_attention_stats();
    EXPECT_EQ(s1.forward, s0.forward);
    EXPECT_EQ(s1.fell_back, s0.fell_back + 1);
    cpu->attention_forward(out.cpu, lse.cpu, qc, B, T, H, KV, D);
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-5 + 2 * ulp(t), 1e-5)) << "out, misaligned";
    EXPECT_TRUE(close(lse.gpu.host(), lse.cpu.host(), 1e-5, 1e-5)) << "lse, misaligned";
  }
  {  // fp32: the own kernels, cuDNN not even asked
    const int64_t B = 1, T = 20, H = 2, KV = 1, D = 64;
    Dev qkv(*gpu, randn(qkv_size(B, T, H, KV, D), 94)), out(*gpu, size_t(B * T * H * D)), lse(*gpu, size_t(B * H * T));
    const cuda::CudnnAttentionStats s0 = cuda::cudnn_attention_stats();
    gpu->attention_forward(out, lse, qkv, B, T, H, KV, D);
    const cuda::CudnnAttentionStats s1 = cuda::cudnn_attention_stats();
    EXPECT_EQ(s1.forward, s0.forward);
    EXPECT_EQ(s1.fell_back, s0.fell_back);
  }
}

TEST(GpuCudnnAttentionDispatch, EnvironmentAndOptionsTurnItOff) {
  const int64_t B = 1, T = 64, H = 2, KV = 2, D = 64;
  const char* prev = std::getenv("TPTRAIN_CUDNN_ATTENTION");
  const std::string saved = prev ? prev : "";
  setenv("TPTRAIN_CUDNN_ATTENTION", "0", 1);
  auto off_env = gpu_ops();
  if (prev) setenv("TPTRAIN_CUDNN_ATTENTION", saved.c_str(), 1);
  else unsetenv("TPTRAIN_CUDNN_ATTENTION");
  auto off_opt = gpu_ops(own_attention());
  for (Ops* gpu : {off_env.get(), off_opt.get()}) {
    EXPECT_NE(gpu->name().find("own flash kernels ("), std::string::npos) << gpu->name();
    Dev qkv(*gpu, randn(qkv_size(B, T, H, KV, D), 95), DType::BF16), out(*gpu, size_t(B * T * H * D), DType::BF16),
        lse(*gpu, size_t(B * H * T));
    const cuda::CudnnAttentionStats s0 = cuda::cudnn_attention_stats();
    gpu->attention_forward(out, lse, qkv, B, T, H, KV, D);
    const cuda::CudnnAttentionStats s1 = cuda::cudnn_attention_stats();
    EXPECT_EQ(s1.forward, s0.forward);
    EXPECT_EQ(s1.fell_back, s0.fell_back);  // not asked at all
  }
}

// The deterministic backward (the default) is bitwise reproducible; the nondeterministic one
// (training.deterministic: false) agrees with it up to summation order. Multi-head and
// grouped-query (cuDNN sums dK / dV over each group's query heads).
TEST(GpuCudnnAttentionDispatch, DeterministicBackwardIsReproducible) {
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN (TPTRAIN_CUDNN)";
  if (cudnn_forced_off()) GTEST_SKIP() << "TPTRAIN_CUDNN_ATTENTION=0";
  for (int64_t KV : {int64_t(4), int64_t(2)}) {
    SCOPED_TRACE("KV " + std::to_string(KV));
    const int64_t B = 2, T = 512, H = 4, D = 64;
    const DType t = DType::BF16;
    const size_t nqkv = qkv_size(B, T, H, KV, D), nout = size_t(B * T * H * D), nl = size_t(B * H * T);
    CudaOptions nondet;
    nondet.cudnn_deterministic = false;
    auto gpu = gpu_ops();
    auto fast = gpu_ops(nondet);
    Dev qkv(*gpu, randn(nqkv, 96), t), out(*gpu, nout, t), lse(*gpu, nl), dout(*gpu, randn(nout, 97), t);
    Dev dqkv1(*gpu, nqkv, t), dqkv2(*gpu, nqkv, t), dqkv3(*gpu, nqkv, t), scratch(*gpu, nl);
    const cuda::CudnnAttentionStats s0 = cuda::cudnn_attention_stats();
    gpu->attention_forward(out, lse, qkv, B, T, H, KV, D);
    gpu->attention_backward(dqkv1, scratch, dout, qkv, out, lse, B, T, H, KV, D);
    gpu->attention_backward(dqkv2, scratch, dout, qkv, out, lse, B, T, H, KV, D);
    fast->attention_backward(dqkv3, scratch, dout, qkv, out, lse, B, T, H, KV, D);
    const cuda::CudnnAttentionStats s1 = cuda::cudnn_attention_stats();
    ASSERT_EQ(s1.backward, s0.backward + 3) << "cuDNN did not run every backward (its warnings above say why)";
    EXPECT_TRUE(bitwise(dqkv1.host(), dqkv2.host())) << "deterministic backward, twice";
    EXPECT_TRUE(close(dqkv3.host(), dqkv1.host(), 1e-2 + ulp(t), 1e-2)) << "nondeterministic vs deterministic";
  }
}

}  // namespace
}  // namespace tpt::gpu_test
