// FP8 kernels (docs/FP8.md): the fused quantize + amax of Ops::fp8_quantize, per element through
// core/fp8.h's conversion (so its codes are the CPU emulation's bit for bit), the amax as the maximum
// of |x|'s bit patterns: a block reduction, then one atomicMax per block (order-free: deterministic).
#include <cstdint>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"
#include "core/cuda/launch_util.h"
#include "core/fp8.h"

namespace tpt::cuda {
namespace {

struct MaxBits {
  __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return a > b ? a : b; }
};

template <class T>
__global__ void fp8_quantize_kernel(uint8_t* out, const T* in, int64_t n, Fp8Type t, const float* scale,
                                    float* amax) {
  const float s = *scale;
  uint32_t m = 0;
  TPT_GRID_LOOP(i, n) {
    const float x = ld(in, i);
    out[i] = fp32_to_fp8(x * s, t);
    m = m > fp8_abs_bits(x) ? m : fp8_abs_bits(x);
  }
  m = block_reduce(m, MaxBits{}, 0u);
  if (threadIdx.x == 0 && m) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
}

}  // namespace

void fp8_quantize(uint8_t* out, CBuf in, int64_t n, Fp8Type t, const float* scale, float* amax, cudaStream_t s) {
  if (n <= 0) return;
  dispatch(in.t, [&](auto tag) {
    using T = decltype(tag);
    fp8_quantize_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(out, typed<T>(in), n, t, scale, amax);
    TPT_CUDA_LAUNCHED();
  });
}

}  // namespace tpt::cuda
