// The CUDA backend's kernels other than GEMMs, attention, the norms (norm_kernels.cu), the
// optimizer's (optimizer_kernels.cu), the vocabulary-parallel ones (vocab_kernels.cu), SwiGLU
// (swiglu_kernels.cu) and the QKV regroup and RoPE (qkv_kernels.cu): element-wise maps over the shared per-element math
// (core/math.h, core/dtype.h), the position embedding and the bias gradients' column sums. Every
// kernel is instantiated for the storage type of its compute-dtype tensors (device_util.h), converts
// on load, computes in fp32 and rounds once on store; 16-byte vector loads and stores where the
// pointers and sizes allow. Column reductions go through fixed-order partial sums
// (column_sums.cuh), never atomics, so every result is deterministic.
#include <algorithm>

#include "core/cuda/column_sums.cuh"
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

// y = y + x (x fp32), each sum rounded once to y's type
template <class T>
struct AddF32F {
  T* y;
  const float* x;
  template <int W>
  __device__ void apply(int64_t i) const {
#pragma unroll
    for (int k = 0; k < W; ++k) st(y, i + k, ld(y, i + k) + x[i + k]);
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

template <class T>
struct ReadValue {
  const T* x;
  int64_t C;
  __device__ void operator()(int64_t n, int64_t c, float* v) const { v[0] = ld(x, n * C + c); }
};

// ---------------------------------------------------------------- position embedding (the token embedding: vocab_kernels.cu)

template <class T>
__global__ void position_backward_kernel(GradPtr dwpe, const T* dout, int64_t B, int64_t T_, int64_t C) {
  const int64_t TC = T_ * C;
  TPT_GRID_LOOP(i, TC) {
    float acc = dwpe.load(i);  // from the stored value, in batch order (as the CPU backend)
    for (int64_t b = 0; b < B; ++b) acc += ld(dout, b * TC + i);
    dwpe.store(i, acc);
  }
}

// x *= a, the bf16 gradient buffer's elements rounded once
__global__ void scale_grad_kernel(GradPtr x, float a, int64_t n) {
  TPT_GRID_LOOP(i, n) x.store(i, x.load(i) * a);
}

__global__ void accumulate_grad_kernel(GradPtr g, const float* x, int64_t n) {
  TPT_GRID_LOOP(i, n) g.add(i, x[i]);
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

void accumulate_f32(Buf y, const float* x, int64_t n, cudaStream_t s) {
  dispatch(y.t, [&](auto tag) {
    using T = decltype(tag);
    launch_elementwise<1>(n, false, AddF32F<T>{typed<T>(y), x}, s);
  });
}

void accumulate_grad(Buf g, const float* x, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  accumulate_grad_kernel<<<blocks_for(n), kThreads, 0, s>>>(grad_ptr(g), x, n);
  TPT_CUDA_LAUNCHED();
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

void scale(Buf x, float a, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (x.t == DType::F32) {
    const ScaleF f{x.f32(), a};
    launch_elementwise<4>(n, all_aligned<4>(f.x), f, s);
    return;
  }
  scale_grad_kernel<<<blocks_for(n), kThreads, 0, s>>>(grad_ptr(x), a, n);
  TPT_CUDA_LAUNCHED();
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

void add_column_sums(Buf out, CBuf x, int64_t N, int64_t C, DeviceBuffer& scratch, cudaStream_t s) {
  dispatch(x.t, [&](auto tag) {
    using T = decltype(tag);
    column_sums<1>(grad_ptr(out), GradPtr{}, N, C, ReadValue<T>{typed<T>(x), C}, scratch, s);
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

void position_embedding_backward(Buf dwpe, CBuf dout, int64_t B, int64_t T_, int64_t C, cudaStream_t s) {
  if (T_ * C <= 0) return;
  dispatch(dout.t, [&](auto tag) {
    using T = decltype(tag);
    position_backward_kernel<T><<<blocks_for(T_ * C), kThreads, 0, s>>>(grad_ptr(dwpe), typed<T>(dout), B, T_, C);
    TPT_CUDA_LAUNCHED();
  });
}

}  // namespace tpt::cuda
