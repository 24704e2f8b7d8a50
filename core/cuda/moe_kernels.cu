// The CUDA backend's Mixture-of-Experts row movement (core/ops.h gather_rows, combine_rows, row_dots):
// element-wise passes over the output rows, each output element written by one thread that adds its
// terms in index order (no atomics); row_dots one warp per (token, choice) with a fixed shuffle tree.
// Instantiated for the storage type of the compute-dtype rows (device_util.h): fp32 inside, rounded
// once on store.
#include <cstdint>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"
#include "core/cuda/launch_util.h"

namespace tpt::cuda {
namespace {

template <class T>
struct GatherRowsF {
  T* out;
  const T* in;
  const int32_t* idx;
  const float* scale;
  int64_t C;
  template <int W>
  __device__ void apply(int64_t i) const {
    const int64_t r = i / C, c = i % C;
    const int32_t src = idx[r];
    float v = 0;
    if (src >= 0) v = scale ? scale[r] * ld(in, int64_t(src) * C + c) : ld(in, int64_t(src) * C + c);
    st(out, i, v);
  }
};

template <class T>
struct CombineRowsF {
  T* out;
  const T* in;
  const int32_t* idx;
  const float* w;
  int64_t K, C;
  bool accumulate;
  template <int W>
  __device__ void apply(int64_t i) const {
    const int64_t t = i / C, c = i % C;
    float v = accumulate ? ld(out, i) : 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = idx[t * K + j];
      if (r < 0) continue;
      const float x = ld(in, int64_t(r) * C + c);
      v += w ? w[t * K + j] * x : x;
    }
    st(out, i, v);
  }
};

// one warp per (t, j), the warps striding over the pairs (the grid is capped: blocks_for): lanes
// stride over C, then a fixed butterfly sum. The loop's condition is the same on the warp's 32 lanes.
template <class T>
__global__ void row_dots_kernel(float* out, const T* a, const T* b, const int32_t* idx, int64_t pairs, int64_t K,
                                int64_t C) {
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int lane = int(threadIdx.x % 32);
  for (int64_t p = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; p < pairs; p += warps) {
    const int64_t t = p / K;
    const int32_t r = idx[p];
    float s = 0;
    if (r >= 0)
      for (int64_t c = lane; c < C; c += 32) s += ld(a, t * C + c) * ld(b, int64_t(r) * C + c);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) out[p] = s;
  }
}

}  // namespace

void gather_rows(Buf out, CBuf in, const int32_t* idx, const float* scale, int64_t R, int64_t C, cudaStream_t s) {
  check_same(out.t, in.t, "gather_rows");
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    const GatherRowsF<T> f{typed<T>(out), typed<T>(in), idx, scale, C};
    launch_elementwise<1>(R * C, false, f, s);
  });
}

void combine_rows(Buf out, CBuf in, const int32_t* idx, const float* w, int64_t N, int64_t K, int64_t C,
                  bool accumulate, cudaStream_t s) {
  check_same(out.t, in.t, "combine_rows");
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    const CombineRowsF<T> f{typed<T>(out), typed<T>(in), idx, w, K, C, accumulate};
    launch_elementwise<1>(N * C, false, f, s);
  });
}

void row_dots(float* out, CBuf a, CBuf b, const int32_t* idx, int64_t N, int64_t K, int64_t C, cudaStream_t s) {
  check_same(a.t, b.t, "row_dots");
  const int64_t pairs = N * K;
  if (pairs <= 0) return;
  dispatch(a.t, [&](auto tag) {
    using T = decltype(tag);
    row_dots_kernel<T><<<blocks_for(pairs * 32), kThreads, 0, s>>>(out, typed<T>(a), typed<T>(b), idx, pairs, K, C);
    TPT_CUDA_LAUNCHED();
  });
}

}  // namespace tpt::cuda
