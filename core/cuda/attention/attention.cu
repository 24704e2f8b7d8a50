// Causal attention of the CUDA backend. CudaOps::attention_forward / backward run the flash-style
// kernels: tiled, with an online softmax, they never materialise a T x T matrix and keep only the
// log-sum-exp of each query row; backward recomputes the probabilities tile by tile. They are
// instantiated for the storage type of qkv / out / dout / dqkv (fp32, bf16 or fp16 bits): rows are
// converted to fp32 as they are staged, everything is computed in fp32, and out / dqkv are rounded
// once as they are stored. lse and delta are fp32. Grouped-query attention: qkv (B, T, (H + 2 KV) D)
// holds H query heads, then KV key heads, then KV value heads; query head h reads key / value head
// h / (H / KV) in place (no repeated heads materialised), and the dK/dV kernel's block that owns a
// key / value head's rows walks its group's query heads one after another, so their gradients sum
// in a fixed order.
//
// Below them, a naive reference (tests only) on a (B, H, T, T) probability buffer: scores, causal
// softmax rows, weighted values, and their backward, each element computed on its own.
#include <cmath>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"

namespace tpt::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;  // a warp per row

__global__ void softmax_causal_forward_kernel(float* probs, float* lse, int64_t rows, int64_t T) {
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int64_t t = r % T;  // query position: keys 0..t are visible
  float* p = probs + r * T;
  float mx = -INFINITY;
  for (int64_t s = lane; s <= t; s += 32) mx = fmaxf(mx, p[s]);
  mx = warp_reduce(mx, MaxOp{});
  float sum = 0.0f;
  for (int64_t s = lane; s <= t; s += 32) {
    const float e = fast_exp(p[s] - mx);
    p[s] = e;
    sum += e;
  }
  sum = warp_reduce(sum, SumOp{});
  if (lane == 0) lse[r] = mx + logf(sum);
  const float inv = 1.0f / sum;
  for (int64_t s = lane; s <= t; s += 32) p[s] *= inv;
  for (int64_t s = t + 1 + lane; s < T; s += 32) p[s] = 0.0f;
}

__global__ void softmax_causal_backward_kernel(float* ds, const float* probs, int64_t rows, int64_t T, float scale) {
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int64_t t = r % T;
  const float* p = probs + r * T;
  float* d = ds + r * T;
  float dot = 0.0f;
  for (int64_t s = lane; s <= t; s += 32) dot += p[s] * d[s];
  dot = warp_reduce(dot, SumOp{});
  for (int64_t s = lane; s <= t; s += 32) d[s] = p[s] * (d[s] - dot) * scale;
  for (int64_t s = t + 1 + lane; s < T; s += 32) d[s] = 0.0f;
}

// ---------------------------------------------------------------- flash-style
// A block handles kFlashRows query rows (or key rows in dK/dV), a warp each, against tiles of
// kFlashTile keys (queries), a lane each, staged in shared memory (rows padded to D + 1 floats). Each lane keeps its share of a
// D-vector accumulator: dimensions lane, lane + 32, ... (D <= kFlashMaxD).

constexpr int kFlashRows = 8;
constexpr int kFlashTile = 32;
constexpr int kFlashMaxD = 128;
constexpr int kPerLane = kFlashMaxD / 32;
constexpr unsigned kFull = 0xffffffffu;

__device__ inline float dot_rows(const float* a, const float* b, int64_t D) {
  float s = 0.0f;
  for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

// rows [r0, r0 + n) of one head of qkv (rows of `row` elements; the head's D values at column
// `col`: a query head h at h D, key head g at (H + g) D, value head g at (H + KV + g) D) -> fp32
// smem (n, D); zeros past T
template <class S>
__device__ inline void stage_rows(float* dst, const S* base, int64_t row, int64_t col, int64_t r0, int n, int64_t T,
                                  int64_t D) {
  for (int64_t i = threadIdx.x; i < int64_t(n) * D; i += blockDim.x) {
    const int64_t r = r0 + i / D, d = i % D;
    dst[i / D * (D + 1) + i % D] = r < T ? ld(base, r * row + col + d) : 0.0f;
  }
}
// rows of a (B, T, H, D) tensor (out, dout) of one head -> fp32 smem (n, D)
template <class S>
__device__ inline void stage_head_rows(float* dst, const S* base, int64_t r0, int n, int64_t T, int64_t H,
                                       int64_t D, int64_t h) {
  for (int64_t i = threadIdx.x; i < int64_t(n) * D; i += blockDim.x) {
    const int64_t r = r0 + i / D, d = i % D;
    dst[i / D * (D + 1) + i % D] = r < T ? ld(base, (r * H + h) * D + d) : 0.0f;
  }
}

// grid (B * H, ceil(T / kFlashRows))
template <class S>
__global__ void flash_forward_kernel(S* out, float* lse, const S* qkv, int64_t T, int64_t H, int64_t KV, int64_t D,
                                     float scale) {
  extern __shared__ float sm[];
  const int64_t L = D + 1;  // padded rows: lanes reading different rows hit different banks
  float* ks = sm;                     // (kFlashTile, D)
  float* vs = ks + kFlashTile * L;    // (kFlashTile, D)
  float* qs = vs + kFlashTile * L;    // (kFlashRows, D)
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t0 = int64_t(gridDim.y - 1 - blockIdx.y) * kFlashRows, t = t0 + warp;  // longest rows first
  const int64_t row = (H + 2 * KV) * D, g = h / (H / KV);  // g: the key / value head of query head h
  const S* base = qkv + b * T * row;
  stage_rows(qs, base, row, h * D, t0, kFlashRows, T, D);
  float m = -INFINITY, l = 0.0f, o[kPerLane] = {};
  const int64_t last = min(T - 1, t0 + kFlashRows - 1);  // every tile starts at or before t0
  for (int64_t s0 = 0; s0 <= last; s0 += kFlashTile) {
    __syncthreads();  // the previous tile is consumed
    stage_rows(ks, base, row, (H + g) * D, s0, kFlashTile, T, D);
    stage_rows(vs, base, row, (H + KV + g) * D, s0, kFlashTile, T, D);
    __syncthreads();
    if (t >= T) continue;  // warp-uniform
    const int64_t s = s0 + lane;
    const bool visible = s <= t;
    const float score = visible ? dot_rows(qs + warp * L, ks + lane * L, D) * scale : -INFINITY;
    const float m_new = fmaxf(m, warp_reduce(score, MaxOp{}));  // finite: key s0 <= t is visible
    const float corr = m == -INFINITY ? 0.0f : fast_exp(m - m_new);
    const float p = visible ? fast_exp(score - m_new) : 0.0f;
    l = l * corr + warp_reduce(p, SumOp{});
    for (int k = 0; k < kPerLane; ++k) o[k] *= corr;
    for (int j = 0; j < kFlashTile; ++j) {
      const float pj = __shfl_sync(kFull, p, j);
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t d = lane + 32 * k;
        if (d < D) o[k] += pj * vs[j * L + d];
      }
    }
    m = m_new;
  }
  if (t >= T) return;
  const float inv = 1.0f / l;
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t d = lane + 32 * k;
    if (d < D) st(out, ((b * T + t) * H + h) * D + d, o[k] * inv);
  }
  if (lane == 0) lse[bh * T + t] = m + logf(l);
}

// delta (B*H, T) = rowsum(dout * out) per head: a warp per (b, h, t)
template <class S>
__global__ void flash_delta_kernel(float* delta, const S* dout, const S* out, int64_t B, int64_t T, int64_t H,
                                   int64_t D) {
  const int64_t r = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;  // (b, h, t)
  const int lane = threadIdx.x % 32;
  if (r >= B * H * T) return;
  const int64_t t = r % T, bh = r / T, b = bh / H, h = bh % H;
  const int64_t off = ((b * T + t) * H + h) * D;
  float s = 0.0f;
  for (int64_t d = lane; d < D; d += 32) s += ld(dout, off + d) * ld(out, off + d);
  s = warp_reduce(s, SumOp{});
  if (lane == 0) delta[r] = s;
}

// dq: grid (B * H, ceil(T / kFlashRows)); a warp per query row, tiles of keys
template <class S>
__global__ void flash_dq_kernel(S* dqkv, const S* dout, const S* qkv, const float* lse, const float* delta, int64_t T,
                                int64_t H, int64_t KV, int64_t D, float scale) {
  extern __shared__ float sm[];
  const int64_t L = D + 1;  // padded rows: lanes reading different rows hit different banks
  float* ks = sm;
  float* vs = ks + kFlashTile * L;
  float* qs = vs + kFlashTile * L;
  float* dos = qs + kFlashRows * L;
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t0 = int64_t(gridDim.y - 1 - blockIdx.y) * kFlashRows, t = t0 + warp;  // longest rows first
  const int64_t row = (H + 2 * KV) * D, g = h / (H / KV);
  const S* base = qkv + b * T * row;
  stage_rows(qs, base, row, h * D, t0, kFlashRows, T, D);
  stage_head_rows(dos, dout + b * T * H * D, t0, kFlashRows, T, H, D, h);
  const float lse_t = t < T ? lse[bh * T + t] : 0.0f, delta_t = t < T ? delta[bh * T + t] : 0.0f;
  float dq[kPerLane] = {};
  const int64_t last = min(T - 1, t0 + kFlashRows - 1);
  for (int64_t s0 = 0; s0 <= last; s0 += kFlashTile) {
    __syncthreads();
    stage_rows(ks, base, row, (H + g) * D, s0, kFlashTile, T, D);
    stage_rows(vs, base, row, (H + KV + g) * D, s0, kFlashTile, T, D);
    __syncthreads();
    if (t >= T) continue;
    const int64_t s = s0 + lane;
    float ds = 0.0f;
    if (s <= t) {
      const float p = fast_exp(dot_rows(qs + warp * L, ks + lane * L, D) * scale - lse_t);
      const float dp = dot_rows(dos + warp * L, vs + lane * L, D);
      ds = p * (dp - delta_t) * scale;
    }
    for (int j = 0; j < kFlashTile; ++j) {
      const float dsj = __shfl_sync(kFull, ds, j);
      for (int k = 0; k < kPerLane; ++k) {
        const int64_t d = lane + 32 * k;
        if (d < D) dq[k] += dsj * ks[j * L + d];
      }
    }
  }
  if (t >= T) return;
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t d = lane + 32 * k;
    if (d < D) st(dqkv, (b * T + t) * row + h * D + d, dq[k]);
  }
}

// dk, dv: grid (B * KV, ceil(T / kFlashRows)); a warp per key row of key / value head g, tiles of
// the queries that see it, for each of the H / KV query heads of g's group in turn (the sum over
// the group in a fixed order: deterministic, no atomics)
template <class S>
__global__ void flash_dkv_kernel(S* dqkv, const S* dout, const S* qkv, const float* lse, const float* delta,
                                 int64_t T, int64_t H, int64_t KV, int64_t D, float scale) {
  extern __shared__ float sm[];
  const int64_t L = D + 1;  // padded rows: lanes reading different rows hit different banks
  float* qs = sm;                       // (kFlashTile, D) queries of the tile
  float* dos = qs + kFlashTile * L;     // (kFlashTile, D) their output gradients
  float* kr = dos + kFlashTile * L;     // (kFlashRows, D) this block's keys
  float* vr = kr + kFlashRows * L;      // (kFlashRows, D) and values
  float* lse_s = vr + kFlashRows * L;   // (kFlashTile)
  float* delta_s = lse_s + kFlashTile;  // (kFlashTile)
  const int64_t bg = blockIdx.x, b = bg / KV, g = bg % KV, group = H / KV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j0 = int64_t(blockIdx.y) * kFlashRows, j = j0 + warp;  // the most queries first
  const int64_t row = (H + 2 * KV) * D;
  const S* base = qkv + b * T * row;
  stage_rows(kr, base, row, (H + g) * D, j0, kFlashRows, T, D);
  stage_rows(vr, base, row, (H + KV + g) * D, j0, kFlashRows, T, D);
  float dk[kPerLane] = {}, dv[kPerLane] = {};
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    const int64_t bh = b * H + h;
    for (int64_t i0 = j0 / kFlashTile * kFlashTile; i0 < T; i0 += kFlashTile) {
      __syncthreads();
      stage_rows(qs, base, row, h * D, i0, kFlashTile, T, D);
      stage_head_rows(dos, dout + b * T * H * D, i0, kFlashTile, T, H, D, h);
      if (threadIdx.x < kFlashTile) {
        const int64_t i = i0 + threadIdx.x;
        lse_s[threadIdx.x] = i < T ? lse[bh * T + i] : 0.0f;
        delta_s[threadIdx.x] = i < T ? delta[bh * T + i] : 0.0f;
      }
      __syncthreads();
      if (j >= T) continue;
      const int64_t i = i0 + lane;
      float p = 0.0f, ds = 0.0f;
      if (i >= j && i < T) {
        p = fast_exp(dot_rows(qs + lane * L, kr + warp * L, D) * scale - lse_s[lane]);
        const float dp = dot_rows(dos + lane * L, vr + warp * L, D);
        ds = p * (dp - delta_s[lane]) * scale;
      }
      for (int q = 0; q < kFlashTile; ++q) {
        const float pq = __shfl_sync(kFull, p, q), dsq = __shfl_sync(kFull, ds, q);
        for (int k = 0; k < kPerLane; ++k) {
          const int64_t d = lane + 32 * k;
          if (d < D) {
            dv[k] += pq * dos[q * L + d];
            dk[k] += dsq * qs[q * L + d];
          }
        }
      }
    }
  }
  if (j >= T) return;
  const int64_t off = (b * T + j) * row;
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t d = lane + 32 * k;
    if (d < D) {
      st(dqkv, off + (H + g) * D + d, dk[k]);
      st(dqkv, off + (H + KV + g) * D + d, dv[k]);
    }
  }
}

// ---------------------------------------------------------------- reference (tests)

// In the reference kernels, query head h of qkv (B, T, (H + 2 KV) D) reads key / value head
// h / (H / KV): its key at column (H + h / (H / KV)) D of a row, its value KV D further.

// probs (B*H, T, T) = scaled scores q_t . k_s for s <= t (the rest is left to the softmax)
__global__ void reference_scores_kernel(float* probs, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                                        int64_t D, float scale) {
  TPT_GRID_LOOP(i, B * H * T * T) {
    const int64_t s = i % T, t = i / T % T, bh = i / (T * T), b = bh / H, h = bh % H, g = h / (H / KV);
    if (s > t) continue;
    const int64_t row = (H + 2 * KV) * D;
    probs[i] = dot_rows(qkv + (b * T + t) * row + h * D, qkv + (b * T + s) * row + (H + g) * D, D) * scale;
  }
}

// out (B, T, H, D) = probs @ v per head
__global__ void reference_values_kernel(float* out, const float* probs, const float* qkv, int64_t B, int64_t T,
                                        int64_t H, int64_t KV, int64_t D) {
  TPT_GRID_LOOP(i, B * T * H * D) {
    const int64_t d = i % D, h = i / D % H, t = i / (H * D) % T, b = i / (T * H * D), g = h / (H / KV);
    const int64_t row = (H + 2 * KV) * D;
    const float* p = probs + ((b * H + h) * T + t) * T;
    float acc = 0.0f;
    for (int64_t s = 0; s <= t; ++s) acc += p[s] * qkv[(b * T + s) * row + (H + KV + g) * D + d];
    out[i] = acc;
  }
}

// dprobs (B*H, T, T) = dout_t . v_s for s <= t
__global__ void reference_dprobs_kernel(float* dprobs, const float* dout, const float* qkv, int64_t B, int64_t T,
                                        int64_t H, int64_t KV, int64_t D) {
  TPT_GRID_LOOP(i, B * H * T * T) {
    const int64_t s = i % T, t = i / T % T, bh = i / (T * T), b = bh / H, h = bh % H, g = h / (H / KV);
    const int64_t row = (H + 2 * KV) * D;
    dprobs[i] = s > t ? 0.0f
                      : dot_rows(dout + (b * T + t) * H * D + h * D, qkv + (b * T + s) * row + (H + KV + g) * D, D);
  }
}

// dqkv (B, T, (H + 2 KV) D) from dscores (scale included) and probs: dq_t = sum_s ds[t][s] k_s,
// dk_s = sum over the group's query heads and t of ds[t][s] q_t, dv_s = the same of p[t][s] dout_t
__global__ void reference_dqkv_kernel(float* dqkv, const float* dscores, const float* probs, const float* dout,
                                      const float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  const int64_t row = (H + 2 * KV) * D, group = H / KV;
  TPT_GRID_LOOP(i, B * T * row) {
    const int64_t d = i % D, slot = i % row / D, u = i / row % T, b = i / (row * T);
    const float* base = qkv + b * T * row;
    float acc = 0.0f;
    if (slot < H) {  // query head `slot`
      const int64_t bh = b * H + slot, g = slot / group;
      for (int64_t s = 0; s <= u; ++s) acc += dscores[(bh * T + u) * T + s] * base[s * row + (H + g) * D + d];
    } else if (slot < H + KV) {  // key head g
      const int64_t g = slot - H;
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        for (int64_t t = u; t < T; ++t) acc += dscores[((b * H + h) * T + t) * T + u] * base[t * row + h * D + d];
    } else {  // value head g
      const int64_t g = slot - H - KV;
      for (int64_t h = g * group; h < (g + 1) * group; ++h)
        for (int64_t t = u; t < T; ++t)
          acc += probs[((b * H + h) * T + t) * T + u] * dout[((b * T + t) * H + h) * D + d];
    }
    dqkv[i] = acc;
  }
}

}  // namespace

namespace {
void check_head_dim(int64_t D) {
  if (D < 1 || D > kFlashMaxD)
    internal_error("the CUDA attention kernels support head dimensions 1.." + std::to_string(kFlashMaxD) + ", not " +
                   std::to_string(D) + " (hidden_size / num_attention_heads)");
}
void check_kv_heads(int64_t H, int64_t KV) {
  if (KV < 1 || KV > H || H % KV != 0)
    internal_error("attention: " + std::to_string(KV) + " key / value heads for " + std::to_string(H) +
                   " query heads (it must divide them)");
}
}  // namespace

void attention_row_dots(float* delta, CBuf dout, CBuf out, int64_t B, int64_t T, int64_t H, int64_t D,
                        cudaStream_t s) {
  const int64_t rows = B * H * T;
  if (rows <= 0) return;
  TPT_CHECK(dout.t == out.t);
  dispatch(out.t, [&](auto tag) {
    using S = decltype(tag);
    flash_delta_kernel<S><<<unsigned((rows + kThreads / 32 - 1) / (kThreads / 32)), kThreads, 0, s>>>(
        delta, static_cast<const S*>(dout.p), static_cast<const S*>(out.p), B, T, H, D);
    TPT_CUDA_LAUNCHED();
  });
}

void flash_attention_forward(Buf out, float* lse, CBuf qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                             cudaStream_t s) {
  if (B * T * H <= 0) return;
  check_head_dim(D);
  check_kv_heads(H, KV);
  TPT_CHECK(out.t == qkv.t && B * H <= int64_t(INT32_MAX) && (T + kFlashRows - 1) / kFlashRows <= 65535);
  const size_t smem = size_t(2 * kFlashTile + kFlashRows) * size_t(D + 1) * sizeof(float);
  const dim3 grid(unsigned(B * H), unsigned((T + kFlashRows - 1) / kFlashRows));
  dispatch(out.t, [&](auto tag) {
    using S = decltype(tag);
    flash_forward_kernel<S><<<grid, kFlashRows * 32, smem, s>>>(static_cast<S*>(out.p), lse,
                                                                static_cast<const S*>(qkv.p), T, H, KV, D,
                                                                1.0f / std::sqrt(float(D)));
    TPT_CUDA_LAUNCHED();
  });
}

void flash_attention_backward(Buf dqkv, float* delta, CBuf dout, CBuf qkv, CBuf out, const float* lse, int64_t B,
                              int64_t T, int64_t H, int64_t KV, int64_t D, cudaStream_t s) {
  if (B * T * H <= 0) return;
  check_head_dim(D);
  check_kv_heads(H, KV);
  TPT_CHECK(dqkv.t == qkv.t && dout.t == qkv.t && out.t == qkv.t && B * H <= int64_t(INT32_MAX) &&
            (T + kFlashRows - 1) / kFlashRows <= 65535);
  const float scale = 1.0f / std::sqrt(float(D));
  attention_row_dots(delta, dout, out, B, T, H, D, s);
  const unsigned row_blocks = unsigned((T + kFlashRows - 1) / kFlashRows);
  const size_t smem =
      size_t(2 * kFlashTile + 2 * kFlashRows) * size_t(D + 1) * sizeof(float) + 2 * kFlashTile * sizeof(float);
  dispatch(dqkv.t, [&](auto tag) {
    using S = decltype(tag);
    S* dq = static_cast<S*>(dqkv.p);
    const S *dy = static_cast<const S*>(dout.p), *x = static_cast<const S*>(qkv.p);
    flash_dq_kernel<S><<<dim3(unsigned(B * H), row_blocks), kFlashRows * 32, smem, s>>>(dq, dy, x, lse, delta, T, H,
                                                                                         KV, D, scale);
    TPT_CUDA_LAUNCHED();
    flash_dkv_kernel<S><<<dim3(unsigned(B * KV), row_blocks), kFlashRows * 32, smem, s>>>(dq, dy, x, lse, delta, T,
                                                                                           H, KV, D, scale);
    TPT_CUDA_LAUNCHED();
  });
}

void reference_attention_forward(float* out, float* lse, float* probs, const float* qkv, int64_t B, int64_t T,
                                 int64_t H, int64_t KV, int64_t D, cudaStream_t s) {
  if (B * T * H <= 0) return;
  check_kv_heads(H, KV);
  reference_scores_kernel<<<blocks_for(B * H * T * T), kThreads, 0, s>>>(probs, qkv, B, T, H, KV, D,
                                                                         1.0f / std::sqrt(float(D)));
  TPT_CUDA_LAUNCHED();
  const int64_t rows = B * H * T;
  softmax_causal_forward_kernel<<<unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, s>>>(probs, lse,
                                                                                                         rows, T);
  TPT_CUDA_LAUNCHED();
  reference_values_kernel<<<blocks_for(B * T * H * D), kThreads, 0, s>>>(out, probs, qkv, B, T, H, KV, D);
  TPT_CUDA_LAUNCHED();
}

void reference_attention_backward(float* dqkv, float* dscores, const float* dout, const float* qkv,
                                  const float* probs, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                  cudaStream_t s) {
  if (B * T * H <= 0) return;
  check_kv_heads(H, KV);
  reference_dprobs_kernel<<<blocks_for(B * H * T * T), kThreads, 0, s>>>(dscores, dout, qkv, B, T, H, KV, D);
  TPT_CUDA_LAUNCHED();
  const int64_t rows = B * H * T;
  softmax_causal_backward_kernel<<<unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, s>>>(
      dscores, probs, rows, T, 1.0f / std::sqrt(float(D)));
  TPT_CUDA_LAUNCHED();
  reference_dqkv_kernel<<<blocks_for(B * T * (H + 2 * KV) * D), kThreads, 0, s>>>(dqkv, dscores, probs, dout, qkv, B,
                                                                                 T, H, KV, D);
  TPT_CUDA_LAUNCHED();
}

}  // namespace tpt::cuda
