// Device-side helpers of the CUDA kernels (included by .cu files only): grid-stride loops, launch
// sizes, warp and block reductions, and the storage types of compute-dtype tensors with their
// loads and stores (scalar and 16-byte vectors).
#pragma once
#ifndef __CUDACC__
#error "core/cuda/device_util.h is for .cu files"
#endif
#include <cstdint>
#include <type_traits>

#include "core/cuda/cuda_util.h"
#include "core/dtype.h"
#include "core/ops.h"  // Buf, CBuf

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

// ---------------------------------------------------------------- storage types
// A compute-dtype tensor holds float, or the raw bits of bf16 / fp16 values (core/dtype.h): kernels
// are templated on the storage type T, load through to_f32 and store through store_f32 (rounded to
// nearest even by the shared conversions, so a store is the CPU backend's store bit for bit).

struct bf16 {
  uint16_t bits;
};
struct fp16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2, "16-bit storage");

template <class T>
constexpr DType dtype_of() {
  return std::is_same_v<T, float> ? DType::F32 : std::is_same_v<T, bf16> ? DType::BF16 : DType::F16;
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return bf16_to_fp32(x.bits); }
__device__ __forceinline__ float to_f32(fp16 x) { return fp16_to_fp32(x.bits); }

__device__ __forceinline__ void store_f32(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_f32(bf16* p, float v) { p->bits = fp32_to_bf16(v); }
__device__ __forceinline__ void store_f32(fp16* p, float v) { p->bits = fp32_to_fp16(v); }

// Element i of x as fp32, and the value stored into y[i] (rounded to y's type).
template <class T>
__device__ __forceinline__ float ld(const T* x, int64_t i) {
  return to_f32(x[i]);
}
template <class T>
__device__ __forceinline__ void st(T* y, int64_t i, float v) {
  store_f32(y + i, v);
}

// A weight gradient in the gradient buffer: fp32, or bf16 (parallel.grad_reduce_in_bf16). A call reads
// the stored value as fp32, adds its contribution in fp32 and stores the sum rounded once -- the CPU
// backend's rule. Null p: no gradient.
struct GradPtr {
  void* p = nullptr;
  bool bf16 = false;
  __device__ __forceinline__ float load(int64_t i) const {
    return bf16 ? bf16_to_fp32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
  }
  __device__ __forceinline__ void store(int64_t i, float v) const {
    if (bf16) static_cast<uint16_t*>(p)[i] = fp32_to_bf16(v);
    else static_cast<float*>(p)[i] = v;
  }
  __device__ __forceinline__ void add(int64_t i, float v) const { store(i, load(i) + v); }
};
inline GradPtr grad_ptr(CBuf g) {
  if (g && g.t != DType::F32 && g.t != DType::BF16)
    internal_error("CUDA backend: a weight gradient of dtype " + std::to_string(int(g.t)) + " (fp32 or bf16 only)");
  return {const_cast<void*>(g.p), g.t == DType::BF16};
}

// W consecutive elements in one load / store of W * sizeof(T) bytes (2, 4, 8 or 16): p must be
// aligned to that many bytes. W = 1 is a plain scalar access.
template <int Bytes>
struct RawBytes;
template <>
struct RawBytes<16> {
  using type = uint4;
};
template <>
struct RawBytes<8> {
  using type = uint2;
};
template <>
struct RawBytes<4> {
  using type = unsigned int;
};
template <>
struct RawBytes<2> {
  using type = unsigned short;
};

template <int W, class T>
__device__ __forceinline__ void load_vec(float (&v)[W], const T* p) {
  if constexpr (W == 1) {
    v[0] = to_f32(*p);
  } else {
    using R = typename RawBytes<W * int(sizeof(T))>::type;
    const R r = *reinterpret_cast<const R*>(p);
    T e[W];
    __builtin_memcpy(e, &r, sizeof(r));
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = to_f32(e[k]);
  }
}

template <int W, class T>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[W]) {
  if constexpr (W == 1) {
    store_f32(p, v[0]);
  } else {
    using R = typename RawBytes<W * int(sizeof(T))>::type;
    T e[W];
#pragma unroll
    for (int k = 0; k < W; ++k) store_f32(e + k, v[k]);
    R r;
    __builtin_memcpy(&r, e, sizeof(r));
    *reinterpret_cast<R*>(p) = r;
  }
}

// Elements per 16-byte vector of the widest of the types.
template <class... Ts>
constexpr int vec_width() {
  size_t m = 1;
  ((m = sizeof(Ts) > m ? sizeof(Ts) : m), ...);
  return int(16 / m);
}

// Whether p is aligned to `bytes` (host side: may a kernel use vector accesses on it).
inline bool is_aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Calls f(T{}) with T the storage type of t (host side: picks the kernel instantiation).
template <class F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(bf16{}); return;
    case DType::F16: f(fp16{}); return;
    case DType::F64:
    case DType::I32:
    case DType::I64:
    case DType::U8: break;  // the communicators' further types, no storage type of a kernel
  }
  internal_error("a kernel on a buffer of neither f32, bf16 nor f16");
}

// ---------------------------------------------------------------- element-wise launcher
// f.apply<W>(i) handles elements [i, i + W). With vec, the kernel calls it for i = 0, W, 2W, ...
// below n / W * W and apply<1> on the rest; without, apply<1> everywhere. The caller decides vec
// from the pointers' alignment (W elements of each) and any periods of broadcast operands.
template <int W, class F>
__global__ void elementwise_kernel(int64_t n, F f) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t nv = n / W;
  for (int64_t j = tid; j < nv; j += stride) f.template apply<W>(j * W);
  if constexpr (W > 1)
    for (int64_t i = nv * W + tid; i < n; i += stride) f.template apply<1>(i);
}

template <int W, class F>
void launch_elementwise(int64_t n, bool vec, const F& f, cudaStream_t s) {
  if (n <= 0) return;
  if (vec && W > 1)
    elementwise_kernel<W, F><<<blocks_for((n + W - 1) / W), kThreads, 0, s>>>(n, f);
  else
    elementwise_kernel<1, F><<<blocks_for(n), kThreads, 0, s>>>(n, f);
  TPT_CUDA_LAUNCHED();
}

}  // namespace tpt::cuda
