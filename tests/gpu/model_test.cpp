// A tiny GPT trained for a few steps on the GPU and on the CPU from the same initial weights and
// tokens (one stage, TP = PP = 1, two micro-batches per step, AdamW): fp32 losses within 1e-4
// (TF32 off), gradients and final weights close; bf16 (activations, logits and the compute copy of
// the weights stored as bf16 on both backends) within 2e-2 of the CPU's bf16 and fp32 losses (the
// precision test's tolerance), with cuBLASLt's epilogues and with the separate kernels.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/cuda/cudnn_attention.h"
#include "core/cuda/kernels.h"
#include "parallel/nccl_comm.h"
#include "tiny_model.h"

namespace tpt::gpu_test {
namespace {

const std::unique_ptr<Comm> host = make_self_comm();         // TP = 1 on the CPU
const std::unique_ptr<Comm> dev = make_device_self_comm();   // and on the GPU

TEST(GpuModel, Fp32TrainingMatchesCpu) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  const Trained c = train(*cpu, *host, DType::F32, 4, 2);
  const Trained g = train(*gpu, *dev, DType::F32, 4, 2);
  for (size_t k = 0; k < c.losses.size(); ++k) {
    EXPECT_NEAR(g.losses[k], c.losses[k], 1e-4 * std::fabs(c.losses[k])) << "step " << k + 1;
    std::printf("step %zu: loss cpu %.7f gpu %.7f\n", k + 1, c.losses[k], g.losses[k]);
  }
  double gmax = 0;
  for (float v : c.first_grads) gmax = std::max(gmax, double(std::fabs(v)));
  EXPECT_TRUE(close(g.first_grads, c.first_grads, 1e-3, 1e-4 * gmax)) << "gradients of step 1";
  // AdamW normalizes each element's step, so elements whose gradient is noise may move apart by
  // up to lr; the weights as a whole stay together
  EXPECT_LT(relative_distance(g.params, c.params, c.init), 1e-2) << "weights after the last step";
}

TEST(GpuModel, Bf16TrainingWithinTheMixedPrecisionTolerance) {
  auto cpu = cpu_ops();
  const Trained c32 = train(*cpu, *host, DType::F32, 4, 2);
  const Trained c16 = train(*cpu, *host, DType::BF16, 4, 2);
  for (bool epilogues : {true, false}) {
    SCOPED_TRACE(epilogues ? "cuBLASLt epilogues" : "separate kernels");
    CudaOptions opt;
    opt.gemm_epilogues = epilogues;
    auto gpu = gpu_ops(opt);
    const Trained g16 = train(*gpu, *dev, DType::BF16, 4, 2);
    for (size_t k = 0; k < c32.losses.size(); ++k) {
      EXPECT_NEAR(g16.losses[k], c16.losses[k], 2e-2) << "step " << k + 1 << " vs CPU bf16";
      EXPECT_NEAR(g16.losses[k], c32.losses[k], 2e-2) << "step " << k + 1 << " vs CPU fp32";
      std::printf("step %zu: loss cpu fp32 %.6f cpu bf16 %.6f gpu bf16 %.6f (%s)\n", k + 1, c32.losses[k],
                  c16.losses[k], g16.losses[k], epilogues ? "epilogues" : "no epilogues");
    }
  }
}

// Head dimension 32: the bf16 run's attention goes through the tensor-core kernels (attention_tc.cu;
// cuDNN off).
TEST(GpuModel, Bf16TensorCoreAttentionTrainingWithinTheMixedPrecisionTolerance) {
  Config cfg = tiny_config();
  cfg.model.hidden_size = 64;
  cfg.model.num_attention_heads = 2;
  ASSERT_TRUE(cuda::tc_attention_supported(32, DType::BF16));
  auto cpu = cpu_ops();
  auto gpu = gpu_ops(own_attention());
  const Trained c16 = train(*cpu, *host, DType::BF16, 4, 2, cfg);
  const Trained g16 = train(*gpu, *dev, DType::BF16, 4, 2, cfg);
  for (size_t k = 0; k < c16.losses.size(); ++k) {
    EXPECT_NEAR(g16.losses[k], c16.losses[k], 2e-2) << "step " << k + 1 << " vs CPU bf16";
    std::printf("step %zu: loss cpu bf16 %.6f gpu bf16 (tensor-core attention) %.6f\n", k + 1, c16.losses[k],
                g16.losses[k]);
  }
}

// Head dimension 32 (sequence 33): the bf16 run's attention goes through cuDNN's fused SDPA, every
// call; against the CPU's bf16 run and the GPU's run on the own tensor-core kernels.
TEST(GpuModel, Bf16CudnnAttentionTrainingWithinTheMixedPrecisionTolerance) {
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN (TPTRAIN_CUDNN)";
  const char* env = std::getenv("TPTRAIN_CUDNN_ATTENTION");
  if (env && std::strcmp(env, "0") == 0) GTEST_SKIP() << "TPTRAIN_CUDNN_ATTENTION=0";
  Config cfg = tiny_config();
  cfg.model.hidden_size = 64;
  cfg.model.num_attention_heads = 2;
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  auto own = gpu_ops(own_attention());
  const Trained c16 = train(*cpu, *host, DType::BF16, 4, 2, cfg);
  const cuda::CudnnAttentionStats s0 = cuda::cudnn_attention_stats();
  const Trained g16 = train(*gpu, *dev, DType::BF16, 4, 2, cfg);
  const cuda::CudnnAttentionStats s1 = cuda::cudnn_attention_stats();
  const Trained o16 = train(*own, *dev, DType::BF16, 4, 2, cfg);
  // 4 steps x 2 micro-batches x 2 layers, forward and backward, all on cuDNN
  EXPECT_EQ(s1.forward - s0.forward, 16);
  EXPECT_EQ(s1.backward - s0.backward, 16);
  EXPECT_EQ(s1.fell_back, s0.fell_back);
  for (size_t k = 0; k < c16.losses.size(); ++k) {
    EXPECT_NEAR(g16.losses[k], c16.losses[k], 2e-2) << "step " << k + 1 << " vs CPU bf16";
    EXPECT_NEAR(g16.losses[k], o16.losses[k], 2e-2) << "step " << k + 1 << " vs the own kernels";
    std::printf("step %zu: loss cpu bf16 %.6f gpu bf16 cuDNN attention %.6f, own kernels %.6f\n", k + 1,
                c16.losses[k], g16.losses[k], o16.losses[k]);
  }
  // the gradients of step 1 as a whole (L2), against the own kernels' (bf16 rounding apart)
  const VecF zero(o16.first_grads.size(), 0.0f);
  EXPECT_LT(relative_distance(g16.first_grads, o16.first_grads, zero), 5e-2) << "gradients of step 1";
}

// fp16 storage (no loss scaling here: the tiny model's gradients stay in fp16's range).
TEST(GpuModel, Fp16TrainingWithinTheMixedPrecisionTolerance) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  const Trained c16 = train(*cpu, *host, DType::F16, 3, 2);
  const Trained g16 = train(*gpu, *dev, DType::F16, 3, 2);
  for (size_t k = 0; k < c16.losses.size(); ++k) {
    EXPECT_NEAR(g16.losses[k], c16.losses[k], 2e-2) << "step " << k + 1 << " vs CPU fp16";
    std::printf("step %zu: loss cpu fp16 %.6f gpu fp16 %.6f\n", k + 1, c16.losses[k], g16.losses[k]);
  }
}

TEST(GpuModel, GemmEpiloguesChangeOnlyRounding) {
  CudaOptions off;
  off.gemm_epilogues = false;
  auto with = gpu_ops();
  auto without = gpu_ops(off);
  const Trained a = train(*with, *dev, DType::F32, 2, 1);
  const Trained b = train(*without, *dev, DType::F32, 2, 1);
  for (size_t k = 0; k < a.losses.size(); ++k) EXPECT_NEAR(a.losses[k], b.losses[k], 1e-5 * std::fabs(b.losses[k]));
  double gmax = 0;
  for (float v : b.first_grads) gmax = std::max(gmax, double(std::fabs(v)));
  EXPECT_TRUE(close(a.first_grads, b.first_grads, 1e-4, 1e-5 * gmax));
}

}  // namespace
}  // namespace tpt::gpu_test
