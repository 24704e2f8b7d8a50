// The CUDA backend's FP8 kernels against the CPU emulation (docs/FP8.md): Ops::fp8_quantize's codes
// and amax bit for bit, for fp32 / bf16 / fp16 inputs of awkward sizes over the whole FP8 range and
// beyond (saturation), with infinities, signed zeros, subnormals and a NaN.
#include <cstring>
#include <random>

#include "gpu_test_util.h"

namespace tpt::gpu_test {
namespace {

VecF fp8_inputs(size_t n, uint32_t seed, bool with_nan) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> e(-30.0f, 20.0f), sign(-1.0f, 1.0f);
  VecF v(n);
  for (float& x : v) x = std::copysign(std::exp2(e(gen)), sign(gen));
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, 448.0f, 464.0f, 57344.0f, 61440.0f, 1e-7f, -0x1p-10f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(float) && i < n; ++i) v[i * 7 % n] = specials[i];
  if (with_nan) v[n / 2] = NAN;
  return v;
}

TEST(GpuFp8, QuantizeAndAmaxBitwiseAsCpu) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (Fp8Type t : {Fp8Type::E4M3, Fp8Type::E5M2})
      for (size_t n : {size_t(1), size_t(1000), size_t(300007)})
        for (bool nan : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + (t == Fp8Type::E4M3 ? " e4m3 n " : " e5m2 n ") +
                       std::to_string(n) + (nan ? " nan" : ""));
          const VecF x = fp8_inputs(n, uint32_t(n + 7 * int(t)), nan && n > 1);
          Pair in(*cpu, *gpu, x, dt);
          const float scale = 3.7f, amax0 = 0.25f;
          Pair sc(*cpu, *gpu, VecF{scale}), am(*cpu, *gpu, VecF{amax0});
          Dev qc(*cpu, (n + 3) / 4), qg(*gpu, (n + 3) / 4);  // n bytes
          cpu->fp8_quantize(static_cast<uint8_t*>(qc.buf().p), in.cpu, int64_t(n), t, sc.cpu, am.cpu);
          gpu->fp8_quantize(static_cast<uint8_t*>(qg.buf().p), in.gpu, int64_t(n), t, sc.gpu, am.gpu);
          std::vector<uint8_t> hc((n + 3) / 4 * 4), hg(hc.size());
          cpu->to_host(hc.data(), qc, int64_t(hc.size() / 4));
          gpu->to_host(hg.data(), qg, int64_t(hg.size() / 4));
          size_t diff = 0;
          for (size_t i = 0; i < n; ++i) diff += hc[i] != hg[i];
          EXPECT_EQ(diff, 0u);
          EXPECT_TRUE(bitwise(am.gpu.host(), am.cpu.host()));
        }
}

}  // namespace
}  // namespace tpt::gpu_test
