// Flash-style causal attention on the tensor cores (WMMA, 16 x 16 x 16 tiles, fp32 accumulation),
// for bf16 / fp16 runs with head dimension 32, 64 or 128. The algorithm of attention.cu's fp32
// kernels -- online softmax over key tiles, a log-sum-exp per query row, probabilities rebuilt in
// backward, dQ and dK/dV in separate kernels (no atomics) -- with the products on 16-bit operands:
// q, k, v and dout are read as stored (bf16 / fp16 tensors, 16-byte loads straight into the shared
// tiles); the probabilities and their gradient are rounded to the 16-bit type before their
// products, as FlashAttention does. Scores, softmax and accumulators stay fp32; out and dqkv are
// rounded once as they are stored.
//
// A block owns 64 rows (queries in forward and dQ, keys in dK/dV), 16 per warp; every product is
// warp-local, so the only block-wide synchronisation is around staging the shared tiles.
// Grouped-query attention (qkv (B, T, (H + 2 KV) D), query head h on key / value head h / (H / KV)):
// the heads are strided views of qkv, and a dK/dV block walks the query heads of its key / value
// head's group one after another, accumulating in the same fragments (a fixed order, no atomics).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"

namespace tpt::cuda {
namespace {

using namespace nvcuda;

constexpr int kRows = 64;  // rows a block owns
constexpr int kTile = 64;  // rows of the other operand per step
static_assert(kTile == kRows, "dK/dV start their query tiles at the block's first key");
static_assert(kTile == 64 && kRows / (kRows / 16) == 16, "two columns per lane, 16 rows per warp");
constexpr int kWarps = kRows / 16;
constexpr int kBlock = kWarps * 32;
constexpr int kPad16 = 8;  // 16-bit rows padded by 8 elements (ldm stays a multiple of 8; banks spread)
constexpr int kPad32 = 4;  // fp32 rows by 4
constexpr int LS = kTile + kPad32;  // fp32 (16, kTile) score tiles
constexpr int LP = kTile + kPad16;  // 16-bit (16, kTile) probability tiles

// The raw bits of each tensor's elements (bf16 or fp16, as T says).
using Bits = uint16_t;

template <class T>
__device__ inline T to_16(float x);
template <>
__device__ inline __nv_bfloat16 to_16<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ inline __half to_16<__half>(float x) {
  return __float2half_rn(x);
}

// fp32 -> the bits of T stored in a tensor (core/dtype.h's nearest-even rounding, as every store)
template <class T>
__device__ inline Bits store_bits(float x);
template <>
__device__ inline Bits store_bits<__nv_bfloat16>(float x) {
  return fp32_to_bf16(x);
}
template <>
__device__ inline Bits store_bits<__half>(float x) {
  return fp32_to_fp16(x);
}

// Bump allocation of the dynamic shared memory, 128-byte aligned pieces (WMMA needs 32).
struct Carve {
  size_t bytes = 0;
  template <class U>
  __host__ __device__ size_t take(size_t n) {
    const size_t at = bytes;
    bytes += (n * sizeof(U) + 127) / 128 * 128;
    return at;
  }
};

template <class T, int D>
struct Layout {  // offsets (bytes) of the shared-memory pieces of each kernel
  static constexpr int LD = D + kPad16;  // 16-bit (rows, D) tiles
  static constexpr int LO = D + kPad32;  // fp32 (16, D) output staging
  // forward: q (own rows), k, v (tile), per warp scores (16, kTile) fp32, probabilities (16, kTile),
  // output accumulator (16, D) fp32, row max / sum / correction
  struct Fwd {
    size_t q, k, v, s, p, o, stats, total;
    __host__ __device__ Fwd() {
      Carve c;
      q = c.take<T>(kRows * LD), k = c.take<T>(kTile * LD), v = c.take<T>(kTile * LD);
      s = c.take<float>(kWarps * 16 * LS), p = c.take<T>(kWarps * 16 * LP), o = c.take<float>(kWarps * 16 * LO);
      stats = c.take<float>(3 * kRows);
      total = c.bytes;
    }
  };
  // backward (dQ and dK/dV): the block's own rows a, b (q, dout or k, v), the tile's c, d, per warp
  // two fp32 (16, kTile) tiles (also the output staging: 2 * LS >= LO), two 16-bit ones, and the
  // tile's lse and delta
  struct Bwd {
    size_t a, b, c, d, f, h, stats, total;
    __host__ __device__ Bwd() {
      Carve cv;
      a = cv.take<T>(kRows * LD), b = cv.take<T>(kRows * LD), c = cv.take<T>(kTile * LD), d = cv.take<T>(kTile * LD);
      f = cv.take<float>(kWarps * 2 * 16 * LS), h = cv.take<T>(kWarps * 2 * 16 * LP);
      stats = cv.take<float>(2 * kTile);
      total = cv.bytes;
    }
  };
  static_assert(2 * LS >= LO, "output staging fits in the two fp32 tiles");
};

// rows [r0, r0 + n) of one head of a strided 16-bit tensor -> smem (n, LD), 8 elements (16 bytes)
// at a time, as stored; zeros past T. src row r starts at base + r * stride (+ the head's column
// offset, already in base); base and stride keep every row 16-byte aligned (tc_attention_aligned, D
// a multiple of 8), and so do the smem rows (LD * 2 bytes a multiple of 16, pieces 128-aligned).
template <class T, int D>
__device__ inline void stage(T* dst, const Bits* base, int64_t stride, int64_t r0, int n, int64_t T_) {
  static_assert(D % 8 == 0 && (D + kPad16) % 8 == 0, "16-byte rows");
  constexpr int LD = D + kPad16;
  for (int i = threadIdx.x; i < n * D / 8; i += blockDim.x) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (r0 + r < T_) x = *reinterpret_cast<const uint4*>(base + (r0 + r) * stride + c);
    *reinterpret_cast<uint4*>(dst + r * LD + c) = x;
  }
}

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <class T>
using RowA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T>
using RowB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <class T>
using ColB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;

// out (16, kTile) fp32 = a (16, D) @ b^T, b (kTile, D): both row-major 16-bit with ldm LD.
template <class T, int D>
__device__ inline void product_abt(float* out, const T* a, const T* b) {
  constexpr int LD = D + kPad16;
  for (int j = 0; j < kTile / 16; ++j) {
    Acc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < D / 16; ++kk) {
      RowA<T> fa;
      ColB<T> fb;  // b^T: element (k, n) = b[n][k], column-major with ldm LD
      wmma::load_matrix_sync(fa, a + kk * 16, LD);
      wmma::load_matrix_sync(fb, b + j * 16 * LD + kk * 16, LD);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + j * 16, acc, LS, wmma::mem_row_major);
  }
}

// acc[j] (16, 16 columns j of D) += p (16, kTile) @ m (kTile, D): p row-major LP, m row-major LD.
template <class T, int D>
__device__ inline void accumulate_pm(Acc (&acc)[D / 16], const T* p, const T* m) {
  constexpr int LD = D + kPad16;
  for (int j = 0; j < D / 16; ++j)
    for (int kk = 0; kk < kTile / 16; ++kk) {
      RowA<T> fa;
      RowB<T> fb;
      wmma::load_matrix_sync(fa, p + kk * 16, LP);
      wmma::load_matrix_sync(fb, m + kk * 16 * LD + j * 16, LD);
      wmma::mma_sync(acc[j], fa, fb, acc[j]);
    }
}

// Writes acc (16, D) through the warp's fp32 staging (16, LO) to rows r0.. of a strided 16-bit
// tensor, rounded (rows at or past T skipped).
template <class T, int D>
__device__ inline void write_rows(Bits* dst, int64_t stride, int64_t r0, int64_t T_, Acc (&acc)[D / 16],
                                  float* staging) {
  constexpr int LO = D + kPad32;
  for (int j = 0; j < D / 16; ++j) wmma::store_matrix_sync(staging + j * 16, acc[j], LO, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < 16 * D; i += 32) {
    const int r = i / D, c = i % D;
    if (r0 + r < T_) dst[(r0 + r) * stride + c] = store_bits<T>(staging[r * LO + c]);
  }
  __syncwarp();
}

// grid (B * H, ceil(T / kRows)); the longest query rows first
template <class T, int D>
__global__ void __launch_bounds__(kBlock) tc_forward_kernel(Bits* out, float* lse, const Bits* qkv, int64_t T_,
                                                            int64_t H, int64_t KV, float scale) {
  using L = Layout<T, D>;
  constexpr int LD = L::LD, LO = L::LO;
  extern __shared__ __align__(128) unsigned char smem[];
  const typename L::Fwd at;
  T* qs = reinterpret_cast<T*>(smem + at.q);
  T* ks = reinterpret_cast<T*>(smem + at.k);
  T* vs = reinterpret_cast<T*>(smem + at.v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* sw = reinterpret_cast<float*>(smem + at.s) + warp * 16 * LS;
  T* pw = reinterpret_cast<T*>(smem + at.p) + warp * 16 * LP;
  float* ow = reinterpret_cast<float*>(smem + at.o) + warp * 16 * LO;
  float* mw = reinterpret_cast<float*>(smem + at.stats) + warp * 16;  // running max
  float* lw = mw + kRows;                                              // running sum
  float* cw = lw + kRows;                                              // this tile's correction
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H, row = (H + 2 * KV) * D, g = h / (H / KV);
  const int64_t q0 = int64_t(gridDim.y - 1 - blockIdx.y) * kRows, t0 = q0 + warp * 16;
  const Bits* base = qkv + b * T_ * row;
  stage<T, D>(qs, base + h * D, row, q0, kRows, T_);
  for (int i = lane; i < 16 * LO; i += 32) ow[i] = 0.0f;
  if (lane < 16) mw[lane] = -INFINITY, lw[lane] = 0.0f;
  const int64_t last = min(T_ - 1, q0 + kRows - 1);
  for (int64_t s0 = 0; s0 <= last; s0 += kTile) {  // s0 <= q0: key s0 is visible to every row
    __syncthreads();
    stage<T, D>(ks, base + (H + g) * D, row, s0, kTile, T_);
    stage<T, D>(vs, base + (H + KV + g) * D, row, s0, kTile, T_);
    __syncthreads();
    product_abt<T, D>(sw, qs + warp * 16 * LD, ks);
    __syncwarp();
    for (int r = 0; r < 16; ++r) {  // online softmax, a row at a time, two columns per lane
      const int64_t t = t0 + r;
      float x[2];
      bool vis[2];
      float mx = -INFINITY;
      for (int u = 0; u < 2; ++u) {
        const int64_t s = s0 + lane + 32 * u;
        vis[u] = s <= t && s < T_;
        x[u] = vis[u] ? sw[r * LS + lane + 32 * u] * scale : -INFINITY;
        mx = fmaxf(mx, x[u]);
      }
      const float m_old = mw[r], m_new = fmaxf(m_old, warp_reduce(mx, MaxOp{}));
      float sum = 0.0f;
      for (int u = 0; u < 2; ++u) {
        const float p = vis[u] ? fast_exp(x[u] - m_new) : 0.0f;
        pw[r * LP + lane + 32 * u] = to_16<T>(p);
        sum += p;
      }
      sum = warp_reduce(sum, SumOp{});
      const float corr = m_old == -INFINITY ? 0.0f : fast_exp(m_old - m_new);
      __syncwarp();  // every lane has read mw[r]
      if (lane == 0) mw[r] = m_new, lw[r] = lw[r] * corr + sum, cw[r] = corr;
    }
    __syncwarp();
    for (int i = lane; i < 16 * D; i += 32) ow[(i / D) * LO + i % D] *= cw[i / D];
    __syncwarp();
    Acc acc[D / 16];
    for (int j = 0; j < D / 16; ++j) wmma::load_matrix_sync(acc[j], ow + j * 16, LO, wmma::mem_row_major);
    accumulate_pm<T, D>(acc, pw, vs);
    for (int j = 0; j < D / 16; ++j) wmma::store_matrix_sync(ow + j * 16, acc[j], LO, wmma::mem_row_major);
    __syncwarp();
  }
  for (int i = lane; i < 16 * D; i += 32) {
    const int r = i / D, c = i % D;
    if (t0 + r < T_) out[((b * T_ + t0 + r) * H + h) * D + c] = store_bits<T>(ow[r * LO + c] / lw[r]);
  }
  if (lane < 16 && t0 + lane < T_) lse[bh * T_ + t0 + lane] = mw[lane] + logf(lw[lane]);
}

// dQ: grid (B * H, ceil(T / kRows)); a block owns 64 query rows and walks the key tiles before them.
template <class T, int D>
__global__ void __launch_bounds__(kBlock) tc_dq_kernel(Bits* dqkv, const Bits* dout, const Bits* qkv,
                                                       const float* lse, const float* delta, int64_t T_, int64_t H,
                                                       int64_t KV, float scale) {
  using L = Layout<T, D>;
  constexpr int LD = L::LD;
  extern __shared__ __align__(128) unsigned char smem[];
  const typename L::Bwd at;
  T* qs = reinterpret_cast<T*>(smem + at.a);
  T* dos = reinterpret_cast<T*>(smem + at.b);
  T* ks = reinterpret_cast<T*>(smem + at.c);
  T* vs = reinterpret_cast<T*>(smem + at.d);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* sw = reinterpret_cast<float*>(smem + at.f) + warp * 2 * 16 * LS;  // scores
  float* dpw = sw + 16 * LS;                                                 // dprobs
  T* dsw = reinterpret_cast<T*>(smem + at.h) + warp * 2 * 16 * LP;         // dscores
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H, row = (H + 2 * KV) * D, g = h / (H / KV);
  const int64_t q0 = int64_t(gridDim.y - 1 - blockIdx.y) * kRows, t0 = q0 + warp * 16;
  const Bits* base = qkv + b * T_ * row;
  stage<T, D>(qs, base + h * D, row, q0, kRows, T_);
  stage<T, D>(dos, dout + b * T_ * H * D + h * D, H * D, q0, kRows, T_);
  Acc dq[D / 16];
  for (int j = 0; j < D / 16; ++j) wmma::fill_fragment(dq[j], 0.0f);
  const int64_t last = min(T_ - 1, q0 + kRows - 1);
  for (int64_t s0 = 0; s0 <= last; s0 += kTile) {
    __syncthreads();
    stage<T, D>(ks, base + (H + g) * D, row, s0, kTile, T_);
    stage<T, D>(vs, base + (H + KV + g) * D, row, s0, kTile, T_);
    __syncthreads();
    product_abt<T, D>(sw, qs + warp * 16 * LD, ks);
    product_abt<T, D>(dpw, dos + warp * 16 * LD, vs);
    __syncwarp();
    for (int r = 0; r < 16; ++r) {
      const int64_t t = t0 + r;
      const float lse_t = t < T_ ? lse[bh * T_ + t] : 0.0f, delta_t = t < T_ ? delta[bh * T_ + t] : 0.0f;
      for (int u = 0; u < 2; ++u) {
        const int c = lane + 32 * u;
        const int64_t s = s0 + c;
        float ds = 0.0f;
        if (s <= t && s < T_ && t < T_) {
          const float p = fast_exp(sw[r * LS + c] * scale - lse_t);
          ds = p * (dpw[r * LS + c] - delta_t) * scale;
        }
        dsw[r * LP + c] = to_16<T>(ds);
      }
    }
    __syncwarp();
    accumulate_pm<T, D>(dq, dsw, ks);  // dq += dscores (16, keys) @ k (keys, D)
    __syncwarp();
  }
  write_rows<T, D>(dqkv + b * T_ * row + h * D, row, t0, T_, dq, sw);
}

// dK, dV: grid (B * KV, ceil(T / kRows)); a block owns 64 key rows of key / value head g and walks
// the query tiles after them, for each query head of g's group in turn. Each warp computes its
// keys' transposed scores k_w q^T directly, so all is warp-local.
template <class T, int D>
__global__ void __launch_bounds__(kBlock) tc_dkv_kernel(Bits* dqkv, const Bits* dout, const Bits* qkv,
                                                        const float* lse, const float* delta, int64_t T_, int64_t H,
                                                        int64_t KV, float scale) {
  using L = Layout<T, D>;
  constexpr int LD = L::LD;
  extern __shared__ __align__(128) unsigned char smem[];
  const typename L::Bwd at;
  T* ks = reinterpret_cast<T*>(smem + at.a);
  T* vs = reinterpret_cast<T*>(smem + at.b);
  T* qs = reinterpret_cast<T*>(smem + at.c);
  T* dos = reinterpret_cast<T*>(smem + at.d);
  float* lse_s = reinterpret_cast<float*>(smem + at.stats);
  float* delta_s = lse_s + kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* stw = reinterpret_cast<float*>(smem + at.f) + warp * 2 * 16 * LS;  // scores^T (16 keys, queries)
  float* dptw = stw + 16 * LS;                                                // dprobs^T
  T* ptw = reinterpret_cast<T*>(smem + at.h) + warp * 2 * 16 * LP;          // probs^T
  T* dstw = ptw + 16 * LP;                                                    // dscores^T
  const int64_t bg = blockIdx.x, b = bg / KV, g = bg % KV, group = H / KV, row = (H + 2 * KV) * D;
  const int64_t j0 = int64_t(blockIdx.y) * kRows, k0 = j0 + warp * 16;  // the most queries first
  const Bits* base = qkv + b * T_ * row;
  stage<T, D>(ks, base + (H + g) * D, row, j0, kRows, T_);
  stage<T, D>(vs, base + (H + KV + g) * D, row, j0, kRows, T_);
  Acc dk[D / 16], dv[D / 16];
  for (int j = 0; j < D / 16; ++j) wmma::fill_fragment(dk[j], 0.0f), wmma::fill_fragment(dv[j], 0.0f);
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    const int64_t bh = b * H + h;
    for (int64_t i0 = j0; i0 < T_; i0 += kTile) {  // kTile == kRows: queries from the block's first key on
      __syncthreads();
      stage<T, D>(qs, base + h * D, row, i0, kTile, T_);
      stage<T, D>(dos, dout + b * T_ * H * D + h * D, H * D, i0, kTile, T_);
      for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
        lse_s[i] = i0 + i < T_ ? lse[bh * T_ + i0 + i] : 0.0f;
        delta_s[i] = i0 + i < T_ ? delta[bh * T_ + i0 + i] : 0.0f;
      }
      __syncthreads();
      product_abt<T, D>(stw, ks + warp * 16 * LD, qs);
      product_abt<T, D>(dptw, vs + warp * 16 * LD, dos);
      __syncwarp();
      for (int r = 0; r < 16; ++r) {  // key k0 + r against queries i0 + c
        const int64_t key = k0 + r;
        for (int u = 0; u < 2; ++u) {
          const int c = lane + 32 * u;
          const int64_t q = i0 + c;
          float p = 0.0f, ds = 0.0f;
          if (q >= key && q < T_ && key < T_) {
            p = fast_exp(stw[r * LS + c] * scale - lse_s[c]);
            ds = p * (dptw[r * LS + c] - delta_s[c]) * scale;
          }
          ptw[r * LP + c] = to_16<T>(p);
          dstw[r * LP + c] = to_16<T>(ds);
        }
      }
      __syncwarp();
      accumulate_pm<T, D>(dv, ptw, dos);  // dv += probs^T (keys, queries) @ dout (queries, D)
      accumulate_pm<T, D>(dk, dstw, qs);  // dk += dscores^T @ q
      __syncwarp();
    }
  }
  write_rows<T, D>(dqkv + b * T_ * row + (H + g) * D, row, k0, T_, dk, stw);
  write_rows<T, D>(dqkv + b * T_ * row + (H + KV + g) * D, row, k0, T_, dv, stw);
}

template <class K>
void allow_smem(K kernel, size_t bytes) {
  TPT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <class T, int D>
void forward(Bits* out, float* lse, const Bits* qkv, int64_t B, int64_t T_, int64_t H, int64_t KV, cudaStream_t s) {
  const size_t smem = typename Layout<T, D>::Fwd().total;
  allow_smem(tc_forward_kernel<T, D>, smem);  // per device (a process may drive several): set at every launch
  const dim3 grid(unsigned(B * H), unsigned((T_ + kRows - 1) / kRows));
  tc_forward_kernel<T, D><<<grid, kBlock, smem, s>>>(out, lse, qkv, T_, H, KV, 1.0f / std::sqrt(float(D)));
  TPT_CUDA_LAUNCHED();
}

template <class T, int D>
void backward(Bits* dqkv, const Bits* dout, const Bits* qkv, const float* lse, const float* delta, int64_t B,
              int64_t T_, int64_t H, int64_t KV, cudaStream_t s) {
  const size_t smem = typename Layout<T, D>::Bwd().total;
  allow_smem(tc_dq_kernel<T, D>, smem);  // per device: at every launch, as the forward
  allow_smem(tc_dkv_kernel<T, D>, smem);
  const unsigned row_blocks = unsigned((T_ + kRows - 1) / kRows);
  const float scale = 1.0f / std::sqrt(float(D));
  tc_dq_kernel<T, D><<<dim3(unsigned(B * H), row_blocks), kBlock, smem, s>>>(dqkv, dout, qkv, lse, delta, T_, H, KV,
                                                                             scale);
  TPT_CUDA_LAUNCHED();
  tc_dkv_kernel<T, D><<<dim3(unsigned(B * KV), row_blocks), kBlock, smem, s>>>(dqkv, dout, qkv, lse, delta, T_, H,
                                                                               KV, scale);
  TPT_CUDA_LAUNCHED();
}

template <class T>
void forward_t(Bits* out, float* lse, const Bits* qkv, int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t D,
               cudaStream_t s) {
  switch (D) {
    case 32: return forward<T, 32>(out, lse, qkv, B, T_, H, KV, s);
    case 64: return forward<T, 64>(out, lse, qkv, B, T_, H, KV, s);
    case 128: return forward<T, 128>(out, lse, qkv, B, T_, H, KV, s);
  }
  internal_error("tensor-core attention: head dimension " + std::to_string(D) + " not built");
}

template <class T>
void backward_t(Bits* dqkv, const Bits* dout, const Bits* qkv, const float* lse, const float* delta, int64_t B,
                int64_t T_, int64_t H, int64_t KV, int64_t D, cudaStream_t s) {
  switch (D) {
    case 32: return backward<T, 32>(dqkv, dout, qkv, lse, delta, B, T_, H, KV, s);
    case 64: return backward<T, 64>(dqkv, dout, qkv, lse, delta, B, T_, H, KV, s);
    case 128: return backward<T, 128>(dqkv, dout, qkv, lse, delta, B, T_, H, KV, s);
  }
  internal_error("tensor-core attention: head dimension " + std::to_string(D) + " not built");
}

template <int D>
size_t smem_bytes() {  // the larger of the kernels' (the same for bf16 and fp16)
  using L = Layout<__nv_bfloat16, D>;
  return std::max(typename L::Fwd().total, typename L::Bwd().total);
}


}  // namespace

// Also asks the current device (once; called on every attention call): D = 128 needs ~121 KB of
// shared memory per block, more than the 99 KB of sm_86 / sm_89 GPUs (they run the sm_80 code),
// which then take the fp32 kernels.
bool tc_attention_supported(int64_t D, DType t) {
  if (!(t == DType::BF16 || t == DType::F16) || !(D == 32 || D == 64 || D == 128)) return false;
  static int optin[64] = {};  // per device; 0 = not asked yet, -1 = unknown
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) {
    (void)cudaGetLastError();
    return false;
  }
  if (optin[device] == 0 &&
      cudaDeviceGetAttribute(&optin[device], cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    (void)cudaGetLastError();
    optin[device] = -1;
  }
  const size_t need = D == 32 ? smem_bytes<32>() : D == 64 ? smem_bytes<64>() : smem_bytes<128>();
  return optin[device] > 0 && size_t(optin[device]) >= need;
}

bool tc_attention_aligned(CBuf qkv, CBuf dout) {
  return is_aligned(qkv.p, 16) && (!dout || is_aligned(dout.p, 16));
}

void tc_flash_attention_forward(Buf out, float* lse, CBuf qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                cudaStream_t s) {
  if (B * T * H <= 0) return;
  TPT_CHECK(KV >= 1 && H % KV == 0);
  TPT_CHECK(out.t == qkv.t && tc_attention_supported(D, qkv.t) && tc_attention_aligned(qkv, {}) &&
            B * H <= int64_t(INT32_MAX) && (T + kRows - 1) / kRows <= 65535);
  auto* o = static_cast<Bits*>(out.p);
  const auto* x = static_cast<const Bits*>(qkv.p);
  if (qkv.t == DType::BF16) forward_t<__nv_bfloat16>(o, lse, x, B, T, H, KV, D, s);
  else forward_t<__half>(o, lse, x, B, T, H, KV, D, s);
}

void tc_flash_attention_backward(Buf dqkv, float* delta, CBuf dout, CBuf qkv, CBuf out, const float* lse,
                                 int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, cudaStream_t s) {
  if (B * T * H <= 0) return;
  TPT_CHECK(KV >= 1 && H % KV == 0);
  TPT_CHECK(dqkv.t == qkv.t && dout.t == qkv.t && out.t == qkv.t && tc_attention_supported(D, qkv.t) &&
            tc_attention_aligned(qkv, dout) && B * H <= int64_t(INT32_MAX) && (T + kRows - 1) / kRows <= 65535);
  attention_row_dots(delta, dout, out, B, T, H, D, s);
  auto* dx = static_cast<Bits*>(dqkv.p);
  const auto *dy = static_cast<const Bits*>(dout.p), *x = static_cast<const Bits*>(qkv.p);
  if (qkv.t == DType::BF16) backward_t<__nv_bfloat16>(dx, dy, x, lse, delta, B, T, H, KV, D, s);
  else backward_t<__half>(dx, dy, x, lse, delta, B, T, H, KV, D, s);
}

}  // namespace tpt::cuda
