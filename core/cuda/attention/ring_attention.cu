// Ring attention blocks on the GPU (core/cuda/attention/ring_attention.h): a warp per (query row,
// head), the keys the row sees (RingBlock::visible) visited in order with the online softmax in
// registers, as the CPU backend's row loop (core/cpu/ring_kernels.cpp) does; the fallback where cuDNN
// does not run a block (core/cuda/attention/cudnn_attention.h ring_forward: fp32, shapes it refuses,
// no cuDNN), and the cuDNN path's fp32 merge and gradient sums. Tiled: a thread block holds
// kRowsPerBlock consecutive rows of one head, one per warp, and stages the other operand's rows in
// shared memory kTile at a time (converted to fp32), so each key (query) row is read from global
// memory once per block, not once per row; every warp still adds its pairs in the order of the
// untiled loop. The backward is two kernels without atomics, so it repeats bit for bit: dQ per
// (query row, head) over its keys, dK/dV per (key row, KV head) over the queries that see it -- the
// group's heads, then the rows, in order -- recomputing each pair's probability and D = rowsum(dO o O).
#include <cmath>
#include <string>

#include "core/cuda/attention/ring_attention.h"
#include "core/cuda/device_util.h"
#include "core/cuda/launch_util.h"
#include "core/error.h"

namespace tpt::cuda {
namespace {

constexpr int kLanes = 32, kPer = int(kRingMaxD / kLanes);
constexpr int kRowsPerBlock = 8;                 // warps per thread block: one row each
constexpr int kBlockThreads = kRowsPerBlock * kLanes;
constexpr int kTile = 16;                        // key rows staged per step (forward, dQ)
constexpr int kQTile = 8;                        // query rows staged per step (dK/dV: q, dO, O)

__device__ inline float warp_sum(float v) { return warp_reduce(v, SumOp{}); }

// This warp's query row t (live: t < T) of head h, sequence b, the keys it sees in the block, the
// offsets of its head's query, key and value, and the block's widest key span per chunk (len).
struct RingRow {
  int64_t t, h, b, n[2] = {0, 0}, len[2] = {0, 0}, row, krow, koff, voff;
  bool live;
  float scale;
  __device__ RingRow(const RingBlock& blk, int64_t T, int64_t H, int64_t KV, int64_t D, int64_t (*spans)[2])
      : t(int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes), h(blockIdx.y), b(blockIdx.z),
        row((H + 2 * KV) * D), krow(2 * KV * D), koff((h / (H / KV)) * D), voff(koff + KV * D), live(t < T),
        scale(1.0f / sqrtf(float(D))) {
    if (live) blk.visible(t, n);
    if (threadIdx.x % kLanes == 0) spans[threadIdx.x / kLanes][0] = n[0], spans[threadIdx.x / kLanes][1] = n[1];
    __syncthreads();
    for (int w = 0; w < kRowsPerBlock; ++w)
      for (int j = 0; j < 2; ++j) len[j] = spans[w][j] > len[j] ? spans[w][j] : len[j];
  }
  __device__ bool empty() const { return n[0] + n[1] == 0; }
};

// Calls pair(k, v) -- the key and value rows in shared fp32 -- for each key the warp's row sees, in
// order (chunk 0, then chunk 1), staging the block's widest spans kTile rows at a time. Every thread
// of the block calls it (it synchronises the block).
template <class T, class F>
__device__ void for_keys(const RingRow& w, const RingBlock& blk, const T* kv, int64_t T_, int64_t D, F&& pair) {
  __shared__ float ks[kTile][kRingMaxD], vs[kTile][kRingMaxD];
  const T* kb = kv + w.b * T_ * w.krow;
  for (int j = 0; j < 2; ++j)
    for (int64_t s0 = 0; s0 < w.len[j]; s0 += kTile) {
      const int64_t rows = w.len[j] - s0 < kTile ? w.len[j] - s0 : kTile;
      __syncthreads();  // the previous tile's readers are done
      for (int64_t e = threadIdx.x; e < rows * D; e += kBlockThreads) {
        const int64_t r = e / D, d = e % D;
        const T* key = kb + (j * blk.c + s0 + r) * w.krow;
        ks[r][d] = ld(key + w.koff, d);
        vs[r][d] = ld(key + w.voff, d);
      }
      __syncthreads();
      for (int64_t r = 0; r < rows && s0 + r < w.n[j]; ++r) pair(ks[r], vs[r]);  // w.n[j] = 0 for a dead row
    }
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads) ring_forward_kernel(float* out, float* lse, const T* qkv, const T* kv,
                                                                     int64_t T_, int64_t H, int64_t KV, int64_t D,
                                                                     RingBlock blk) {
  __shared__ int64_t spans[kRowsPerBlock][2];
  const RingRow w(blk, T_, H, KV, D, spans);
  const int64_t t = w.t, h = w.h, b = w.b;
  const int lane = threadIdx.x % kLanes;
  float qv[kPer], acc[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + k * kLanes;
    qv[k] = w.live && d < D ? ld(qkv + (b * T_ + t) * w.row + h * D, d) : 0.0f;
    acc[k] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for_keys(w, blk, kv, T_, D, [&](const float* key, const float* val) {
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t d = lane + k * kLanes;
      if (d < D) dot += qv[k] * key[d];
    }
    const float score = warp_sum(dot) * w.scale, m_new = fmaxf(m, score);
    const float corr = expf(m - m_new), p = expf(score - m_new);
    l = l * corr + p;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t d = lane + k * kLanes;
      if (d < D) acc[k] = acc[k] * corr + p * val[d];
    }
    m = m_new;
  });
  if (!w.live || w.empty()) return;  // no barrier below
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
__global__ void __launch_bounds__(kBlockThreads) ring_backward_dq_kernel(float* dq, const T* dout, const T* out,
                                                                         const float* lse, const T* qkv, const T* kv,
                                                                         int64_t T_, int64_t H, int64_t KV, int64_t D,
                                                                         RingBlock blk) {
  __shared__ int64_t spans[kRowsPerBlock][2];
  const RingRow w(blk, T_, H, KV, D, spans);
  const int64_t t = w.t, h = w.h, b = w.b;
  const int lane = threadIdx.x % kLanes;
  const int64_t at = (b * T_ + (w.live ? t : 0)) * H * D + h * D;
  const float lse_t = w.live ? lse[(b * H + h) * T_ + t] : 0.0f;
  float qv[kPer], dyv[kPer], dqa[kPer], delta = 0.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + k * kLanes;
    const bool on = w.live && d < D;
    qv[k] = on ? ld(qkv + (b * T_ + t) * w.row + h * D, d) : 0.0f;
    dyv[k] = on ? ld(dout + at, d) : 0.0f;
    dqa[k] = 0.0f;
    if (on) delta += dyv[k] * ld(out + at, d);
  }
  delta = warp_sum(delta);
  for_keys(w, blk, kv, T_, D, [&](const float* key, const float* val) {
    float dot = 0.0f, dp = 0.0f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t d = lane + k * kLanes;
      if (d < D) {
        dot += qv[k] * key[d];
        dp += dyv[k] * val[d];
      }
    }
    const float p = expf(warp_sum(dot) * w.scale - lse_t);
    const float ds = p * (warp_sum(dp) - delta) * w.scale;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t d = lane + k * kLanes;
      if (d < D) dqa[k] += ds * key[d];
    }
  });
  if (!w.live || w.empty()) return;
  float* dqr = dq + at;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + k * kLanes;
    if (d < D) dqr[d] += dqa[k];
  }
}

// A warp per (key row s, KV head g, sequence b), kRowsPerBlock consecutive key rows per thread block:
// the dK/dV of the key from every query that sees it (RingBlock::visible), the group's query heads in
// order, each head's rows in order, the queries' q, dO and O rows staged kQTile at a time.
template <class T>
__global__ void __launch_bounds__(kBlockThreads) ring_backward_dkv_kernel(float* dkv, const T* dout, const T* out,
                                                                          const float* lse, const T* qkv, const T* kv,
                                                                          int64_t T_, int64_t H, int64_t KV, int64_t D,
                                                                          RingBlock blk) {
  __shared__ float qs[kQTile][kRingMaxD], dys[kQTile][kRingMaxD], ys[kQTile][kRingMaxD], ls[kQTile];
  const int64_t s = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes, g = blockIdx.y, b = blockIdx.z;
  const int64_t row = (H + 2 * KV) * D, krow = 2 * KV * D, G = H / KV;
  const bool live = s < T_;
  const int64_t j = live ? s / blk.c : 0, i = live ? s % blk.c : 0;
  const float scale = 1.0f / sqrtf(float(D));
  const int lane = threadIdx.x % kLanes;
  const T* key = kv + (b * T_ + (live ? s : 0)) * krow + g * D;
  const T* val = key + KV * D;
  float kr[kPer], vr[kPer], dk[kPer], dv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t d = lane + k * kLanes;
    kr[k] = live && d < D ? ld(key, d) : 0.0f;
    vr[k] = live && d < D ? ld(val, d) : 0.0f;
    dk[k] = dv[k] = 0.0f;
  }
  bool seen = false;
  for (int64_t h = g * G; h < (g + 1) * G; ++h)
    for (int64_t t0 = 0; t0 < T_; t0 += kQTile) {
      const int64_t rows = T_ - t0 < kQTile ? T_ - t0 : kQTile;
      __syncthreads();  // the previous tile's readers are done
      for (int64_t e = threadIdx.x; e < rows * D; e += kBlockThreads) {
        const int64_t r = e / D, d = e % D, at = (b * T_ + t0 + r) * H * D + h * D;
        qs[r][d] = ld(qkv + (b * T_ + t0 + r) * row + h * D, d);
        dys[r][d] = ld(dout + at, d);
        ys[r][d] = ld(out + at, d);
      }
      if (threadIdx.x < rows) ls[threadIdx.x] = lse[(b * H + h) * T_ + t0 + threadIdx.x];
      __syncthreads();
      if (!live) continue;
      for (int64_t r = 0; r < rows; ++r) {
        int64_t n[2];
        blk.visible(t0 + r, n);
        if (i >= n[j]) continue;
        seen = true;
        float dot = 0.0f, dp = 0.0f, delta = 0.0f;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int64_t d = lane + k * kLanes;
          if (d < D) {
            dot += qs[r][d] * kr[k];
            dp += dys[r][d] * vr[k];
            delta += dys[r][d] * ys[r][d];
          }
        }
        const float p = expf(warp_sum(dot) * scale - ls[r]);
        const float ds = p * (warp_sum(dp) - warp_sum(delta)) * scale;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const int64_t d = lane + k * kLanes;
          if (d < D) {
            dk[k] += ds * qs[r][d];
            dv[k] += p * dys[r][d];
          }
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

// the merged lse of a row that held `old` and a call's `add`
__device__ inline float lse_merge(float old, float add) { return fmaxf(old, add) + log1pf(expf(-fabsf(old - add))); }

// a block per (call row i, sequence b): every head's channels, then (after all have read the old lse)
// every head's lse
template <class X>
__global__ void ring_merge_kernel(float* out, float* lse, const X* o, const float* stats, int64_t T, int64_t H,
                                  int64_t D, int64_t t0, int64_t n, bool write) {
  const int64_t i = blockIdx.x, b = blockIdx.y, HD = H * D;
  float* y = out + (b * T + t0 + i) * HD;
  const X* op = o + (b * n + i) * HD;
  for (int64_t e = threadIdx.x; e < HD; e += blockDim.x) {
    const int64_t h = e / D;
    const float add = stats[(b * H + h) * n + i];
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
    const float add = stats[(b * H + h) * n + i];
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

unsigned row_blocks(int64_t T) { return unsigned((T + kRowsPerBlock - 1) / kRowsPerBlock); }

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
    ring_forward_kernel<X><<<dim3(row_blocks(T), unsigned(H), unsigned(B)), kBlockThreads, 0, s>>>(
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
    ring_backward_dq_kernel<X><<<dim3(row_blocks(T), unsigned(H), unsigned(B)), kBlockThreads, 0, s>>>(
        dq, typed<X>(dout), typed<X>(out), lse, typed<X>(qkv), typed<X>(kv), T, H, KV, D, blk);
    TPT_CUDA_LAUNCHED();
    ring_backward_dkv_kernel<X><<<dim3(row_blocks(T), unsigned(KV), unsigned(B)), kBlockThreads, 0, s>>>(
        dkv, typed<X>(dout), typed<X>(out), lse, typed<X>(qkv), typed<X>(kv), T, H, KV, D, blk);
    TPT_CUDA_LAUNCHED();
  });
}

void ring_merge_rows(float* out, float* lse, CBuf o, const float* stats, int64_t B, int64_t T, int64_t H, int64_t D,
                     int64_t t0, int64_t n, bool write, cudaStream_t s) {
  if (B * n * H * D == 0) return;
  dispatch(o.t, [&](auto tag) {
    using X = decltype(tag);
    ring_merge_kernel<X><<<dim3(unsigned(n), unsigned(B)), kThreads, 0, s>>>(out, lse, typed<X>(o), stats, T, H, D,
                                                                            t0, n, write);
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
