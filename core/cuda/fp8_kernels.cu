// FP8 kernels (docs/FP8.md): the fused quantize + amax of Ops::fp8_quantize, each value converted as
// core/fp8.h's rule (on sm_89+ by the conversion instruction, fp8_pair), so its codes are the CPU
// emulation's bit for bit; the amax as the maximum of |x|'s bit patterns: a block reduction, then one
// atomicMax per block (order-free: deterministic), over a grid of the resident blocks.
// The cast + transpose (both layouts of a GEMM input in one pass, tiles through shared memory).
// Blockwise quantization (core/fp8.h fp8_block_scale; its codes along rows, or transposed): 1 x 128
// blocks a half warp each, 128 x 1 blocks written transposed from a warp's 128 x 32 tile in
// registers, other blocks one thread block each; and what the cuBLASLt FP8 GEMMs need around them
// (core/cuda/fp8_gemm.cu): transposed codes, block scales in cuBLASLt's layouts, and the fallback's
// decoding to fp32.
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"
#include "core/cuda/launch_util.h"
#include "core/fp8.h"

namespace tpt::cuda {
namespace {

struct MaxBits {
  __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return a > b ? a : b; }
};

// Two fp32 values to FP8 codes (a in the low byte): on compute capability 8.9+ one conversion
// instruction for both (cvt.rn.satfinite: round to nearest even, saturation to +-max, infinities
// too -- core/fp8.h's rule, which the unit test Fp8.HardwareConversionIsTheScalarRule checks on
// cuda_fp8.h's model of the instruction), a NaN's code then set as the rule's (sign | 0x7F: the
// instruction's NaN is positive). Elsewhere core/fp8.h's integer conversion (some 20 integer
// operations a value; the casts reached 1.6 TB/s on an H200 with it, 2026-12-04).
__device__ __forceinline__ uint16_t fp8_pair(float a, float b, Fp8Type t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t c = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, t == Fp8Type::E4M3 ? __NV_E4M3 : __NV_E5M2);
  if (a != a) c = (c & 0xFF00u) | (float_to_bits(a) >> 24 & 0x80u) | 0x7Fu;  // core/fp8.h's NaN: sign | 0x7F
  if (b != b) c = (c & 0x00FFu) | ((float_to_bits(b) >> 24 & 0x80u) | 0x7Fu) << 8;
  return uint16_t(c);
#else
  return uint16_t(fp32_to_fp8(a, t) | fp32_to_fp8(b, t) << 8);
#endif
}
__device__ __forceinline__ uint8_t fp8_one(float a, Fp8Type t) { return uint8_t(fp8_pair(a, 0.0f, t)); }

// 8 values of T in one 16-byte (fp32: two) load, and their 8 codes as one 8-byte store
template <class T>
struct alignas(16) Eight {
  T x[8];
};
union Codes8 {
  uint8_t c[8];
  uint16_t h[4];
  uint2 u;
};

// Resident thread blocks of kThreads on the device: the grid of the casts with one atomicMax per
// block, so that a tensor costs a few thousand atomics at most, not one per 2048 values.
unsigned resident_blocks() {
  static std::atomic<int> sms[64];  // per device (thread ranks share one)
  int dev = 0;
  TPT_CUDA_CHECK(cudaGetDevice(&dev));
  int n = sms[dev & 63].load(std::memory_order_relaxed);
  if (!n) {
    TPT_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    sms[dev & 63].store(n, std::memory_order_relaxed);
  }
  return unsigned(n) * (2048 / kThreads);
}

// kCodes false: the amax alone (Ops::fp8_quantize with out null: current scaling's first pass)
template <class T, bool kCodes>
__global__ void fp8_quantize_kernel(uint8_t* out, const T* in, int64_t n, Fp8Type t, const float* scale,
                                    float* amax) {
  const float s = kCodes ? *scale : 1.0f;
  uint32_t m = 0;
  TPT_GRID_LOOP(i, n) {
    const float x = ld(in, i);
    if constexpr (kCodes) out[i] = fp8_one(x * s, t);
    m = m > fp8_abs_bits(x) ? m : fp8_abs_bits(x);
  }
  m = block_reduce(m, MaxBits{}, 0u);
  if (threadIdx.x == 0 && m) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
}

// The same, 8 elements a thread per load (one 16-byte load per 8 16-bit values, two for fp32; one
// 8-byte store of their codes; the byte-per-thread kernel above reached 400 GB/s on an H200), kLoads
// loads of a thread issued before their values are used, over a grid of the resident blocks
constexpr int kLoads = 4;
template <class T, bool kCodes>
__global__ void __launch_bounds__(kThreads) fp8_quantize8_kernel(uint8_t* __restrict__ out,
                                                                 const T* __restrict__ in, int64_t n8, Fp8Type t,
                                                                 const float* scale, float* amax) {
  const Eight<T>* in8 = reinterpret_cast<const Eight<T>*>(in);
  const float s = kCodes ? *scale : 1.0f;
  uint32_t m = 0;
  const int64_t step = int64_t(gridDim.x) * blockDim.x * kLoads;
  for (int64_t v0 = int64_t(blockIdx.x) * blockDim.x * kLoads + threadIdx.x; v0 < n8; v0 += step) {
    Eight<T> e[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      if (v0 + u * blockDim.x < n8) e[u] = in8[v0 + u * blockDim.x];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int64_t v = v0 + u * blockDim.x;
      if (v >= n8) break;
      float x[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        x[k] = to_f32(e[u].x[k]);
        m = m > fp8_abs_bits(x[k]) ? m : fp8_abs_bits(x[k]);
      }
      if constexpr (kCodes) {
        Codes8 o;
#pragma unroll
        for (int k = 0; k < 4; ++k) o.h[k] = fp8_pair(x[2 * k] * s, x[2 * k + 1] * s, t);
        reinterpret_cast<uint2*>(out)[v] = o.u;
      }
    }
  }
  m = block_reduce(m, MaxBits{}, 0u);
  if (threadIdx.x == 0 && m) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
}

// Ops::fp8_cast_transpose, 8 elements a thread (rows and cols multiples of 8, the pointers aligned): a
// 64 x 64 tile a thread block, read with 16-byte loads and its codes stored (8 bytes a thread) along
// out's rows and, through shared memory, along out_t's
constexpr int kCt8 = 64;
template <class T>
__global__ void __launch_bounds__(kThreads) fp8_cast_transpose8_kernel(uint8_t* out, uint8_t* out_t, const T* in,
                                                                       int64_t rows, int64_t cols, int64_t tiles_c,
                                                                       Fp8Type t, const float* scale, float* amax) {
  __shared__ alignas(8) uint8_t tile[kCt8][kCt8 + 8];
  const int64_t r0 = int64_t(blockIdx.x / tiles_c) * kCt8, c0 = int64_t(blockIdx.x % tiles_c) * kCt8;
  const float s = *scale;
  uint32_t m = 0;
  for (int k = threadIdx.x; k < kCt8 * kCt8 / 8; k += blockDim.x) {
    const int r = k / (kCt8 / 8), v = k % (kCt8 / 8);
    const int64_t gr = r0 + r, gc = c0 + 8 * v;
    if (gr >= rows || gc >= cols) continue;
    const Eight<T> e = *reinterpret_cast<const Eight<T>*>(in + gr * cols + gc);
    Codes8 o;
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      const float x0 = to_f32(e.x[j]), x1 = to_f32(e.x[j + 1]);
      o.h[j / 2] = fp8_pair(x0 * s, x1 * s, t);
      m = m > fp8_abs_bits(x0) ? m : fp8_abs_bits(x0);
      m = m > fp8_abs_bits(x1) ? m : fp8_abs_bits(x1);
    }
    if (out) *reinterpret_cast<uint2*>(out + gr * cols + gc) = o.u;
    *reinterpret_cast<uint2*>(&tile[r][8 * v]) = o.u;
  }
  m = block_reduce(m, MaxBits{}, 0u);  // (synchronises the block: the tile is whole)
  if (threadIdx.x == 0 && m && amax) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
  for (int k = threadIdx.x; k < kCt8 * kCt8 / 8; k += blockDim.x) {
    const int c = k / (kCt8 / 8), v = k % (kCt8 / 8);
    const int64_t gc = c0 + c, gr = r0 + 8 * v;
    if (gc >= cols || gr >= rows) continue;
    Codes8 o;
#pragma unroll
    for (int j = 0; j < 8; ++j) o.c[j] = tile[8 * v + j][c];
    *reinterpret_cast<uint2*>(out_t + gc * rows + gr) = o.u;
  }
}

// The same for any shape: a 32 x 32 tile a thread block, an element a thread per row of 32
template <class T>
__global__ void __launch_bounds__(kThreads) fp8_cast_transpose_kernel(uint8_t* out, uint8_t* out_t, const T* in,
                                                                      int64_t rows, int64_t cols, int64_t tiles_c,
                                                                      Fp8Type t, const float* scale, float* amax) {
  __shared__ uint8_t tile[32][33];
  const int64_t r0 = int64_t(blockIdx.x / tiles_c) * 32, c0 = int64_t(blockIdx.x % tiles_c) * 32;
  const int lane = threadIdx.x % 32, step = blockDim.x / 32;
  const float s = *scale;
  uint32_t m = 0;
  for (int k = threadIdx.x / 32; k < 32; k += step) {
    const int64_t r = r0 + k, c = c0 + lane;
    if (r >= rows || c >= cols) continue;
    const float x = ld(in, r * cols + c);
    const uint8_t q = fp8_one(x * s, t);
    if (out) out[r * cols + c] = q;
    tile[k][lane] = q;
    m = m > fp8_abs_bits(x) ? m : fp8_abs_bits(x);
  }
  m = block_reduce(m, MaxBits{}, 0u);
  if (threadIdx.x == 0 && m && amax) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
  for (int k = threadIdx.x / 32; k < 32; k += step) {
    const int64_t c = c0 + k, r = r0 + lane;  // out_t (cols, rows): row c, column r
    if (c < cols && r < rows) out_t[c * rows + r] = tile[lane][k];
  }
}

template <class T>
__global__ void fp8_quantize_blocks_kernel(uint8_t* out, const T* in, int64_t rows, int64_t cols, int64_t br,
                                           int64_t bc, int64_t gc, Fp8Type t, int margin, float* scale_inv,
                                           bool transposed) {
  const int64_t b = blockIdx.x, r0 = b / gc * br, c0 = b % gc * bc;
  const int64_t h = min(br, rows - r0), w = min(bc, cols - c0), n = h * w;
  uint32_t m = 0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const uint32_t a = fp8_abs_bits(ld(in, (r0 + k / w) * cols + c0 + k % w));
    m = m > a ? m : a;
  }
  const float s = fp8_block_scale(bits_to_float(block_reduce(m, MaxBits{}, 0u)), t, margin);
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const int64_t r = r0 + k / w, c = c0 + k % w;
    out[transposed ? c * rows + r : r * cols + c] = fp8_one(ld(in, r * cols + c) * s, t);
  }
  if (threadIdx.x == 0) scale_inv[b] = 1.0f / s;
}

// 1 x 128 blocks of whole rows (cols % 128 == 0, aligned: the blockwise recipe's activations and
// output gradients): a half warp a block, 8 values a lane in one load, the block's amax by shuffles
// within the half warp, its codes in one 8-byte store a lane
template <class T>
__global__ void __launch_bounds__(kThreads) fp8_quantize_row_blocks_kernel(uint8_t* __restrict__ out,
                                                                           const T* __restrict__ in, int64_t blocks,
                                                                           Fp8Type t, int margin,
                                                                           float* __restrict__ scale_inv) {
  const Eight<T>* in8 = reinterpret_cast<const Eight<T>*>(in);
  const int half = threadIdx.x / 16 % 2, lane = threadIdx.x % 16;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  // a pair of blocks a warp (the loop's bound is the warp's: every lane takes part in the shuffles)
  for (int64_t p = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; 2 * p < blocks; p += warps) {
    const int64_t b = 2 * p + half, v = b * 16 + lane;
    const bool live = b < blocks;
    float x[8] = {};
    uint32_t m = 0;
    if (live) {
      const Eight<T> e = in8[v];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        x[k] = to_f32(e.x[k]);
        m = m > fp8_abs_bits(x[k]) ? m : fp8_abs_bits(x[k]);
      }
    }
#pragma unroll
    for (int o = 8; o > 0; o /= 2) {
      const uint32_t y = __shfl_xor_sync(0xffffffffu, m, o);
      m = m > y ? m : y;
    }
    if (!live) continue;
    const float s = fp8_block_scale(bits_to_float(m), t, margin);
    Codes8 c;
#pragma unroll
    for (int k = 0; k < 4; ++k) c.h[k] = fp8_pair(x[2 * k] * s, x[2 * k + 1] * s, t);
    reinterpret_cast<uint2*>(out)[v] = c.u;
    if (lane == 0) scale_inv[b] = 1.0f / s;
  }
}

// 128 x 1 blocks written transposed (the blockwise recipe's weight-gradient operands; bf16 values,
// rows % 128 == 0, cols % 32 == 0, aligned): a warp a tile of 128 rows x 32 columns, a lane 16 rows of
// 8 columns held in registers (its 16 16-byte loads issued together), a column's amax over the 8 lanes
// of its rows by shuffles, then each column's 16 codes as one 16-byte store along out's rows
template <class T>
__global__ void __launch_bounds__(kThreads) fp8_quantize_col_blocks_t_kernel(uint8_t* __restrict__ out,
                                                                             const T* __restrict__ in, int64_t rows,
                                                                             int64_t cols, Fp8Type t, int margin,
                                                                             float* __restrict__ scale_inv) {
  const int u = threadIdx.x % 4, g = threadIdx.x / 4 % 8;
  const int64_t tiles_c = cols / 32, tiles = rows / 128 * tiles_c, warps = int64_t(gridDim.x) * blockDim.x / 32;
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < tiles; w += warps) {
    const int64_t r0 = w / tiles_c * 128, c = w % tiles_c * 32 + 8 * u, rb = r0 + 16 * g;  // rows rb.., columns c..c+7
    Eight<T> e[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) e[r] = *reinterpret_cast<const Eight<T>*>(in + (rb + r) * cols + c);
    uint32_t m[8] = {};
#pragma unroll
    for (int r = 0; r < 16; ++r)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t a = fp8_abs_bits(to_f32(e[r].x[j]));
        m[j] = m[j] > a ? m[j] : a;
      }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int o = 4; o < 32; o *= 2) {
        const uint32_t y = __shfl_xor_sync(0xffffffffu, m[j], o);
        m[j] = m[j] > y ? m[j] : y;
      }
      const float s = fp8_block_scale(bits_to_float(m[j]), t, margin);
      if (g == 0) scale_inv[r0 / 128 * cols + c + j] = 1.0f / s;  // block (r0 / 128, c + j)
      union {
        uint16_t p[8];
        uint4 v;
      } q;
#pragma unroll
      for (int k = 0; k < 8; ++k) q.p[k] = fp8_pair(to_f32(e[2 * k].x[j]) * s, to_f32(e[2 * k + 1].x[j]) * s, t);
      *reinterpret_cast<uint4*>(out + (c + j) * rows + rb) = q.v;
    }
  }
}

// 32 x 32 tiles through shared memory: reads and writes both along rows
__global__ void fp8_transpose_kernel(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[32][33];
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const int64_t c = c0 + k, r = r0 + threadIdx.x;  // out (cols, rows): row c, column r
    if (c < cols && r < rows) out[c * rows + r] = tile[threadIdx.x][k];
  }
}

__global__ void fp8_relayout_scales_kernel(float* out, const float* in, int64_t ni, int64_t nj, int64_t si, int64_t sj,
                                           int64_t ld) {
  TPT_GRID_LOOP(k, nj * ld) {
    const int64_t j = k / ld, i = k % ld;
    out[k] = i < ni ? in[i * si + j * sj] : 0.0f;
  }
}

__global__ void fp8_dequantize_kernel(float* out, Fp8Operand x, int64_t n, bool transposed) {
  const int64_t gc = x.block_rows > 0 ? (x.cols + x.block_cols - 1) / x.block_cols : 0;
  const int64_t rows = x.block_rows > 0 ? n / x.cols : 0;
  const uint8_t* codes = transposed ? x.t_codes : x.codes;
  TPT_GRID_LOOP(i, n) {
    float s = *x.scale_inv;
    if (x.block_rows > 0) {  // element (r, c): at i of the codes (rows, cols) or of their transpose
      const int64_t r = transposed ? i % rows : i / x.cols, c = transposed ? i / rows : i % x.cols;
      s = x.scale_inv[r / x.block_rows * gc + c / x.block_cols];
    }
    out[i] = fp8_to_fp32(codes[i], x.t) * s;
  }
}

template <class T>
__global__ void bias_store_kernel(T* out, const float* acc, const T* bias, int64_t N, int64_t C) {
  TPT_GRID_LOOP(i, N * C) st(out, i, bias ? acc[i] + ld(bias, i % C) : acc[i]);
}

// Blockwise FP8 parameters' parts (Ops::fp8_block_amax, fp8_quantize_given_blocks): element i of in is
// element at + i of a (., cols) matrix in (br, bc) blocks, gc of them a row. The amax one atomicMax on the
// bits per nonzero element (a step's cast of the rank's blocks of the weights, not a GEMM input's).
template <class T>
__global__ void fp8_block_amax_kernel(float* amax, const T* in, int64_t at, int64_t n, int64_t cols, int64_t br,
                                      int64_t bc, int64_t gc) {
  TPT_GRID_LOOP(i, n) {
    const int64_t e = at + i;
    const uint32_t m = fp8_abs_bits(ld(in, i));
    if (m) atomicMax(reinterpret_cast<unsigned int*>(amax + e / cols / br * gc + e % cols / bc), m);
  }
}
template <class T>
__global__ void fp8_quantize_given_blocks_kernel(uint8_t* out, const T* in, int64_t at, int64_t n, int64_t cols,
                                                 int64_t br, int64_t bc, int64_t gc, Fp8Type t, const float* scale_inv) {
  TPT_GRID_LOOP(i, n) {
    const int64_t e = at + i;
    out[i] = fp8_one(ld(in, i) * (1.0f / scale_inv[e / cols / br * gc + e % cols / bc]), t);
  }
}

}  // namespace

void fp8_block_amax(float* amax, CBuf in, int64_t at, int64_t n, int64_t cols, int64_t br, int64_t bc, cudaStream_t s) {
  TPT_CHECK(br > 0 && bc > 0 && cols > 0 && at >= 0);
  if (n <= 0) return;
  dispatch(in.t, [&](auto tag) {
    using T = decltype(tag);
    fp8_block_amax_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(amax, typed<T>(in), at, n, cols, br, bc, (cols + bc - 1) / bc);
    TPT_CUDA_LAUNCHED();
  });
}

void fp8_quantize_given_blocks(uint8_t* out, CBuf in, int64_t at, int64_t n, int64_t cols, int64_t br, int64_t bc,
                               Fp8Type t, const float* scale_inv, cudaStream_t s) {
  TPT_CHECK(br > 0 && bc > 0 && cols > 0 && at >= 0);
  if (n <= 0) return;
  dispatch(in.t, [&](auto tag) {
    using T = decltype(tag);
    fp8_quantize_given_blocks_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(out, typed<T>(in), at, n, cols, br, bc,
                                                                         (cols + bc - 1) / bc, t, scale_inv);
    TPT_CUDA_LAUNCHED();
  });
}

void fp8_quantize_blocks(uint8_t* out, CBuf in, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Type t,
                         int margin, float* scale_inv, bool transposed, cudaStream_t s) {
  TPT_CHECK(br > 0 && bc > 0);
  if (rows <= 0 || cols <= 0) return;
  const int64_t gc = (cols + bc - 1) / bc, blocks = (rows + br - 1) / br * gc;
  TPT_CHECK(blocks < (int64_t(1) << 31));
  const int threads = br * bc >= 1024 ? 512 : 128;
  const auto a = reinterpret_cast<uintptr_t>(in.p), o = reinterpret_cast<uintptr_t>(out);
  dispatch(in.t, [&](auto tag) {
    using T = decltype(tag);
    if (br == 1 && bc == 128 && !transposed && cols % 128 == 0 && a % 16 == 0 && o % 8 == 0)
      fp8_quantize_row_blocks_kernel<T><<<blocks_for((blocks + 1) / 2 * 32), kThreads, 0, s>>>(
          out, typed<T>(in), blocks, t, margin, scale_inv);
    else if constexpr (std::is_same_v<T, bf16>) {  // (FP8 training is bf16; fp16's software conversion spills)
      if (br == 128 && bc == 1 && transposed && rows % 128 == 0 && cols % 32 == 0 && a % 16 == 0 && o % 16 == 0)
        fp8_quantize_col_blocks_t_kernel<T><<<blocks_for(rows / 128 * (cols / 32) * 32), kThreads, 0, s>>>(
            out, typed<T>(in), rows, cols, t, margin, scale_inv);
      else
        fp8_quantize_blocks_kernel<T><<<unsigned(blocks), threads, 0, s>>>(out, typed<T>(in), rows, cols, br, bc, gc,
                                                                           t, margin, scale_inv, transposed);
    } else {
      fp8_quantize_blocks_kernel<T><<<unsigned(blocks), threads, 0, s>>>(out, typed<T>(in), rows, cols, br, bc, gc, t,
                                                                         margin, scale_inv, transposed);
    }
    TPT_CUDA_LAUNCHED();
  });
}

void fp8_transpose(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  TPT_CHECK((rows + 31) / 32 < 65536);
  const dim3 grid(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32)), block(32, 8);
  fp8_transpose_kernel<<<grid, block, 0, s>>>(out, in, rows, cols);
  TPT_CUDA_LAUNCHED();
}

void fp8_relayout_scales(float* out, const float* in, int64_t ni, int64_t nj, int64_t si, int64_t sj, int64_t ld,
                         cudaStream_t s) {
  if (nj <= 0 || ld <= 0) return;
  fp8_relayout_scales_kernel<<<blocks_for(nj * ld), kThreads, 0, s>>>(out, in, ni, nj, si, sj, ld);
  TPT_CUDA_LAUNCHED();
}

void fp8_dequantize(float* out, const Fp8Operand& x, int64_t n, bool transposed, cudaStream_t s) {
  TPT_CHECK((transposed ? x.t_codes : x.codes) && x.scale_inv &&
            (x.block_rows == 0 || (x.cols > 0 && x.block_cols > 0)));
  if (n <= 0) return;
  fp8_dequantize_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, x, n, transposed);
  TPT_CUDA_LAUNCHED();
}

void bias_store(Buf out, const float* acc, CBuf bias, int64_t N, int64_t C, cudaStream_t s) {
  if (bias) check_same(out.t, bias.t, "bias_store");
  if (N <= 0 || C <= 0) return;
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    bias_store_kernel<T><<<blocks_for(N * C), kThreads, 0, s>>>(typed<T>(out), acc, typed<T>(bias), N, C);
    TPT_CUDA_LAUNCHED();
  });
}

// Ops::fp8_current_scales: one thread per tensor, the formats passed by value.
struct Fp8Types {
  Fp8Type t[Ops::kFp8MaxScales];
};
__global__ void fp8_current_scales_kernel(float* scale, float* scale_inv, const float* amax, Fp8Types t, int n,
                                          int margin) {
  const int i = threadIdx.x;
  if (i >= n) return;
  scale[i] = fp8_scale_from_amax(amax[i], 1.0f, t.t[i], margin);
  scale_inv[i] = 1.0f / scale[i];
}

void fp8_current_scales(float* scale, float* scale_inv, const float* amax, const Fp8Type* t, int n, int margin,
                        cudaStream_t s) {
  TPT_CHECK(n >= 0 && n <= Ops::kFp8MaxScales);
  if (n == 0) return;
  Fp8Types types{};
  for (int i = 0; i < n; ++i) types.t[i] = t[i];
  fp8_current_scales_kernel<<<1, Ops::kFp8MaxScales, 0, s>>>(scale, scale_inv, amax, types, n, margin);
  TPT_CUDA_LAUNCHED();
}

void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, CBuf in, int64_t rows, int64_t cols, Fp8Type t,
                        const float* scale, float* amax, cudaStream_t s) {
  if (!out_t) return fp8_quantize(out, in, rows * cols, t, scale, amax, s);
  if (rows <= 0 || cols <= 0) return;
  dispatch(in.t, [&](auto tag) {
    using T = decltype(tag);
    const auto a = reinterpret_cast<uintptr_t>(in.p), b = reinterpret_cast<uintptr_t>(out),
               c = reinterpret_cast<uintptr_t>(out_t);
    const bool wide = rows % 8 == 0 && cols % 8 == 0 && a % 16 == 0 && b % 8 == 0 && c % 8 == 0;
    const int64_t tile = wide ? kCt8 : 32, tiles_c = (cols + tile - 1) / tile,
                  blocks = (rows + tile - 1) / tile * tiles_c;
    TPT_CHECK(blocks < (int64_t(1) << 31));
    if (wide)
      fp8_cast_transpose8_kernel<T><<<unsigned(blocks), kThreads, 0, s>>>(out, out_t, typed<T>(in), rows, cols, tiles_c,
                                                                          t, scale, amax);
    else
      fp8_cast_transpose_kernel<T><<<unsigned(blocks), kThreads, 0, s>>>(out, out_t, typed<T>(in), rows, cols, tiles_c,
                                                                         t, scale, amax);
    TPT_CUDA_LAUNCHED();
  });
}

void fp8_quantize(uint8_t* out, CBuf in, int64_t n, Fp8Type t, const float* scale, float* amax, cudaStream_t s) {
  if (n <= 0) return;
  dispatch(in.t, [&](auto tag) {
    using T = decltype(tag);
    const auto a = reinterpret_cast<uintptr_t>(in.p), b = reinterpret_cast<uintptr_t>(out);
    const bool wide = n % 8 == 0 && a % 16 == 0 && b % 8 == 0;
    const unsigned grid = wide ? std::min(blocks_for((n / 8 + kLoads - 1) / kLoads), resident_blocks()) : 0u;
    if (wide && out)
      fp8_quantize8_kernel<T, true><<<grid, kThreads, 0, s>>>(out, typed<T>(in), n / 8, t, scale, amax);
    else if (wide)  // the amax alone: a third less traffic than with the codes
      fp8_quantize8_kernel<T, false><<<grid, kThreads, 0, s>>>(out, typed<T>(in), n / 8, t, scale, amax);
    else if (out)
      fp8_quantize_kernel<T, true><<<blocks_for(n), kThreads, 0, s>>>(out, typed<T>(in), n, t, scale, amax);
    else
      fp8_quantize_kernel<T, false><<<blocks_for(n), kThreads, 0, s>>>(out, typed<T>(in), n, t, scale, amax);
    TPT_CUDA_LAUNCHED();
  });
}

}  // namespace tpt::cuda
