// A tiny Mixture-of-Experts model (the LLaMA shape's with 4 SwiGLU experts of width 48, top 2, and a
// gated shared expert of width 32; one stage, EP 1) trained on the GPU and on the CPU from the same
// weights and tokens: the router's GEMM, the dispatch's gathers and combines and the experts' GEMMs on
// the GPU's kernels (the routing itself on the host, as on CPU ranks). fp32 within 1e-4 of the CPU (a
// token whose top-2 flips on a rounding moves the loss by far less), bf16 within the mixed-precision
// tolerance, and selective recompute with the moe_act and moe modules within a few bf16 steps of the
// GPU run that keeps everything.
#include <cmath>
#include <cstdio>
#include <memory>

#include "parallel/nccl_comm.h"
#include "tiny_model.h"

namespace tpt::gpu_test {
namespace {

const std::unique_ptr<Comm> host = make_self_comm();
const std::unique_ptr<Comm> dev = make_device_self_comm();

Config tiny_moe_config() {
  Config c = tiny_llama_config();
  ModelConfig& m = c.model;
  m.num_moe_experts = 4;
  m.moe_ffn_hidden_size = 48;
  m.moe_router_topk = 2;
  m.moe_shared_expert_intermediate_size = 32;
  m.moe_shared_expert_gate = true;
  return c;
}

TEST(GpuMoE, Fp32TrainingMatchesCpu) {
  const Config cfg = tiny_moe_config();
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  const Trained c = train(*cpu, *host, DType::F32, 4, 2, cfg);
  const Trained g = train(*gpu, *dev, DType::F32, 4, 2, cfg);
  for (size_t k = 0; k < c.losses.size(); ++k) {
    EXPECT_NEAR(g.losses[k], c.losses[k], 1e-4 * std::fabs(c.losses[k])) << "step " << k + 1;
    std::printf("moe step %zu: loss cpu %.7f gpu %.7f\n", k + 1, c.losses[k], g.losses[k]);
  }
  EXPECT_LT(relative_distance(g.params, c.params, c.init), 1e-2) << "weights after the last step";
}

TEST(GpuMoE, Bf16TrainingWithinTheMixedPrecisionToleranceAndRecompute) {
  const Config kept = tiny_moe_config();
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  const Trained c16 = train(*cpu, *host, DType::BF16, 4, 2, kept);
  const Trained g16 = train(*gpu, *dev, DType::BF16, 4, 2, kept);
  for (const bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "recompute modules moe_act, moe" : "recompute module moe_act");
    Config cfg = kept;
    cfg.training.recompute = Recompute::Selective;
    cfg.training.recompute_modules.moe_act = true;
    cfg.training.recompute_modules.moe = moe;
    const Trained r16 = train(*gpu, *dev, DType::BF16, 4, 2, cfg);
    for (size_t k = 0; k < c16.losses.size(); ++k) {
      EXPECT_NEAR(g16.losses[k], c16.losses[k], 2e-2) << "step " << k + 1 << " vs CPU bf16";
      EXPECT_NEAR(r16.losses[k], g16.losses[k], 2e-3) << "step " << k + 1 << " vs the GPU keeping everything";
      std::printf("moe bf16 step %zu: loss cpu %.6f gpu %.6f gpu recompute%s %.6f\n", k + 1, c16.losses[k],
                  g16.losses[k], moe ? " (moe_act, moe)" : " (moe_act)", r16.losses[k]);
    }
  }
}

}  // namespace
}  // namespace tpt::gpu_test
