// The CUDA backend's vocabulary-parallel kernels: the token embedding of this rank's vocabulary
// shard (forward: row copies; backward: positions sorted by token with CUB, then each row's
// gradients summed in position order -- deterministic, no atomics) and the three passes of the
// vocab-parallel cross-entropy (local max and target logit, sum of exponentials, loss and
// gradient in place), a block per row. Storage types as in kernels.cu (device_util.h).
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <type_traits>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"
#include "core/cuda/launch_util.h"
#include "core/gpu_workspace.h"

namespace tpt::cuda {
namespace {
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
__global__ void embedding_segments_kernel(GradPtr dwte, const uint32_t* keys, const uint32_t* pos, const T* dout,
                                          int64_t N, int64_t C, int64_t rows) {
  TPT_GRID_LOOP(i, N * C) {
    const int64_t p = i / C, c = i - p * C;
    const uint32_t key = keys[p];
    if (key >= uint32_t(rows) || (p > 0 && keys[p - 1] == key)) continue;
    float acc = dwte.load(int64_t(key) * C + c);  // from the stored value, in position order (as the CPU backend)
    for (int64_t q = p; q < N && keys[q] == key; ++q) acc += ld(dout, int64_t(pos[q]) * C + c);
    dwte.store(int64_t(key) * C + c, acc);
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

}  // namespace

// ---------------------------------------------------------------- launchers

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

void embedding_backward(Buf dwte, const int32_t* tokens, CBuf dout, int64_t N, int64_t C, int64_t v0,
                        int64_t rows, DeviceBuffer& scratch, cudaStream_t s) {
  if (N <= 0 || C <= 0 || rows <= 0) return;
  TPT_CHECK(N < (int64_t(1) << 31) && rows < (int64_t(1) << 31));
  int end_bit = 1;  // bits of the largest key, the out-of-shard marker `rows`
  while (end_bit < 32 && (uint64_t(rows) >> end_bit) != 0) ++end_bit;
  size_t temp_bytes = 0;
  TPT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), int(N), 0, end_bit, s));
  const size_t arr = size_t(embedding_sort_arrays_bytes(N) / 4);  // the plan counts 4 arrays + a bound of temp_bytes
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
        <<<blocks_for(N * C), kThreads, 0, s>>>(grad_ptr(dwte), keys_out, vals_out, typed<T>(dout), N, C, rows);
    TPT_CUDA_LAUNCHED();
  });
}

namespace {
// The launch of a cross-entropy pass: launch(T{}, W) with T the logits' storage type and W the
// widest vector width its rows allow (1 when Vl % W != 0 or the logits are not 16-byte aligned).
template <class F>
void xent_launch(CBuf logits, int64_t N, int64_t Vl, F launch) {
  TPT_CHECK(N <= int64_t(INT32_MAX));
  dispatch(logits.t, [&](auto tag) {
    constexpr int W = vec_width<decltype(tag)>();
    if (Vl % W == 0 && is_aligned(logits.p, 16)) launch(tag, std::integral_constant<int, W>{});
    else launch(tag, std::integral_constant<int, 1>{});
    TPT_CUDA_LAUNCHED();
  });
}
}  // namespace

void xent_local_max(float* row_max, float* target_logit, CBuf logits, const int32_t* targets, int64_t N,
                    int64_t Vl, int64_t v0, int64_t valid_vocab, cudaStream_t s) {
  if (N <= 0) return;
  const int64_t nvalid = valid_columns(valid_vocab, v0, Vl);
  xent_launch(logits, N, Vl, [&](auto tag, auto w) {
    using T = decltype(tag);
    xent_max_kernel<T, decltype(w)::value>
        <<<unsigned(N), kXentThreads, 0, s>>>(row_max, target_logit, typed<T>(logits), targets, Vl, v0, nvalid);
  });
}

void xent_local_sumexp(float* sum_exp, CBuf logits, const float* row_max, int64_t N, int64_t Vl, int64_t v0,
                       int64_t valid_vocab, cudaStream_t s) {
  if (N <= 0) return;
  const int64_t nvalid = valid_columns(valid_vocab, v0, Vl);
  xent_launch(logits, N, Vl, [&](auto tag, auto w) {
    using T = decltype(tag);
    xent_sumexp_kernel<T, decltype(w)::value>
        <<<unsigned(N), kXentThreads, 0, s>>>(sum_exp, typed<T>(logits), row_max, Vl, nvalid);
  });
}

void xent_loss_grad(Buf logits, float* losses, const float* row_max, const float* sum_exp,
                    const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                    int64_t valid_vocab, float dloss_scale, bool want_grad, const float* row_weight,
                    cudaStream_t s) {
  if (N <= 0) return;
  const int64_t nvalid = valid_columns(valid_vocab, v0, Vl);
  const unsigned threads = want_grad ? kXentThreads : 32;
  xent_launch(logits, N, Vl, [&](auto tag, auto w) {
    using T = decltype(tag);
    xent_loss_grad_kernel<T, decltype(w)::value><<<unsigned(N), threads, 0, s>>>(
        typed<T>(logits), losses, row_max, sum_exp, target_logit, targets, Vl, v0, nvalid, dloss_scale, want_grad,
        row_weight);
  });
}

}  // namespace tpt::cuda
