// Ring attention blocks on the GPU (core/cuda/attention/ring_attention.h): a warp per (query row,
// head), the keys the row sees (RingBlock::visible) visited in order with the online softmax in
// registers, as the CPU backend's row loop (core/cpu/ring_kernels.cpp) does. Simple and exact rather
// than fast: the ring's test fixture and the fallback where cuDNN does not run a block
// (core/cuda/attention/cudnn_attention.h ring_forward: fp32, shapes it refuses, no cuDNN); the
// cuDNN path's fp32 merge and gradient sums are here too. The backward is two kernels without
// atomics, so it repeats bit for bit: dQ by a warp per (query row, head) over its keys, dK/dV by a warp
// per (key row, KV head) over the queries that see it -- the group's heads, then the rows, in order --
// recomputing each pair's probability and D = rowsum(dO o O) (one more dot product per pair than a
// shared-atomic kernel, no atomics).
#include <cmath>
#include <string>

#include "core/cuda/attention/ring_attention.h"
#include "core/cuda/device_util.h"
#include "core/cuda/launch_util.h"
#include "core/error.h"

namespace tpt::cuda {
namespace {

constexpr int kLanes = 32, kPer = int(kRingMaxD / kLanes);

__device__ inline float warp_sum(float v) { return warp_reduce(v, SumOp{}); }

// The (query row t, head h, sequence b) of this warp, the keys it sees in the block and the offsets
// of its head's query, key and value: what both kernels start from.
struct RingRow {
  int64_t t, h, b, n[2], row, krow, koff, voff;
  float scale;
  __device__ RingRow(const RingBlock& blk, int64_t H, int64_t KV, int64_t D)
      : t(blockIdx.x), h(blockIdx.y), b(blockIdx.z), row((H + 2 * KV) * D), krow(2 * KV * D),
        koff((h / (H / KV)) * D), voff(koff + KV * D), scale(1.0f / sqrtf(float(D))) {
    blk.visible(t, n);
  }
  __device__ bool empty() const { return n[0] + n[1] == 0; }
};

template <class T>
__global__ void ring_forward_kernel(float* out, float* lse, const T* qkv, const T* kv, int64_t T_, int64_t H,
                                    int64_t KV, int64_t D, RingBlock blk) {
  const RingRow w(blk, H, KV, D);
  if (w.empty()) return;
  const int64_t t = w.t, h = w.h, b = w.b, row = w.row, krow = w.krow, koff = w.koff, voff = w.voff;
  const int64_t* n = w.n;
  const float scale = w.scale;
  const int lane = threadIdx.x;
  const T* q = qkv + (b * T_ + t) * row + h * D;
  const T* kb = kv + b * T_ * krow;
  float qv[kPer], acc[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + k * kLanes;
    qv[k] = d < D ? ld(q, d) : 0.0f;
    acc[k] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < 2; ++j)
    for (int64_t s = j * blk.c; s < j * blk.c + n[j]; ++s) {
      const T* key = kb + s * krow + koff;
      float dot = 0.0f;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t d = lane + k * kLanes;
        if (d < D) dot += qv[k] * ld(key, d);
      }
      const float score = warp_sum(dot) * scale, m_new = fmaxf(m, score);
      const float corr = expf(m - m_new), p = expf(score - m_new);
      l = l * corr + p;
      const T* val = kb + s * krow + voff;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t d = lane + k * kLanes;
        if (d < D) acc[k] = acc[k] * corr + p * ld(val, d);
      }
      m = m_new;
    }
  const float blse = m + logf(l);
  float* y = out + (b * T_ + t) * H * D + h * D;
  float* lrow = lse + (b * H + h) * T_ + t;
  const float old = *lrow;
  float w_old = 0.0f, w_new = 1.0f / l, merged = blse;
  if (!blk.first) {
    merged = fmaxf(old, blse) + log1pf(expf(-fabsf(old - blse)));
    w_old = expf(old - merged);
    w_new = expf(blse - merged) / l;
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + k * kLanes;
    if (d < D) y[d] = (blk.first ? 0.0f : y[d] * w_old) + acc[k] * w_new;
  }
  __syncwarp();
  if (lane == 0) *lrow = merged;
}

template <class T>
__global__ void ring_backward_dq_kernel(float* dq, const T* dout, const T* out, const float* lse, const T* qkv,
                                        const T* kv, int64_t T_, int64_t H, int64_t KV, int64_t D, RingBlock blk) {
  const RingRow w(blk, H, KV, D);
  if (w.empty()) return;
  const int64_t t = w.t, h = w.h, b = w.b, row = w.row, krow = w.krow, koff = w.koff, voff = w.voff;
  const int64_t* n = w.n;
  const float scale = w.scale;
  const int lane = threadIdx.x;
  const T* q = qkv + (b * T_ + t) * row + h * D;
  const T* dy = dout + (b * T_ + t) * H * D + h * D;
  const T* y = out + (b * T_ + t) * H * D + h * D;
  const T* kb = kv + b * T_ * krow;
  const float lse_t = lse[(b * H + h) * T_ + t];
  float qv[kPer], dyv[kPer], dqa[kPer], delta = 0.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + k * kLanes;
    qv[k] = d < D ? ld(q, d) : 0.0f;
    dyv[k] = d < D ? ld(dy, d) : 0.0f;
    dqa[k] = 0.0f;
    if (d < D) delta += dyv[k] * ld(y, d);
  }
  delta = warp_sum(delta);
  for (int j = 0; j < 2; ++j)
    for (int64_t s = j * blk.c; s < j * blk.c + n[j]; ++s) {
      const T* key = kb + s * krow + koff;
      const T* val = kb + s * krow + voff;
      float dot = 0.0f, dp = 0.0f;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t d = lane + k * kLanes;
        if (d < D) {
          dot += qv[k] * ld(key, d);
          dp += dyv[k] * ld(val, d);
        }
      }
      const float p = expf(warp_sum(dot) * scale - lse_t);
      const float ds = p * (warp_sum(dp) - delta) * scale;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t d = lane + k * kLanes;
        if (d < D) dqa[k] += ds * ld(key, d);
      }
    }
  float* dqr = dq + (b * T_ + t) * H * D + h * D;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + k * kLanes;
    if (d < D) dqr[d] += dqa[k];
  }
}

// A warp per (key row s, KV head g, sequence b): the dK/dV of the key from every query that sees it
// (RingBlock::visible), the group's query heads in order, each head's rows in order.
template <class T>
__global__ void ring_backward_dkv_kernel(float* dkv, const T* dout, const T* out, const float* lse, const T* qkv,
                                         const T* kv, int64_t T_, int64_t H, int64_t KV, int64_t D, RingBlock blk) {
  const int64_t s = blockIdx.x, g = blockIdx.y, b = blockIdx.z, row = (H + 2 * KV) * D, krow = 2 * KV * D;
  const int64_t j = s / blk.c, i = s % blk.c, G = H / KV;
  const float scale = 1.0f / sqrtf(float(D));
  const int lane = threadIdx.x;
  const T* key = kv + (b * T_ + s) * krow + g * D;
  const T* val = key + KV * D;
  float kr[kPer], vr[kPer], dk[kPer], dv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + k * kLanes;
    kr[k] = d < D ? ld(key, d) : 0.0f;
    vr[k] = d < D ? ld(val, d) : 0.0f;
    dk[k] = dv[k] = 0.0f;
  }
  bool seen = false;
  for (int64_t h = g * G; h < (g + 1) * G; ++h)
    for (int64_t t = 0; t < T_; ++t) {
      int64_t n[2];
      blk.visible(t, n);
      if (i >= n[j]) continue;
      seen = true;
      const T* q = qkv + (b * T_ + t) * row + h * D;
      const T* dy = dout + (b * T_ + t) * H * D + h * D;
      const T* y = out + (b * T_ + t) * H * D + h * D;
      float dot = 0.0f, dp = 0.0f, delta = 0.0f;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t d = lane + k * kLanes;
        if (d < D) {
          const float dyd = ld(dy, d);
          dot += ld(q, d) * kr[k];
          dp += dyd * vr[k];
          delta += dyd * ld(y, d);
        }
      }
      const float p = expf(warp_sum(dot) * scale - lse[(b * H + h) * T_ + t]);
      const float ds = p * (warp_sum(dp) - warp_sum(delta)) * scale;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t d = lane + k * kLanes;
        if (d < D) {
          dk[k] += ds * ld(q, d);
          dv[k] += p * ld(dy, d);
        }
      }
    }
  if (!seen) return;
  float* dkr = dkv + (b * T_ + s) * krow + g * D;
  float* dvr = dkr + KV * D;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + k * kLanes;
    if (d < D) dkr[d] += dk[k], dvr[d] += dv[k];
  }
}

// the merged lse of a row that held `old` and a pair's `add`
__device__ inline float lse_merge(float old, float add) { return fmaxf(old, add) + log1pf(expf(-fabsf(old - add))); }

// a block per (pair row i, sequence b): every head's channels, then (after all have read the old lse)
// every head's lse
template <class X>
__global__ void ring_merge_kernel(float* out, float* lse, const X* o, const float* stats, int64_t T, int64_t H,
                                  int64_t D, int64_t t0, bool write) {
  const int64_t i = blockIdx.x, b = blockIdx.y, c = T / 2, HD = H * D;
  float* y = out + (b * T + t0 + i) * HD;
  const X* op = o + (b * c + i) * HD;
  for (int64_t e = threadIdx.x; e < HD; e += blockDim.x) {
    const int64_t h = e / D;
    const float add = stats[(b * H + h) * c + i];
    if (write) {
      y[e] = ld(op, e);
    } else {
      const float old = lse[(b * H + h) * T + t0 + i], m = lse_merge(old, add);
      y[e] = y[e] * expf(old - m) + ld(op, e) * expf(add - m);
    }
  }
  __syncthreads();
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float* l = lse + (b * H + h) * T + t0 + i;
    const float add = stats[(b * H + h) * c + i];
    *l = write ? add : lse_merge(*l, add);
  }
}

template <class X>
__global__ void add_rows_kernel(float* dst, int64_t dst_batch, const X* src, int64_t B, int64_t n) {
  TPT_GRID_LOOP(i, B * n) { dst[(i / n) * dst_batch + i % n] += ld(src, i); }
}

template <class TD, class TS>
__global__ void copy_rows_kernel(TD* dst, int64_t ds, const TS* src, int64_t ss, int64_t rows, int64_t cols) {
  TPT_GRID_LOOP(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    st(dst, r * ds + c, ld(src, r * ss + c));
  }
}

void check_ring(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, const RingBlock& blk) {
  if (D < 1 || D > kRingMaxD || KV < 1 || H % KV || T != 2 * blk.c || H > 65535 || B > 65535)
    internal_error("ring attention on the GPU: unsupported shape (head dim " + std::to_string(D) + ", at most " +
                   std::to_string(kRingMaxD) + "; " + std::to_string(T) + " tokens)");
}

}  // namespace

void ring_block_forward(float* out, float* lse, CBuf qkv, CBuf kv, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t D, const RingBlock& blk, cudaStream_t s) {
  check_ring(B, T, H, KV, D, blk);
  check_same(qkv.t, kv.t, "ring_block_forward");
  if (B * T * H == 0) return;
  dispatch(qkv.t, [&](auto tag) {
    using X = decltype(tag);
    ring_forward_kernel<X><<<dim3(unsigned(T), unsigned(H), unsigned(B)), kLanes, 0, s>>>(
        out, lse, typed<X>(qkv), typed<X>(kv), T, H, KV, D, blk);
    TPT_CUDA_LAUNCHED();
  });
}

void ring_block_backward(float* dq, float* dkv, CBuf dout, CBuf out, const float* lse, CBuf qkv, CBuf kv, int64_t B,
                         int64_t T, int64_t H, int64_t KV, int64_t D, const RingBlock& blk, cudaStream_t s) {
  check_ring(B, T, H, KV, D, blk);
  check_same(qkv.t, kv.t, "ring_block_backward");
  check_same(qkv.t, dout.t, "ring_block_backward");
  check_same(qkv.t, out.t, "ring_block_backward");
  if (B * T * H == 0) return;
  dispatch(qkv.t, [&](auto tag) {
    using X = decltype(tag);
    ring_backward_dq_kernel<X><<<dim3(unsigned(T), unsigned(H), unsigned(B)), kLanes, 0, s>>>(
        dq, typed<X>(dout), typed<X>(out), lse, typed<X>(qkv), typed<X>(kv), T, H, KV, D, blk);
    TPT_CUDA_LAUNCHED();
    ring_backward_dkv_kernel<X><<<dim3(unsigned(T), unsigned(KV), unsigned(B)), kLanes, 0, s>>>(
        dkv, typed<X>(dout), typed<X>(out), lse, typed<X>(qkv), typed<X>(kv), T, H, KV, D, blk);
    TPT_CUDA_LAUNCHED();
  });
}

void ring_merge_pair(float* out, float* lse, CBuf o, const float* stats, int64_t B, int64_t T, int64_t H, int64_t D,
                     int64_t t0, bool write, cudaStream_t s) {
  if (B * T * H * D == 0) return;
  dispatch(o.t, [&](auto tag) {
    using X = decltype(tag);
    ring_merge_kernel<X><<<dim3(unsigned(T / 2), unsigned(B)), kThreads, 0, s>>>(out, lse, typed<X>(o), stats, T, H,
                                                                                 D, t0, write);
    TPT_CUDA_LAUNCHED();
  });
}

void ring_add_rows(float* dst, int64_t dst_batch, CBuf src, int64_t B, int64_t n, cudaStream_t s) {
  if (B * n == 0) return;
  dispatch(src.t, [&](auto tag) {
    using X = decltype(tag);
    add_rows_kernel<X><<<blocks_for(B * n), kThreads, 0, s>>>(dst, dst_batch, typed<X>(src), B, n);
    TPT_CUDA_LAUNCHED();
  });
}

void copy_rows(Buf dst, int64_t dst_stride, CBuf src, int64_t src_stride, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols == 0) return;
  dispatch(dst.t, [&](auto dtag) {
    using TD = decltype(dtag);
    dispatch(src.t, [&](auto stag) {
      using TS = decltype(stag);
      copy_rows_kernel<TD, TS><<<blocks_for(rows * cols), kThreads, 0, s>>>(typed<TD>(dst), dst_stride,
                                                                          typed<TS>(src), src_stride, rows, cols);
      TPT_CUDA_LAUNCHED();
    });
  });
}

}  // namespace tpt::cuda
