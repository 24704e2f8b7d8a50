// The CUDA backend's kernels other than GEMMs and attention: element-wise maps over the shared
// per-element math (core/math.h, core/dtype.h), LayerNorm (with the fused residual add), embeddings,
// the vocab-parallel cross-entropy passes and the reductions. Every kernel is instantiated for the
// storage type of its compute-dtype tensors (device_util.h), converts on load, computes in fp32
// and rounds once on store; 16-byte vector loads and stores where the pointers and sizes allow.
// Row reductions accumulate like the CPU backend (double where it uses double); column reductions
// go through fixed-order partial sums, never atomics, so every result is deterministic.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"

namespace tpt::cuda {
namespace {

template <class T>
const T* typed(CBuf x) {
  return static_cast<const T*>(x.p);
}
template <class T>
T* typed(Buf x) {
  return static_cast<T*>(x.p);
}

// Every pointer aligned to W elements of its own type (vector accesses allowed).
template <int W>
bool all_aligned() {
  return true;
}
template <int W, class P, class... Ps>
bool all_aligned(P* p, Ps*... ps) {
  return (p == nullptr || is_aligned(p, W * sizeof(P))) && all_aligned<W>(ps...);
}

// ---------------------------------------------------------------- element-wise functors

template <class T>
struct GeluForwardF {
  T* out;
  const T* inp;
  template <int W>
  __device__ void apply(int64_t i) const {
    float x[W];
    load_vec<W>(x, inp + i);
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] = gelu(x[k]);
    store_vec<W>(out + i, x);
  }
};

template <class T, class TD>
struct GeluBackwardF {
  T* dinp;
  const TD* dout;
  const T* inp;
  template <int W>
  __device__ void apply(int64_t i) const {
    float d[W], x[W];
    load_vec<W>(d, dout + i);
    load_vec<W>(x, inp + i);
#pragma unroll
    for (int k = 0; k < W; ++k) d[k] = d[k] * gelu_grad(x[k]);
    store_vec<W>(dinp + i, d);
  }
};

template <class T>
struct AddF {
  T* out;
  const T *a, *b;
  template <int W>
  __device__ void apply(int64_t i) const {
    float x[W], y[W];
    load_vec<W>(x, a + i);
    load_vec<W>(y, b + i);
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] = x[k] + y[k];
    store_vec<W>(out + i, x);
  }
};

// out = parts[0] + parts[1] + ... in this order, in fp32
template <class T>
struct SumPartsF {
  T* out;
  const T* parts;
  int k;
  int64_t n;
  template <int W>
  __device__ void apply(int64_t i) const {
    float acc[W], x[W];
    load_vec<W>(acc, parts + i);
    for (int r = 1; r < k; ++r) {
      load_vec<W>(x, parts + int64_t(r) * n + i);
#pragma unroll
      for (int e = 0; e < W; ++e) acc[e] = acc[e] + x[e];
    }
    store_vec<W>(out + i, acc);
  }
};

struct ScaleF {
  float* x;
  float a;
  template <int W>
  __device__ void apply(int64_t i) const {
    float v[W];
    load_vec<W>(v, x + i);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] *= a;
    store_vec<W>(x + i, v);
  }
};

template <class TD, class TS>
struct ConvertF {
  TD* dst;
  const TS* src;
  template <int W>
  __device__ void apply(int64_t i) const {
    float v[W];
    load_vec<W>(v, src + i);
    store_vec<W>(dst + i, v);
  }
};

template <class T>
struct AdamWF {
  float *p, *m, *v;
  const float* g;
  T* compute;  // may be null
  AdamWParams a;
  bool decay;
  template <int W>
  __device__ void apply(int64_t i) const {
    float pp[W], gg[W], mm[W], vv[W];
    load_vec<W>(pp, p + i);
    load_vec<W>(gg, g + i);
    load_vec<W>(mm, m + i);
    load_vec<W>(vv, v + i);
#pragma unroll
    for (int k = 0; k < W; ++k) adamw_update(pp[k], gg[k], mm[k], vv[k], a, decay);
    store_vec<W>(p + i, pp);
    store_vec<W>(m + i, mm);
    store_vec<W>(v + i, vv);
    if (compute) store_vec<W>(compute + i, pp);
  }
};

// out[i] = row[i % C] (vectors need C % W == 0)
template <class T>
struct BroadcastRowsF {
  T* out;
  const T* row;
  int64_t C;
  template <int W>
  __device__ void apply(int64_t i) const {
    float v[W];
    load_vec<W>(v, row + i % C);
    store_vec<W>(out + i, v);
  }
};

// pre = acc + bias[i % C]; gelu_pre = pre; out = gelu(pre) (acc may alias gelu_pre)
template <class T>
struct BiasGeluF {
  T* out;
  T* gelu_pre;
  const float* acc;
  const T* bias;  // may be null
  int64_t C;
  template <int W>
  __device__ void apply(int64_t i) const {
    float pre[W];
    load_vec<W>(pre, acc + i);
    if (bias) {
      float b[W];
      load_vec<W>(b, bias + i % C);
#pragma unroll
      for (int k = 0; k < W; ++k) pre[k] = pre[k] + b[k];
    }
    store_vec<W>(gelu_pre + i, pre);
#pragma unroll
    for (int k = 0; k < W; ++k) pre[k] = gelu(pre[k]);
    store_vec<W>(out + i, pre);
  }
};

// out[i] += wpe[i % TC] (vectors need TC % W == 0)
template <class T>
struct AddPositionF {
  T* out;
  const T* wpe;
  int64_t TC;
  template <int W>
  __device__ void apply(int64_t i) const {
    float o[W], p[W];
    load_vec<W>(o, out + i);
    load_vec<W>(p, wpe + i % TC);
#pragma unroll
    for (int k = 0; k < W; ++k) o[k] = o[k] + p[k];
    store_vec<W>(out + i, o);
  }
};

// ---------------------------------------------------------------- column sums
// Columns in blocks of 32 (threadIdx.x), rows in chunks (blockIdx.y) walked by blockDim.y threads;
// each block writes K partial sums per column for its chunk, and a second kernel adds the chunks
// in order. f(n, c, v) gives the K values of element (n, c).

constexpr int kColRows = 8;  // blockDim.y of the partial-sum kernel

template <int K, class F>
__global__ void column_partials_kernel(float* partial, int64_t N, int64_t C, int64_t rows_per_chunk, F f) {
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  float acc[K];
  for (int k = 0; k < K; ++k) acc[k] = 0.0f;
  if (c < C) {
    const int64_t n0 = chunk * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
    for (int64_t n = n0 + threadIdx.y; n < n1; n += kColRows) {
      float v[K];
      f(n, c, v);
      for (int k = 0; k < K; ++k) acc[k] += v[k];
    }
  }
  __shared__ float sm[K][kColRows][33];
  for (int k = 0; k < K; ++k) sm[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 0; k < K; ++k) {
      float s = 0.0f;
      for (int y = 0; y < kColRows; ++y) s += sm[k][y][threadIdx.x];
      partial[(chunk * K + k) * C + c] = s;
    }
  }
}

// out_k (C) += sum over chunks of partial (chunks, K, C)
template <int K>
__global__ void column_finish_kernel(float* out0, float* out1, const float* partial, int64_t chunks, int64_t C) {
  TPT_GRID_LOOP(c, C) {
    float s[K];
    for (int k = 0; k < K; ++k) s[k] = 0.0f;
    for (int64_t j = 0; j < chunks; ++j)
      for (int k = 0; k < K; ++k) s[k] += partial[(j * K + k) * C + c];
    out0[c] += s[0];
    if (K > 1) out1[c] += s[K - 1];
  }
}

template <int K, class F>
void column_sums(float* out0, float* out1, int64_t N, int64_t C, F f, DeviceBuffer& scratch, cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  // enough chunks to fill the GPU with blocks, few enough that the finishing pass stays short
  const int64_t col_blocks = (C + 31) / 32;
  int64_t chunks = std::max<int64_t>(1, std::min<int64_t>((N + 63) / 64, std::max<int64_t>(1, 2048 / col_blocks)));
  const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
  float* partial = scratch.as<float>(size_t(chunks * K * C));
  column_partials_kernel<K><<<dim3(unsigned(col_blocks), unsigned(chunks)), dim3(32, kColRows), 0, s>>>(
      partial, N, C, rows_per_chunk, f);
  TPT_CUDA_LAUNCHED();
  column_finish_kernel<K><<<blocks_for(C), kThreads, 0, s>>>(out0, out1, partial, chunks, C);
  TPT_CUDA_LAUNCHED();
}

template <class T>
struct ReadValue {
  const T* x;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float* v) const { v[0] = ld(x, n * C + c); }
};

// (dy * normalized, dy) of element (n, c): LayerNorm's weight and bias gradients
template <class T>
struct LayerNormParamGrads {
  const T *dout, *inp;
  const float *mean, *rstd;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float* v) const {
    const float dy = ld(dout, n * C + c);
    v[0] = dy * ((ld(inp, n * C + c) - mean[n]) * rstd[n]);
    v[1] = dy;
  }
};

// ---------------------------------------------------------------- LayerNorm (a warp per row)
// Lane `lane` handles the W-element groups starting at lane * W, lane * W + 32 W, ... (W > 1 only
// when C % W == 0 and the tensors are 16-byte aligned).

constexpr int kRowsPerBlock = kThreads / 32;

template <class T, int W>
__device__ inline void layernorm_row(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, int64_t n,
                                     int64_t C, float eps, int lane) {
  double s = 0;
  for (int64_t c = int64_t(lane) * W; c < C; c += 32 * W) {
    float v[W];
    load_vec<W>(v, x + c);
#pragma unroll
    for (int k = 0; k < W; ++k) s += v[k];
  }
  s = warp_reduce(s, SumOp{});
  const float m = float(s / double(C));
  double var = 0;
  for (int64_t c = int64_t(lane) * W; c < C; c += 32 * W) {
    float v[W];
    load_vec<W>(v, x + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float d = v[k] - m;
      var += double(d) * d;
    }
  }
  var = warp_reduce(var, SumOp{});
  const float r = float(1.0 / sqrt(var / double(C) + double(eps)));
  for (int64_t c = int64_t(lane) * W; c < C; c += 32 * W) {
    float v[W], wv[W], bv[W];
    load_vec<W>(v, x + c);
    load_vec<W>(wv, w + c);
    load_vec<W>(bv, b + c);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = (v[k] - m) * r * wv[k] + bv[k];
    store_vec<W>(y + c, v);
  }
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

template <class T, int W>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* w, const T* b,
                                         int64_t N, int64_t C, float eps) {
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (n >= N) return;
  layernorm_row<T, W>(out + n * C, mean, rstd, inp + n * C, w, b, n, C, eps, int(threadIdx.x % 32));
}

// res = a + b rounded to T (each lane writes and then rereads only its own elements), then the
// LayerNorm of res as stored. res may alias a.
template <class T, int W>
__global__ void residual_layernorm_forward_kernel(T* res, T* out, float* mean, float* rstd, const T* a, const T* b,
                                                  const T* w, const T* bias, int64_t N, int64_t C, float eps) {
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (n >= N) return;
  T* r = res + n * C;
  for (int64_t c = int64_t(lane) * W; c < C; c += 32 * W) {
    float x[W], y[W];
    load_vec<W>(x, a + n * C + c);
    load_vec<W>(y, b + n * C + c);
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] = x[k] + y[k];
    store_vec<W>(r + c, x);
  }
  layernorm_row<T, W>(out + n * C, mean, rstd, r, w, bias, n, C, eps, lane);
}

template <class T, int W>
__global__ void layernorm_backward_input_kernel(T* dinp, const T* dout, const T* inp, const T* w, const float* mean,
                                                const float* rstd, int64_t N, int64_t C) {
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const T* x = inp + n * C;
  const T* dy = dout + n * C;
  const float m = mean[n], r = rstd[n];
  double sum_dn = 0, sum_dn_n = 0;
  for (int64_t c = int64_t(lane) * W; c < C; c += 32 * W) {
    float xv[W], dyv[W], wv[W];
    load_vec<W>(xv, x + c);
    load_vec<W>(dyv, dy + c);
    load_vec<W>(wv, w + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float nc = (xv[k] - m) * r;
      const float dn = dyv[k] * wv[k];
      sum_dn += dn;
      sum_dn_n += double(dn) * nc;
    }
  }
  sum_dn = warp_reduce(sum_dn, SumOp{});
  sum_dn_n = warp_reduce(sum_dn_n, SumOp{});
  const float mean_dn = float(sum_dn / double(C)), mean_dn_n = float(sum_dn_n / double(C));
  T* dx = dinp + n * C;
  for (int64_t c = int64_t(lane) * W; c < C; c += 32 * W) {
    float xv[W], dyv[W], wv[W], dxv[W];
    load_vec<W>(xv, x + c);
    load_vec<W>(dyv, dy + c);
    load_vec<W>(wv, w + c);
    load_vec<W>(dxv, dx + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float nc = (xv[k] - m) * r;
      const float dn = dyv[k] * wv[k];
      dxv[k] += (dn - mean_dn - nc * mean_dn_n) * r;
    }
    store_vec<W>(dx + c, dxv);
  }
}

// ---------------------------------------------------------------- embeddings

// Row copies in units U (16, 4 or 2 bytes): `units` per row.
template <class U>
__global__ void embedding_forward_kernel(U* out, const int32_t* tokens, const U* wte, int64_t N, int64_t units,
                                         int64_t v0, int64_t rows) {
  TPT_GRID_LOOP(i, N * units) {
    const int64_t n = i / units, u = i - n * units;
    const int64_t r = int64_t(tokens[n]) - v0;
    out[i] = (r >= 0 && r < rows) ? wte[r * units + u] : U{};
  }
}

// keys (N): local row of each position's token, `rows` when outside the shard; vals: the position.
__global__ void embedding_keys_kernel(uint32_t* keys, uint32_t* vals, const int32_t* tokens, int64_t N, int64_t v0,
                                      int64_t rows) {
  TPT_GRID_LOOP(n, N) {
    const int64_t r = int64_t(tokens[n]) - v0;
    keys[n] = uint32_t((r >= 0 && r < rows) ? r : rows);
    vals[n] = uint32_t(n);
  }
}

// Thread (p, c): if sorted position p starts a run of one row, adds that run's gradients (in
// position order) into the row.
template <class T>
__global__ void embedding_segments_kernel(float* dwte, const uint32_t* keys, const uint32_t* pos, const T* dout,
                                          int64_t N, int64_t C, int64_t rows) {
  TPT_GRID_LOOP(i, N * C) {
    const int64_t p = i / C, c = i - p * C;
    const uint32_t key = keys[p];
    if (key >= uint32_t(rows) || (p > 0 && keys[p - 1] == key)) continue;
    float acc = dwte[int64_t(key) * C + c];
    for (int64_t q = p; q < N && keys[q] == key; ++q) acc += ld(dout, int64_t(pos[q]) * C + c);
    dwte[int64_t(key) * C + c] = acc;
  }
}

template <class T>
__global__ void position_backward_kernel(float* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C) {
  const int64_t TC = T_ * C;
  TPT_GRID_LOOP(i, TC) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) acc += ld(dout, b * TC + i);
    dwpe[i] = acc;
  }
}

// ---------------------------------------------------------------- cross-entropy (a block per row)
// Each thread reads W-element groups of its row (W > 1 when the row is 16-byte aligned and Vl % W
// == 0), then the rest one by one.

constexpr int kXentThreads = 512;

__host__ __device__ inline int64_t valid_columns(int64_t valid_vocab, int64_t v0, int64_t Vl) {
  const int64_t k = valid_vocab - v0;
  return k < 0 ? 0 : (k > Vl ? Vl : k);
}

template <class T, int W>
__global__ void xent_max_kernel(float* row_max, float* target_logit, const T* logits, const int32_t* targets,
                                int64_t Vl, int64_t v0, int64_t nvalid) {
  const int64_t n = blockIdx.x;
  const T* l = logits + n * Vl;
  float mx = -INFINITY;
  const int64_t nv = nvalid / W * W;
  for (int64_t j = int64_t(threadIdx.x) * W; j < nv; j += int64_t(blockDim.x) * W) {
    float v[W];
    load_vec<W>(v, l + j);
#pragma unroll
    for (int k = 0; k < W; ++k) mx = fmaxf(mx, v[k]);
  }
  for (int64_t j = nv + threadIdx.x; j < nvalid; j += blockDim.x) mx = fmaxf(mx, ld(l, j));
  mx = block_reduce(mx, MaxOp{}, -INFINITY);
  if (threadIdx.x == 0) {
    row_max[n] = mx;
    const int64_t j = int64_t(targets[n]) - v0;
    target_logit[n] = (j >= 0 && j < nvalid) ? ld(l, j) : 0.0f;
  }
}

template <class T, int W>
__global__ void xent_sumexp_kernel(float* sum_exp, const T* logits, const float* row_max, int64_t Vl,
                                   int64_t nvalid) {
  const int64_t n = blockIdx.x;
  const T* l = logits + n * Vl;
  const float mx = row_max[n];
  double s = 0.0;  // in double, as the CPU backend: both then agree with a double-precision sum
  const int64_t nv = nvalid / W * W;
  for (int64_t j = int64_t(threadIdx.x) * W; j < nv; j += int64_t(blockDim.x) * W) {
    float v[W];
    load_vec<W>(v, l + j);
#pragma unroll
    for (int k = 0; k < W; ++k) s += double(fast_exp(v[k] - mx));
  }
  for (int64_t j = nv + threadIdx.x; j < nvalid; j += blockDim.x) s += double(fast_exp(ld(l, j) - mx));
  s = block_reduce(s, SumOp{}, 0.0);
  if (threadIdx.x == 0) sum_exp[n] = float(s);
}

// dlogits of one element: (softmax - onehot) * dloss_scale, 0 on padding
__device__ inline float xent_dlogit(float l, int64_t j, float mx, float inv, int64_t nvalid, int64_t target_col,
                                    float dloss_scale) {
  if (j >= nvalid) return 0.0f;
  float v = fast_exp(l - mx) * inv;
  if (j == target_col) v -= dloss_scale;
  return v;
}

template <class T, int W>
__global__ void xent_loss_grad_kernel(T* logits, float* losses, const float* row_max, const float* sum_exp,
                                      const float* target_logit, const int32_t* targets, int64_t Vl, int64_t v0,
                                      int64_t nvalid, float dloss_scale_all, bool want_grad,
                                      const float* row_weight) {
  const int64_t n = blockIdx.x;
  const float se = sum_exp[n], mx = row_max[n];
  const float w = row_weight ? row_weight[n] : 1.0f;  // data.eod_mask_loss: 0 drops the row
  const float dloss_scale = dloss_scale_all * w;
  if (threadIdx.x == 0) losses[n] = w == 0.0f ? 0.0f : w * (logf(se) + mx - target_logit[n]);
  if (!want_grad) return;
  T* l = logits + n * Vl;
  const float inv = dloss_scale / se;
  const int64_t t = int64_t(targets[n]) - v0;
  const int64_t target_col = (t >= 0 && t < nvalid) ? t : -1;
  const int64_t nv = Vl / W * W;
  for (int64_t j = int64_t(threadIdx.x) * W; j < nv; j += int64_t(blockDim.x) * W) {
    float v[W];
    load_vec<W>(v, l + j);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = xent_dlogit(v[k], j + k, mx, inv, nvalid, target_col, dloss_scale);
    store_vec<W>(l + j, v);
  }
  for (int64_t j = nv + threadIdx.x; j < Vl; j += blockDim.x)
    st(l, j, xent_dlogit(ld(l, j), j, mx, inv, nvalid, target_col, dloss_scale));
}

// ---------------------------------------------------------------- reductions

constexpr int kReduceBlocks = 1024;

__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  double s = 0;
  TPT_GRID_LOOP(i, n) s += double(x[i]) * x[i];
  s = block_reduce(s, SumOp{}, 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double* out, const double* partial, int count) {
  double s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_reduce(s, SumOp{}, 0.0);
  if (threadIdx.x == 0) *out = s;
}

__global__ void nonfinite_kernel(int* flag, const float* x, int64_t n) {
  bool bad = false;
  TPT_GRID_LOOP(i, n) bad |= !isfinite(x[i]);
  if (bad) *flag = 1;  // every writer stores the same value
}

void check_same(DType a, DType b, const char* what) {
  if (a != b) internal_error(std::string("CUDA kernel ") + what + ": operands of different dtypes");
}

}  // namespace

// ---------------------------------------------------------------- launchers

void gelu_forward(Buf out, CBuf inp, int64_t n, cudaStream_t s) {
  check_same(out.t, inp.t, "gelu_forward");
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    const GeluForwardF<T> f{typed<T>(out), typed<T>(inp)};
    launch_elementwise<W>(n, all_aligned<W>(f.out, f.inp), f, s);
  });
}

void gelu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t n, cudaStream_t s) {
  check_same(dinp.t, inp.t, "gelu_backward");
  TPT_CHECK(dout.t == dinp.t || dout.t == DType::F32);
  dispatch(dinp.t, [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto dtag) {
      using TD = decltype(dtag);
      constexpr int W = vec_width<T, TD>();
      const GeluBackwardF<T, TD> f{typed<T>(dinp), typed<TD>(dout), typed<T>(inp)};
      launch_elementwise<W>(n, all_aligned<W>(f.dinp, f.dout, f.inp), f, s);
    };
    if (dout.t == DType::F32) run(float{});
    else run(T{});
  });
}

void add(Buf out, CBuf a, CBuf b, int64_t n, cudaStream_t s) {
  check_same(out.t, a.t, "add");
  check_same(out.t, b.t, "add");
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    const AddF<T> f{typed<T>(out), typed<T>(a), typed<T>(b)};
    launch_elementwise<W>(n, all_aligned<W>(f.out, f.a, f.b), f, s);
  });
}

void accumulate(Buf y, CBuf x, int64_t n, cudaStream_t s) {
  check_same(y.t, x.t, "accumulate");
  dispatch(y.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    const AddF<T> f{typed<T>(y), typed<T>(y), typed<T>(x)};  // y = y + x, each element by one thread
    launch_elementwise<W>(n, all_aligned<W>(f.out, f.b), f, s);
  });
}

void sum_parts(Buf out, CBuf parts, int k, int64_t n, cudaStream_t s) {
  check_same(out.t, parts.t, "sum_parts");
  TPT_CHECK(k >= 1);
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    const SumPartsF<T> f{typed<T>(out), typed<T>(parts), k, n};
    launch_elementwise<W>(n, all_aligned<W>(f.out, f.parts) && n % W == 0, f, s);
  });
}

void scale(float* x, float a, int64_t n, cudaStream_t s) {
  const ScaleF f{x, a};
  launch_elementwise<4>(n, all_aligned<4>(x), f, s);
}

void convert(Buf dst, CBuf src, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (dst.t == src.t) {
    if (dst.p != src.p)
      TPT_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, size_t(dtype_size(n, dst.t)), cudaMemcpyDeviceToDevice, s));
    return;
  }
  dispatch(dst.t, [&](auto dtag) {
    using TD = decltype(dtag);
    dispatch(src.t, [&](auto stag) {
      using TS = decltype(stag);
      constexpr int W = vec_width<TD, TS>();
      const ConvertF<TD, TS> f{typed<TD>(dst), typed<TS>(src)};
      launch_elementwise<W>(n, all_aligned<W>(f.dst, f.src), f, s);
    });
  });
}

void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a, bool decay, Buf compute,
           cudaStream_t s) {
  dispatch(compute.t, [&](auto tag) {
    using T = decltype(tag);
    const AdamWF<T> f{p, m, v, g, typed<T>(compute), a, decay};
    launch_elementwise<4>(n, all_aligned<4>(p, m, v, g, f.compute), f, s);
  });
}

void broadcast_rows(Buf out, CBuf row, int64_t N, int64_t C, cudaStream_t s) {
  check_same(out.t, row.t, "broadcast_rows");
  if (N <= 0 || C <= 0) return;
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    const BroadcastRowsF<T> f{typed<T>(out), typed<T>(row), C};
    launch_elementwise<W>(N * C, all_aligned<W>(f.out, f.row) && C % W == 0, f, s);
  });
}

void bias_gelu_forward(Buf out, Buf gelu_pre, const float* acc, CBuf bias, int64_t N, int64_t C, cudaStream_t s) {
  check_same(out.t, gelu_pre.t, "bias_gelu_forward");
  if (bias) check_same(out.t, bias.t, "bias_gelu_forward");
  if (N <= 0 || C <= 0) return;
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = 4;  // the fp32 products set the width
    const BiasGeluF<T> f{typed<T>(out), typed<T>(gelu_pre), acc, typed<T>(bias), C};
    launch_elementwise<W>(N * C, all_aligned<W>(f.out, f.gelu_pre, f.acc, f.bias) && C % W == 0, f, s);
  });
}

void add_column_sums(float* out, CBuf x, int64_t N, int64_t C, DeviceBuffer& scratch, cudaStream_t s) {
  dispatch(x.t, [&](auto tag) {
    using T = decltype(tag);
    column_sums<1>(out, nullptr, N, C, ReadValue<T>{typed<T>(x), C}, scratch, s);
  });
}

namespace {
unsigned row_blocks(int64_t N) { return unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock); }
}  // namespace

void layernorm_forward(Buf out, float* mean, float* rstd, CBuf inp, CBuf w, CBuf b, int64_t N, int64_t C, float eps,
                       cudaStream_t s) {
  check_same(out.t, inp.t, "layernorm_forward");
  check_same(out.t, w.t, "layernorm_forward");
  check_same(out.t, b.t, "layernorm_forward");
  if (N <= 0 || C <= 0) return;
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    T* o = typed<T>(out);
    const T *x = typed<T>(inp), *wp = typed<T>(w), *bp = typed<T>(b);
    if (C % W == 0 && all_aligned<W>(o, x, wp, bp))
      layernorm_forward_kernel<T, W><<<row_blocks(N), kThreads, 0, s>>>(o, mean, rstd, x, wp, bp, N, C, eps);
    else
      layernorm_forward_kernel<T, 1><<<row_blocks(N), kThreads, 0, s>>>(o, mean, rstd, x, wp, bp, N, C, eps);
    TPT_CUDA_LAUNCHED();
  });
}

void residual_layernorm_forward(Buf res, Buf out, float* mean, float* rstd, CBuf a, CBuf b, CBuf w, CBuf bias,
                                int64_t N, int64_t C, float eps, cudaStream_t s) {
  for (DType t : {out.t, a.t, b.t, w.t, bias.t}) check_same(res.t, t, "residual_layernorm_forward");
  if (N <= 0 || C <= 0) return;
  dispatch(res.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    T *r = typed<T>(res), *o = typed<T>(out);
    const T *ap = typed<T>(a), *bp = typed<T>(b), *wp = typed<T>(w), *biasp = typed<T>(bias);
    if (C % W == 0 && all_aligned<W>(r, o, ap, bp, wp, biasp))
      residual_layernorm_forward_kernel<T, W>
          <<<row_blocks(N), kThreads, 0, s>>>(r, o, mean, rstd, ap, bp, wp, biasp, N, C, eps);
    else
      residual_layernorm_forward_kernel<T, 1>
          <<<row_blocks(N), kThreads, 0, s>>>(r, o, mean, rstd, ap, bp, wp, biasp, N, C, eps);
    TPT_CUDA_LAUNCHED();
  });
}

void layernorm_backward(Buf dinp, float* dw, float* db, CBuf dout, CBuf inp, CBuf w, const float* mean,
                        const float* rstd, int64_t N, int64_t C, DeviceBuffer& scratch, cudaStream_t s) {
  for (DType t : {dout.t, inp.t, w.t}) check_same(dinp.t, t, "layernorm_backward");
  if (N <= 0 || C <= 0) return;
  dispatch(dinp.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    T* dx = typed<T>(dinp);
    const T *dy = typed<T>(dout), *x = typed<T>(inp), *wp = typed<T>(w);
    if (C % W == 0 && all_aligned<W>(dx, dy, x, wp))
      layernorm_backward_input_kernel<T, W><<<row_blocks(N), kThreads, 0, s>>>(dx, dy, x, wp, mean, rstd, N, C);
    else
      layernorm_backward_input_kernel<T, 1><<<row_blocks(N), kThreads, 0, s>>>(dx, dy, x, wp, mean, rstd, N, C);
    TPT_CUDA_LAUNCHED();
    column_sums<2>(dw, db, N, C, LayerNormParamGrads<T>{dy, x, mean, rstd, C}, scratch, s);
  });
}

void embedding_forward(Buf out, const int32_t* tokens, CBuf wte, int64_t N, int64_t C, int64_t v0, int64_t rows,
                       cudaStream_t s) {
  check_same(out.t, wte.t, "embedding_forward");
  if (N <= 0 || C <= 0) return;
  const int64_t row_bytes = dtype_size(C, out.t);
  auto run = [&](auto unit) {
    using U = decltype(unit);
    const int64_t units = row_bytes / int64_t(sizeof(U));
    embedding_forward_kernel<U><<<blocks_for(N * units), kThreads, 0, s>>>(
        static_cast<U*>(out.p), tokens, static_cast<const U*>(wte.p), N, units, v0, rows);
    TPT_CUDA_LAUNCHED();
  };
  if (row_bytes % 16 == 0 && is_aligned(out.p, 16) && is_aligned(wte.p, 16)) run(uint4{});
  else if (row_bytes % 4 == 0 && is_aligned(out.p, 4) && is_aligned(wte.p, 4)) run(uint32_t{});
  else run(uint16_t{});
}

void embedding_backward(float* dwte, const int32_t* tokens, CBuf dout, int64_t N, int64_t C, int64_t v0,
                        int64_t rows, DeviceBuffer& scratch, cudaStream_t s) {
  if (N <= 0 || C <= 0 || rows <= 0) return;
  TPT_CHECK(N < (int64_t(1) << 31) && rows < (int64_t(1) << 31));
  int end_bit = 1;  // bits of the largest key, the out-of-shard marker `rows`
  while (end_bit < 32 && (uint64_t(rows) >> end_bit) != 0) ++end_bit;
  size_t temp_bytes = 0;
  TPT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), int(N), 0, end_bit, s));
  const size_t arr = (size_t(N) * sizeof(uint32_t) + 255) / 256 * 256;
  char* base = scratch.as<char>(4 * arr + temp_bytes);
  auto* keys_in = reinterpret_cast<uint32_t*>(base);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + arr);
  auto* vals_in = reinterpret_cast<uint32_t*>(base + 2 * arr);
  auto* vals_out = reinterpret_cast<uint32_t*>(base + 3 * arr);
  embedding_keys_kernel<<<blocks_for(N), kThreads, 0, s>>>(keys_in, vals_in, tokens, N, v0, rows);
  TPT_CUDA_LAUNCHED();
  TPT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 4 * arr, temp_bytes, keys_in, keys_out, vals_in, vals_out,
                                                 int(N), 0, end_bit, s));
  dispatch(dout.t, [&](auto tag) {
    using T = decltype(tag);
    embedding_segments_kernel<T>
        <<<blocks_for(N * C), kThreads, 0, s>>>(dwte, keys_out, vals_out, typed<T>(dout), N, C, rows);
    TPT_CUDA_LAUNCHED();
  });
}

void add_position_embedding(Buf out, CBuf wpe, int64_t B, int64_t T_, int64_t C, cudaStream_t s) {
  check_same(out.t, wpe.t, "add_position_embedding");
  if (B <= 0 || T_ * C <= 0) return;
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    const AddPositionF<T> f{typed<T>(out), typed<T>(wpe), T_ * C};
    launch_elementwise<W>(B * T_ * C, all_aligned<W>(f.out, f.wpe) && (T_ * C) % W == 0, f, s);
  });
}

void position_embedding_backward(float* dwpe, CBuf dout, int64_t B, int64_t T_, int64_t C, cudaStream_t s) {
  if (T_ * C <= 0) return;
  dispatch(dout.t, [&](auto tag) {
    using T = decltype(tag);
    position_backward_kernel<T><<<blocks_for(T_ * C), kThreads, 0, s>>>(dwpe, typed<T>(dout), B, T_, C);
    TPT_CUDA_LAUNCHED();
  });
}

void xent_local_max(float* row_max, float* target_logit, CBuf logits, const int32_t* targets, int64_t N,
                    int64_t Vl, int64_t v0, int64_t valid_vocab, cudaStream_t s) {
  if (N <= 0) return;
  TPT_CHECK(N <= int64_t(INT32_MAX));
  const int64_t nvalid = valid_columns(valid_vocab, v0, Vl);
  dispatch(logits.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    const T* l = typed<T>(logits);
    if (Vl % W == 0 && is_aligned(l, 16))
      xent_max_kernel<T, W><<<unsigned(N), kXentThreads, 0, s>>>(row_max, target_logit, l, targets, Vl, v0, nvalid);
    else
      xent_max_kernel<T, 1><<<unsigned(N), kXentThreads, 0, s>>>(row_max, target_logit, l, targets, Vl, v0, nvalid);
    TPT_CUDA_LAUNCHED();
  });
}

void xent_local_sumexp(float* sum_exp, CBuf logits, const float* row_max, int64_t N, int64_t Vl, int64_t v0,
                       int64_t valid_vocab, cudaStream_t s) {
  if (N <= 0) return;
  TPT_CHECK(N <= int64_t(INT32_MAX));
  const int64_t nvalid = valid_columns(valid_vocab, v0, Vl);
  dispatch(logits.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    const T* l = typed<T>(logits);
    if (Vl % W == 0 && is_aligned(l, 16))
      xent_sumexp_kernel<T, W><<<unsigned(N), kXentThreads, 0, s>>>(sum_exp, l, row_max, Vl, nvalid);
    else
      xent_sumexp_kernel<T, 1><<<unsigned(N), kXentThreads, 0, s>>>(sum_exp, l, row_max, Vl, nvalid);
    TPT_CUDA_LAUNCHED();
  });
}

void xent_loss_grad(Buf logits, float* losses, const float* row_max, const float* sum_exp,
                    const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                    int64_t valid_vocab, float dloss_scale, bool want_grad, const float* row_weight,
                    cudaStream_t s) {
  if (N <= 0) return;
  TPT_CHECK(N <= int64_t(INT32_MAX));
  const int64_t nvalid = valid_columns(valid_vocab, v0, Vl);
  const unsigned threads = want_grad ? kXentThreads : 32;
  dispatch(logits.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    T* l = typed<T>(logits);
    if (Vl % W == 0 && is_aligned(l, 16))
      xent_loss_grad_kernel<T, W><<<unsigned(N), threads, 0, s>>>(l, losses, row_max, sum_exp, target_logit, targets,
                                                                  Vl, v0, nvalid, dloss_scale, want_grad, row_weight);
    else
      xent_loss_grad_kernel<T, 1><<<unsigned(N), threads, 0, s>>>(l, losses, row_max, sum_exp, target_logit, targets,
                                                                  Vl, v0, nvalid, dloss_scale, want_grad, row_weight);
    TPT_CUDA_LAUNCHED();
  });
}

double sum_squares(const float* x, int64_t n, DeviceBuffer& scratch, double* pinned, cudaStream_t s) {
  if (n <= 0) return 0.0;
  const unsigned blocks = std::min<unsigned>(blocks_for(n), kReduceBlocks);
  double* partial = scratch.as<double>(blocks + 1);
  sum_squares_partial_kernel<<<blocks, kThreads, 0, s>>>(partial + 1, x, n);
  TPT_CUDA_LAUNCHED();
  sum_partials_kernel<<<1, 1024, 0, s>>>(partial, partial + 1, int(blocks));
  TPT_CUDA_LAUNCHED();
  TPT_CUDA_CHECK(cudaMemcpyAsync(pinned, partial, sizeof(double), cudaMemcpyDeviceToHost, s));
  stream_wait(s);
  return *pinned;
}

bool has_nonfinite(const float* x, int64_t n, DeviceBuffer& scratch, int* pinned, cudaStream_t s) {
  if (n <= 0) return false;
  int* flag = scratch.as<int>(1);
  TPT_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), s));
  nonfinite_kernel<<<std::min<unsigned>(blocks_for(n), 4 * kReduceBlocks), kThreads, 0, s>>>(flag, x, n);
  TPT_CUDA_LAUNCHED();
  TPT_CUDA_CHECK(cudaMemcpyAsync(pinned, flag, sizeof(int), cudaMemcpyDeviceToHost, s));
  stream_wait(s);
  return *pinned != 0;
}

}  // namespace tpt::cuda
