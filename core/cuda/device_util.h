// Device-side helpers of the CUDA kernels (included by .cu files only): grid-stride loops, launch
// sizes, warp and block reductions.
#pragma once
#ifndef __CUDACC__
#error "core/cuda/device_util.h is for .cu files"
#endif
#include <cstdint>

#include "core/cuda/cuda_util.h"

namespace tpt::cuda {

constexpr int kThreads = 256;  // default block size of element-wise and row kernels

// Blocks for a grid-stride loop over n elements (at least 1; capped, the loop covers the rest).
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > (int64_t(1) << 20)) b = int64_t(1) << 20;
  return unsigned(b);
}

// Checks the launch just made (bad configuration, missing kernel image for this GPU).
#define TPT_CUDA_LAUNCHED() TPT_CUDA_CHECK(cudaGetLastError())

#define TPT_GRID_LOOP(i, n)                                                         \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < int64_t(n); \
       i += int64_t(gridDim.x) * blockDim.x)

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <class T, class Op>
__device__ inline T warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduction over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. Safe to call several times in a row in one kernel.
template <class T, class Op>
__device__ inline T block_reduce(T v, Op op, T identity) {
  __shared__ T buf[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_reduce(v, op);
  __syncthreads();  // every thread has read buf[0] of a previous call
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < nwarps ? buf[lane] : identity;
    w = warp_reduce(w, op);
    if (lane == 0) buf[0] = w;
  }
  __syncthreads();
  return buf[0];
}

}  // namespace tpt::cuda
