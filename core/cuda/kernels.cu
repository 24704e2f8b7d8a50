// The CUDA backend's kernels other than GEMMs, attention, the vocabulary-parallel ones
// (vocab_kernels.cu) and LLaMA's SwiGLU, RoPE and QKV regroup (llama_kernels.cu): element-wise maps
// over the shared per-element math (core/math.h, core/dtype.h), LayerNorm and RMSNorm (each with the
// fused residual add), the position embedding and the reductions. Every kernel is instantiated for the
// storage type of its compute-dtype tensors (device_util.h), converts on load, computes in fp32
// and rounds once on store; 16-byte vector loads and stores where the pointers and sizes allow.
// Row reductions accumulate like the CPU backend (double where it uses double); column reductions
// go through fixed-order partial sums, never atomics, so every result is deterministic.
#include <algorithm>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"
#include "core/cuda/launch_util.h"

namespace tpt::cuda {
namespace {


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

// ---------------------------------------------------------------- RMSNorm (a warp per row, as LayerNorm)
// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps): the sum of squares in double as LayerNorm's
// variance, the rest in fp32.

template <class T, int W>
__device__ inline void rmsnorm_row(T* y, float* rstd, const T* x, const T* w, int64_t n, int64_t C, float eps,
                                   int lane) {
  double ss = 0;
  for (int64_t c = int64_t(lane) * W; c < C; c += 32 * W) {
    float v[W];
    load_vec<W>(v, x + c);
#pragma unroll
    for (int k = 0; k < W; ++k) ss += double(v[k]) * v[k];
  }
  ss = warp_reduce(ss, SumOp{});
  const float r = float(1.0 / sqrt(ss / double(C) + double(eps)));
  for (int64_t c = int64_t(lane) * W; c < C; c += 32 * W) {
    float v[W], wv[W];
    load_vec<W>(v, x + c);
    load_vec<W>(wv, w + c);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = v[k] * r * wv[k];
    store_vec<W>(y + c, v);
  }
  if (lane == 0) rstd[n] = r;
}

template <class T, int W>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* w, int64_t N, int64_t C,
                                       float eps) {
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (n >= N) return;
  rmsnorm_row<T, W>(out + n * C, rstd, inp + n * C, w, n, C, eps, int(threadIdx.x % 32));
}

// res = a + b rounded to T (each lane rereads only what it wrote), then the RMSNorm of res as
// stored. res may alias a.
template <class T, int W>
__global__ void residual_rmsnorm_forward_kernel(T* res, T* out, float* rstd, const T* a, const T* b, const T* w,
                                                int64_t N, int64_t C, float eps) {
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
  rmsnorm_row<T, W>(out + n * C, rstd, r, w, n, C, eps, lane);
}

// y = x r w with r = (mean(x^2) + eps)^-1/2: dx = r (w dy) - x r^3 mean(x w dy) (the mean in
// double, as the CPU backend); dinp +=
template <class T, int W>
__global__ void rmsnorm_backward_input_kernel(T* dinp, const T* dout, const T* inp, const T* w, const float* rstd,
                                              int64_t N, int64_t C) {
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const T* x = inp + n * C;
  const T* dy = dout + n * C;
  const float r = rstd[n];
  double dot = 0;
  for (int64_t c = int64_t(lane) * W; c < C; c += 32 * W) {
    float xv[W], dyv[W], wv[W];
    load_vec<W>(xv, x + c);
    load_vec<W>(dyv, dy + c);
    load_vec<W>(wv, w + c);
#pragma unroll
    for (int k = 0; k < W; ++k) dot += double(dyv[k]) * wv[k] * xv[k];
  }
  dot = warp_reduce(dot, SumOp{});
  const float kr = float(dot / double(C)) * r * r * r;
  T* dx = dinp + n * C;
  for (int64_t c = int64_t(lane) * W; c < C; c += 32 * W) {
    float xv[W], dyv[W], wv[W], dxv[W];
    load_vec<W>(xv, x + c);
    load_vec<W>(dyv, dy + c);
    load_vec<W>(wv, w + c);
    load_vec<W>(dxv, dx + c);
#pragma unroll
    for (int k = 0; k < W; ++k) dxv[k] += dyv[k] * wv[k] * r - xv[k] * kr;
    store_vec<W>(dx + c, dxv);
  }
}

// dy * normalized of element (n, c): RMSNorm's weight gradient
template <class T>
struct RmsNormParamGrad {
  const T *dout, *inp;
  const float* rstd;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float* v) const {
    v[0] = ld(dout, n * C + c) * ld(inp, n * C + c) * rstd[n];
  }
};

// ---------------------------------------------------------------- position embedding (the token embedding: vocab_kernels.cu)

template <class T>
__global__ void position_backward_kernel(float* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C) {
  const int64_t TC = T_ * C;
  TPT_GRID_LOOP(i, TC) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) acc += ld(dout, b * TC + i);
    dwpe[i] = acc;
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

void rmsnorm_forward(Buf out, float* rstd, CBuf inp, CBuf w, int64_t N, int64_t C, float eps, cudaStream_t s) {
  check_same(out.t, inp.t, "rmsnorm_forward");
  check_same(out.t, w.t, "rmsnorm_forward");
  if (N <= 0 || C <= 0) return;
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    T* o = typed<T>(out);
    const T *x = typed<T>(inp), *wp = typed<T>(w);
    if (C % W == 0 && all_aligned<W>(o, x, wp))
      rmsnorm_forward_kernel<T, W><<<row_blocks(N), kThreads, 0, s>>>(o, rstd, x, wp, N, C, eps);
    else
      rmsnorm_forward_kernel<T, 1><<<row_blocks(N), kThreads, 0, s>>>(o, rstd, x, wp, N, C, eps);
    TPT_CUDA_LAUNCHED();
  });
}

void residual_rmsnorm_forward(Buf res, Buf out, float* rstd, CBuf a, CBuf b, CBuf w, int64_t N, int64_t C, float eps,
                              cudaStream_t s) {
  for (DType t : {out.t, a.t, b.t, w.t}) check_same(res.t, t, "residual_rmsnorm_forward");
  if (N <= 0 || C <= 0) return;
  dispatch(res.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    T *r = typed<T>(res), *o = typed<T>(out);
    const T *ap = typed<T>(a), *bp = typed<T>(b), *wp = typed<T>(w);
    if (C % W == 0 && all_aligned<W>(r, o, ap, bp, wp))
      residual_rmsnorm_forward_kernel<T, W><<<row_blocks(N), kThreads, 0, s>>>(r, o, rstd, ap, bp, wp, N, C, eps);
    else
      residual_rmsnorm_forward_kernel<T, 1><<<row_blocks(N), kThreads, 0, s>>>(r, o, rstd, ap, bp, wp, N, C, eps);
    TPT_CUDA_LAUNCHED();
  });
}

void rmsnorm_backward(Buf dinp, float* dw, CBuf dout, CBuf inp, CBuf w, const float* rstd, int64_t N, int64_t C,
                      DeviceBuffer& scratch, cudaStream_t s) {
  for (DType t : {dout.t, inp.t, w.t}) check_same(dinp.t, t, "rmsnorm_backward");
  if (N <= 0 || C <= 0) return;
  dispatch(dinp.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    T* dx = typed<T>(dinp);
    const T *dy = typed<T>(dout), *x = typed<T>(inp), *wp = typed<T>(w);
    if (C % W == 0 && all_aligned<W>(dx, dy, x, wp))
      rmsnorm_backward_input_kernel<T, W><<<row_blocks(N), kThreads, 0, s>>>(dx, dy, x, wp, rstd, N, C);
    else
      rmsnorm_backward_input_kernel<T, 1><<<row_blocks(N), kThreads, 0, s>>>(dx, dy, x, wp, rstd, N, C);
    TPT_CUDA_LAUNCHED();
    if (dw) column_sums<1>(dw, nullptr, N, C, RmsNormParamGrad<T>{dy, x, rstd, C}, scratch, s);
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
