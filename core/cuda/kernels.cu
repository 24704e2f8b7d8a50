// The CUDA backend's kernels other than GEMMs and attention: element-wise maps over the shared
// per-element math (core/math.h, core/dtype.h), LayerNorm, embeddings, the vocab-parallel
// cross-entropy steps and the reductions. Row reductions accumulate like the CPU backend (double
// where it uses double); column reductions go through fixed-order partial sums, never atomics, so
// every result is deterministic.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"

namespace tpt::cuda {
namespace {

// ---------------------------------------------------------------- element-wise

__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  TPT_GRID_LOOP(i, n) out[i] = gelu(inp[i]);
}
__global__ void gelu_backward_kernel(float* dinp, const float* dout, const float* inp, int64_t n) {
  TPT_GRID_LOOP(i, n) dinp[i] = dout[i] * gelu_grad(inp[i]);
}
__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  TPT_GRID_LOOP(i, n) out[i] = a[i] + b[i];
}
__global__ void accumulate_kernel(float* y, const float* x, int64_t n) {
  TPT_GRID_LOOP(i, n) y[i] += x[i];
}
__global__ void scale_kernel(float* x, float a, int64_t n) {
  TPT_GRID_LOOP(i, n) x[i] *= a;
}
__global__ void round_kernel(float* x, int64_t n, DType t) {
  TPT_GRID_LOOP(i, n) x[i] = tpt::round_to(x[i], t);
}
__global__ void pack_kernel(uint16_t* dst, const float* src, int64_t n, DType t) {
  TPT_GRID_LOOP(i, n) dst[i] = t == DType::BF16 ? fp32_to_bf16(src[i]) : fp32_to_fp16(src[i]);
}
__global__ void unpack_kernel(float* dst, const uint16_t* src, int64_t n, DType t) {
  TPT_GRID_LOOP(i, n) dst[i] = t == DType::BF16 ? bf16_to_fp32(src[i]) : fp16_to_fp32(src[i]);
}
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamWParams a, bool decay,
                             float* compute, DType t) {
  TPT_GRID_LOOP(i, n) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_update(pi, g[i], mi, vi, a, decay);
    p[i] = pi;
    if (compute) compute[i] = tpt::round_to(pi, t);
    m[i] = mi;
    v[i] = vi;
  }
}
__global__ void broadcast_rows_kernel(float* out, const float* row, int64_t N, int64_t C) {
  TPT_GRID_LOOP(i, N * C) out[i] = row[i % C];
}

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

struct ReadValue {
  const float* x;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float* v) const { v[0] = x[n * C + c]; }
};

// (dy * normalized, dy) of element (n, c): LayerNorm's weight and bias gradients
struct LayerNormParamGrads {
  const float *dout, *inp, *mean, *rstd;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float* v) const {
    const float dy = dout[n * C + c];
    v[0] = dy * ((inp[n * C + c] - mean[n]) * rstd[n]);
    v[1] = dy;
  }
};

// ---------------------------------------------------------------- LayerNorm (a warp per row)

constexpr int kRowsPerBlock = kThreads / 32;

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, int64_t N, int64_t C, float eps) {
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const float* x = inp + n * C;
  double s = 0;
  for (int64_t c = lane; c < C; c += 32) s += x[c];
  s = warp_reduce(s, SumOp{});
  const float m = float(s / double(C));
  double v = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    v += double(d) * d;
  }
  v = warp_reduce(v, SumOp{});
  const float r = float(1.0 / sqrt(v / double(C) + double(eps)));
  float* y = out + n * C;
  for (int64_t c = lane; c < C; c += 32) y[c] = (x[c] - m) * r * w[c] + b[c];
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                                const float* mean, const float* rstd, int64_t N, int64_t C) {
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const float* x = inp + n * C;
  const float* dy = dout + n * C;
  const float m = mean[n], r = rstd[n];
  double sum_dn = 0, sum_dn_n = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float nc = (x[c] - m) * r;
    const float dn = dy[c] * w[c];
    sum_dn += dn;
    sum_dn_n += double(dn) * nc;
  }
  sum_dn = warp_reduce(sum_dn, SumOp{});
  sum_dn_n = warp_reduce(sum_dn_n, SumOp{});
  const float mean_dn = float(sum_dn / double(C)), mean_dn_n = float(sum_dn_n / double(C));
  float* dx = dinp + n * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float nc = (x[c] - m) * r;
    const float dn = dy[c] * w[c];
    dx[c] += (dn - mean_dn - nc * mean_dn_n) * r;
  }
}

// ---------------------------------------------------------------- embeddings

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte, int64_t N, int64_t C,
                                         int64_t v0, int64_t rows) {
  TPT_GRID_LOOP(i, N * C) {
    const int64_t n = i / C, c = i - n * C;
    const int64_t r = int64_t(tokens[n]) - v0;
    out[i] = (r >= 0 && r < rows) ? wte[r * C + c] : 0.0f;
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
__global__ void embedding_segments_kernel(float* dwte, const uint32_t* keys, const uint32_t* pos, const float* dout,
                                          int64_t N, int64_t C, int64_t rows) {
  TPT_GRID_LOOP(i, N * C) {
    const int64_t p = i / C, c = i - p * C;
    const uint32_t key = keys[p];
    if (key >= uint32_t(rows) || (p > 0 && keys[p - 1] == key)) continue;
    float acc = dwte[int64_t(key) * C + c];
    for (int64_t q = p; q < N && keys[q] == key; ++q) acc += dout[int64_t(pos[q]) * C + c];
    dwte[int64_t(key) * C + c] = acc;
  }
}

__global__ void add_position_kernel(float* out, const float* wpe, int64_t B, int64_t T, int64_t C) {
  const int64_t TC = T * C;
  TPT_GRID_LOOP(i, B * TC) out[i] += wpe[i % TC];
}

__global__ void position_backward_kernel(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C) {
  const int64_t TC = T * C;
  TPT_GRID_LOOP(i, TC) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) acc += dout[b * TC + i];
    dwpe[i] = acc;
  }
}

// ---------------------------------------------------------------- cross-entropy (a block per row)

constexpr int kXentThreads = 512;

__host__ __device__ inline int64_t valid_columns(int64_t valid_vocab, int64_t v0, int64_t Vl) {
  const int64_t k = valid_vocab - v0;
  return k < 0 ? 0 : (k > Vl ? Vl : k);
}

__global__ void xent_max_kernel(float* row_max, float* target_logit, const float* logits, const int32_t* targets,
                                int64_t Vl, int64_t v0, int64_t nvalid) {
  const int64_t n = blockIdx.x;
  const float* l = logits + n * Vl;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < nvalid; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = block_reduce(mx, MaxOp{}, -INFINITY);
  if (threadIdx.x == 0) {
    row_max[n] = mx;
    const int64_t j = int64_t(targets[n]) - v0;
    target_logit[n] = (j >= 0 && j < nvalid) ? l[j] : 0.0f;
  }
}

__global__ void xent_sumexp_kernel(float* sum_exp, float* logits, const float* row_max, int64_t Vl, int64_t nvalid) {
  const int64_t n = blockIdx.x;
  float* l = logits + n * Vl;
  const float mx = row_max[n];
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < nvalid; j += blockDim.x) {
    const float e = fast_exp(l[j] - mx);
    l[j] = e;
    s += e;
  }
  for (int64_t j = nvalid + threadIdx.x; j < Vl; j += blockDim.x) l[j] = 0.0f;
  s = block_reduce(s, SumOp{}, 0.0f);
  if (threadIdx.x == 0) sum_exp[n] = s;
}

__global__ void xent_backward_kernel(float* exps, float* losses, const float* row_max, const float* sum_exp,
                                     const float* target_logit, const int32_t* targets, int64_t Vl, int64_t v0,
                                     int64_t nvalid, float dloss_scale, bool want_grad) {
  const int64_t n = blockIdx.x;
  const float se = sum_exp[n];
  if (threadIdx.x == 0) losses[n] = logf(se) + row_max[n] - target_logit[n];
  if (!want_grad) return;
  float* l = exps + n * Vl;
  const float inv = dloss_scale / se;
  const int64_t t = int64_t(targets[n]) - v0;
  const int64_t target_col = (t >= 0 && t < nvalid) ? t : -1;
  for (int64_t j = threadIdx.x; j < Vl; j += blockDim.x) {
    float v = l[j] * inv;  // padding stays 0
    if (j == target_col) v -= dloss_scale;
    l[j] = v;
  }
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

}  // namespace

// ---------------------------------------------------------------- launchers

void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  gelu_forward_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, inp, n);
  TPT_CUDA_LAUNCHED();
}
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, s>>>(dinp, dout, inp, n);
  TPT_CUDA_LAUNCHED();
}
void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, a, b, n);
  TPT_CUDA_LAUNCHED();
}
void accumulate(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  accumulate_kernel<<<blocks_for(n), kThreads, 0, s>>>(y, x, n);
  TPT_CUDA_LAUNCHED();
}
void scale(float* x, float a, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, a, n);
  TPT_CUDA_LAUNCHED();
}
void round_to(float* x, int64_t n, DType t, cudaStream_t s) {
  if (n <= 0 || t == DType::F32) return;
  round_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, t);
  TPT_CUDA_LAUNCHED();
}
void pack_half(uint16_t* dst, const float* src, int64_t n, DType t, cudaStream_t s) {
  if (n <= 0) return;
  pack_kernel<<<blocks_for(n), kThreads, 0, s>>>(dst, src, n, t);
  TPT_CUDA_LAUNCHED();
}
void unpack_half(float* dst, const uint16_t* src, int64_t n, DType t, cudaStream_t s) {
  if (n <= 0) return;
  unpack_kernel<<<blocks_for(n), kThreads, 0, s>>>(dst, src, n, t);
  TPT_CUDA_LAUNCHED();
}
void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a, bool decay,
           float* compute, DType t, cudaStream_t s) {
  if (n <= 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, s>>>(p, g, m, v, n, a, decay, compute, t);
  TPT_CUDA_LAUNCHED();
}
void broadcast_rows(float* out, const float* row, int64_t N, int64_t C, cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  broadcast_rows_kernel<<<blocks_for(N * C), kThreads, 0, s>>>(out, row, N, C);
  TPT_CUDA_LAUNCHED();
}
void add_column_sums(float* out, const float* x, int64_t N, int64_t C, DeviceBuffer& scratch, cudaStream_t s) {
  column_sums<1>(out, nullptr, N, C, ReadValue{x, C}, scratch, s);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int64_t N, int64_t C, float eps, cudaStream_t s) {
  if (N <= 0) return;
  layernorm_forward_kernel<<<unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, s>>>(
      out, mean, rstd, inp, w, b, N, C, eps);
  TPT_CUDA_LAUNCHED();
}
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C, DeviceBuffer& scratch,
                        cudaStream_t s) {
  if (N <= 0) return;
  layernorm_backward_input_kernel<<<unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, s>>>(
      dinp, dout, inp, w, mean, rstd, N, C);
  TPT_CUDA_LAUNCHED();
  column_sums<2>(dw, db, N, C, LayerNormParamGrads{dout, inp, mean, rstd, C}, scratch, s);
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N, int64_t C, int64_t v0,
                       int64_t rows, cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  embedding_forward_kernel<<<blocks_for(N * C), kThreads, 0, s>>>(out, tokens, wte, N, C, v0, rows);
  TPT_CUDA_LAUNCHED();
}

void embedding_backward(float* dwte, const int32_t* tokens, const float* dout, int64_t N, int64_t C, int64_t v0,
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
  embedding_segments_kernel<<<blocks_for(N * C), kThreads, 0, s>>>(dwte, keys_out, vals_out, dout, N, C, rows);
  TPT_CUDA_LAUNCHED();
}

void add_position_embedding(float* out, const float* wpe, int64_t B, int64_t T, int64_t C, cudaStream_t s) {
  if (B * T * C <= 0) return;
  add_position_kernel<<<blocks_for(B * T * C), kThreads, 0, s>>>(out, wpe, B, T, C);
  TPT_CUDA_LAUNCHED();
}
void position_embedding_backward(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C, cudaStream_t s) {
  if (T * C <= 0) return;
  position_backward_kernel<<<blocks_for(T * C), kThreads, 0, s>>>(dwpe, dout, B, T, C);
  TPT_CUDA_LAUNCHED();
}

void xent_local_max(float* row_max, float* target_logit, const float* logits, const int32_t* targets, int64_t N,
                    int64_t Vl, int64_t v0, int64_t valid_vocab, cudaStream_t s) {
  if (N <= 0) return;
  xent_max_kernel<<<unsigned(N), kXentThreads, 0, s>>>(row_max, target_logit, logits, targets, Vl, v0,
                                                      valid_columns(valid_vocab, v0, Vl));
  TPT_CUDA_LAUNCHED();
}
void xent_local_sumexp(float* sum_exp, float* logits, const float* row_max, int64_t N, int64_t Vl, int64_t v0,
                       int64_t valid_vocab, cudaStream_t s) {
  if (N <= 0) return;
  xent_sumexp_kernel<<<unsigned(N), kXentThreads, 0, s>>>(sum_exp, logits, row_max, Vl,
                                                         valid_columns(valid_vocab, v0, Vl));
  TPT_CUDA_LAUNCHED();
}
void xent_backward_inplace(float* exps, float* losses, const float* row_max, const float* sum_exp,
                           const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                           int64_t valid_vocab, float dloss_scale, bool want_grad, cudaStream_t s) {
  if (N <= 0) return;
  xent_backward_kernel<<<unsigned(N), want_grad ? kXentThreads : 32, 0, s>>>(
      exps, losses, row_max, sum_exp, target_logit, targets, Vl, v0, valid_columns(valid_vocab, v0, Vl),
      dloss_scale, want_grad);
  TPT_CUDA_LAUNCHED();
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
  TPT_CUDA_CHECK(cudaStreamSynchronize(s));
  return *pinned;
}

bool has_nonfinite(const float* x, int64_t n, DeviceBuffer& scratch, int* pinned, cudaStream_t s) {
  if (n <= 0) return false;
  int* flag = scratch.as<int>(1);
  TPT_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), s));
  nonfinite_kernel<<<std::min<unsigned>(blocks_for(n), 4 * kReduceBlocks), kThreads, 0, s>>>(flag, x, n);
  TPT_CUDA_LAUNCHED();
  TPT_CUDA_CHECK(cudaMemcpyAsync(pinned, flag, sizeof(int), cudaMemcpyDeviceToHost, s));
  TPT_CUDA_CHECK(cudaStreamSynchronize(s));
  return *pinned != 0;
}

}  // namespace tpt::cuda
