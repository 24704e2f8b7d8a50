// LayerNorm and RMSNorm on the CUDA backend: a warp per row, both norms on the same frame -- the
// lane's W-element groups of a row (for_row_groups), the warp's double sums over them
// (warp_row_sums), the forward kernels with and without the fused residual add (a norm is a Row
// functor), the input-gradient kernel (a norm is a Grad functor), and the weight / bias gradients as
// fixed-order column sums (column_sums.cuh). Sums of
// the row statistics are in double, as the CPU backend's; the rest in fp32, rounded once on store.
// W > 1 (16-byte vector accesses) only when C % W == 0 and the tensors are aligned.
#include <type_traits>

#include "core/cuda/column_sums.cuh"
#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"
#include "core/cuda/launch_util.h"

namespace tpt::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;

unsigned row_blocks(int64_t N) { return unsigned((N + kRowsPerBlock - 1) / kRowsPerBlock); }

// f(c) for lane `lane`'s W-element groups of a row of C: c = lane W, lane W + 32 W, ...
template <int W, class F>
__device__ inline void for_row_groups(int64_t C, int lane, F&& f) {
  for (int64_t c = int64_t(lane) * W; c < C; c += 32 * W) f(c);
}

// acc[0 .. K) = sums over the row: f(c, acc) adds the group at c into the lane's accumulators, which
// the warp then adds up (every lane gets the sums).
template <int W, int K, class F>
__device__ inline void warp_row_sums(double (&acc)[K], int64_t C, int lane, F&& f) {
  for (int k = 0; k < K; ++k) acc[k] = 0;
  for_row_groups<W>(C, lane, [&](int64_t c) { f(c, acc); });
  for (int k = 0; k < K; ++k) acc[k] = warp_reduce(acc[k], SumOp{});
}

// y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps); mean and rstd (N) stored
template <class T>
struct LayerNormRow {
  float *mean, *rstd;
  const T *w, *b;
  float eps;
  template <int W>
  __device__ void operator()(T* y, const T* x, int64_t n, int64_t C, int lane) const {
    double s[1], var[1];
    warp_row_sums<W>(s, C, lane, [&](int64_t c, double(&a)[1]) {
      float v[W];
      load_vec<W>(v, x + c);
#pragma unroll
      for (int k = 0; k < W; ++k) a[0] += v[k];
    });
    const float m = float(s[0] / double(C));
    warp_row_sums<W>(var, C, lane, [&](int64_t c, double(&a)[1]) {
      float v[W];
      load_vec<W>(v, x + c);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float d = v[k] - m;
        a[0] += double(d) * d;
      }
    });
    const float r = float(1.0 / sqrt(var[0] / double(C) + double(eps)));
    for_row_groups<W>(C, lane, [&](int64_t c) {
      float v[W], wv[W], bv[W];
      load_vec<W>(v, x + c);
      load_vec<W>(wv, w + c);
      load_vec<W>(bv, b + c);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = (v[k] - m) * r * wv[k] + bv[k];
      store_vec<W>(y + c, v);
    });
    if (lane == 0) {
      mean[n] = m;
      rstd[n] = r;
    }
  }
};

// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) (N) stored
template <class T>
struct RmsNormRow {
  float* rstd;
  const T* w;
  float eps;
  template <int W>
  __device__ void operator()(T* y, const T* x, int64_t n, int64_t C, int lane) const {
    double ss[1];
    warp_row_sums<W>(ss, C, lane, [&](int64_t c, double(&a)[1]) {
      float v[W];
      load_vec<W>(v, x + c);
#pragma unroll
      for (int k = 0; k < W; ++k) a[0] += double(v[k]) * v[k];
    });
    const float r = float(1.0 / sqrt(ss[0] / double(C) + double(eps)));
    for_row_groups<W>(C, lane, [&](int64_t c) {
      float v[W], wv[W];
      load_vec<W>(v, x + c);
      load_vec<W>(wv, w + c);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = v[k] * r * wv[k];
      store_vec<W>(y + c, v);
    });
    if (lane == 0) rstd[n] = r;
  }
};

template <class T, int W, class Row>
__global__ void norm_forward_kernel(T* out, const T* inp, int64_t N, int64_t C, Row row) {
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (n >= N) return;
  row.template operator()<W>(out + n * C, inp + n * C, n, C, int(threadIdx.x % 32));
}

// res = a + b rounded to T (each lane writes and then rereads only its own elements), then the
// norm of res as stored. res may alias a.
template <class T, int W, class Row>
__global__ void residual_norm_forward_kernel(T* res, T* out, const T* a, const T* b, int64_t N, int64_t C, Row row) {
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (n >= N) return;
  T* r = res + n * C;
  for_row_groups<W>(C, lane, [&](int64_t c) {
    float x[W], y[W];
    load_vec<W>(x, a + n * C + c);
    load_vec<W>(y, b + n * C + c);
#pragma unroll
    for (int k = 0; k < W; ++k) x[k] = x[k] + y[k];
    store_vec<W>(r + c, x);
  });
  row.template operator()<W>(out + n * C, r, n, C, lane);
}

// dinp += the norm's input gradient, a warp per row: Grad::Row holds a row's statistics, adds an
// element's terms to the row's K double sums (add), turns the sums into the row's coefficients
// (finish) and gives an element's gradient (dx).
template <class T, int W, class Grad>
__global__ void norm_backward_input_kernel(T* dinp, const T* dout, const T* inp, const T* w, int64_t N, int64_t C,
                                           Grad g) {
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const T* x = inp + n * C;
  const T* dy = dout + n * C;
  typename Grad::Row row = g.row(n);
  double sums[Grad::K];
  warp_row_sums<W>(sums, C, lane, [&](int64_t c, double(&a)[Grad::K]) {
    float xv[W], dyv[W], wv[W];
    load_vec<W>(xv, x + c);
    load_vec<W>(dyv, dy + c);
    load_vec<W>(wv, w + c);
#pragma unroll
    for (int k = 0; k < W; ++k) row.add(a, xv[k], dyv[k], wv[k]);
  });
  row.finish(sums, C);
  T* dx = dinp + n * C;
  for_row_groups<W>(C, lane, [&](int64_t c) {
    float xv[W], dyv[W], wv[W], dxv[W];
    load_vec<W>(xv, x + c);
    load_vec<W>(dyv, dy + c);
    load_vec<W>(wv, w + c);
    load_vec<W>(dxv, dx + c);
#pragma unroll
    for (int k = 0; k < W; ++k) dxv[k] += row.dx(xv[k], dyv[k], wv[k]);
    store_vec<W>(dx + c, dxv);
  });
}

// LayerNorm: dx = (dn - mean(dn) - norm * mean(dn norm)) * rstd with dn = dy w, norm = (x - mean) rstd
struct LayerNormInputGrad {
  static constexpr int K = 2;  // sum dn, sum dn * norm
  const float *mean, *rstd;
  struct Row {
    float m, r, mean_dn = 0, mean_dn_n = 0;
    __device__ void add(double (&a)[K], float x, float dy, float w) const {
      const float nc = (x - m) * r;
      const float dn = dy * w;
      a[0] += dn;
      a[1] += double(dn) * nc;
    }
    __device__ void finish(const double (&a)[K], int64_t C) {
      mean_dn = float(a[0] / double(C));
      mean_dn_n = float(a[1] / double(C));
    }
    __device__ float dx(float x, float dy, float w) const {
      const float nc = (x - m) * r;
      const float dn = dy * w;
      return (dn - mean_dn - nc * mean_dn_n) * r;
    }
  };
  __device__ Row row(int64_t n) const { return Row{mean[n], rstd[n]}; }
};

// RMSNorm: y = x r w with r = (mean(x^2) + eps)^-1/2: dx = r (w dy) - x r^3 mean(x w dy) (the mean
// in double, as the CPU backend)
struct RmsNormInputGrad {
  static constexpr int K = 1;
  const float* rstd;
  struct Row {
    float r, kr = 0;
    __device__ void add(double (&a)[K], float x, float dy, float w) const { a[0] += double(dy) * w * x; }
    __device__ void finish(const double (&a)[K], int64_t C) { kr = float(a[0] / double(C)) * r * r * r; }
    __device__ float dx(float x, float dy, float w) const { return dy * w * r - x * kr; }
  };
  __device__ Row row(int64_t n) const { return Row{rstd[n]}; }
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

// The forward launches: out = norm(inp), or with res: res = a + b, out = norm(res). make_row(T{})
// gives the norm's Row functor for the storage type.
template <class MakeRow>
void norm_forward(Buf res, Buf out, CBuf a, CBuf b, CBuf w, CBuf bias, int64_t N, int64_t C, MakeRow make_row,
                  const char* what, cudaStream_t s) {
  for (DType t : {a.t, w.t}) check_same(out.t, t, what);
  if (res) {
    check_same(out.t, res.t, what);
    check_same(out.t, b.t, what);
  }
  if (bias) check_same(out.t, bias.t, what);
  if (N <= 0 || C <= 0) return;
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    const auto row = make_row(tag);
    T *r = typed<T>(res), *o = typed<T>(out);
    const T *ap = typed<T>(a), *bp = typed<T>(b);
    const bool vec = C % W == 0 && all_aligned<W>(r, o, ap, bp, typed<T>(w), typed<T>(bias));
    using Row = decltype(row);
    if (!res && vec) norm_forward_kernel<T, W, Row><<<row_blocks(N), kThreads, 0, s>>>(o, ap, N, C, row);
    else if (!res) norm_forward_kernel<T, 1, Row><<<row_blocks(N), kThreads, 0, s>>>(o, ap, N, C, row);
    else if (vec) residual_norm_forward_kernel<T, W, Row><<<row_blocks(N), kThreads, 0, s>>>(r, o, ap, bp, N, C, row);
    else residual_norm_forward_kernel<T, 1, Row><<<row_blocks(N), kThreads, 0, s>>>(r, o, ap, bp, N, C, row);
    TPT_CUDA_LAUNCHED();
  });
}

// The backward launches: dinp += the input gradient (Grad), then param_grads(dy, x) adds the weight
// (and bias) gradients, dy and x typed as stored.
template <class Grad, class ParamGrads>
void norm_backward(Buf dinp, CBuf dout, CBuf inp, CBuf w, int64_t N, int64_t C, Grad g, ParamGrads param_grads,
                   const char* what, cudaStream_t s) {
  for (DType t : {dout.t, inp.t, w.t}) check_same(dinp.t, t, what);
  if (N <= 0 || C <= 0) return;
  dispatch(dinp.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    T* dx = typed<T>(dinp);
    const T *dy = typed<T>(dout), *x = typed<T>(inp), *wp = typed<T>(w);
    if (C % W == 0 && all_aligned<W>(dx, dy, x, wp))
      norm_backward_input_kernel<T, W, Grad><<<row_blocks(N), kThreads, 0, s>>>(dx, dy, x, wp, N, C, g);
    else
      norm_backward_input_kernel<T, 1, Grad><<<row_blocks(N), kThreads, 0, s>>>(dx, dy, x, wp, N, C, g);
    TPT_CUDA_LAUNCHED();
    param_grads(dy, x);
  });
}

}  // namespace

void layernorm_forward(Buf out, float* mean, float* rstd, CBuf inp, CBuf w, CBuf b, int64_t N, int64_t C, float eps,
                       cudaStream_t s) {
  norm_forward(
      Buf{}, out, inp, CBuf{}, w, b, N, C,
      [&](auto tag) {
        using T = decltype(tag);
        return LayerNormRow<T>{mean, rstd, typed<T>(w), typed<T>(b), eps};
      },
      "layernorm_forward", s);
}

void residual_layernorm_forward(Buf res, Buf out, float* mean, float* rstd, CBuf a, CBuf b, CBuf w, CBuf bias,
                                int64_t N, int64_t C, float eps, cudaStream_t s) {
  norm_forward(
      res, out, a, b, w, bias, N, C,
      [&](auto tag) {
        using T = decltype(tag);
        return LayerNormRow<T>{mean, rstd, typed<T>(w), typed<T>(bias), eps};
      },
      "residual_layernorm_forward", s);
}

void rmsnorm_forward(Buf out, float* rstd, CBuf inp, CBuf w, int64_t N, int64_t C, float eps, cudaStream_t s) {
  norm_forward(
      Buf{}, out, inp, CBuf{}, w, CBuf{}, N, C,
      [&](auto tag) {
        using T = decltype(tag);
        return RmsNormRow<T>{rstd, typed<T>(w), eps};
      },
      "rmsnorm_forward", s);
}

void residual_rmsnorm_forward(Buf res, Buf out, float* rstd, CBuf a, CBuf b, CBuf w, int64_t N, int64_t C, float eps,
                              cudaStream_t s) {
  norm_forward(
      res, out, a, b, w, CBuf{}, N, C,
      [&](auto tag) {
        using T = decltype(tag);
        return RmsNormRow<T>{rstd, typed<T>(w), eps};
      },
      "residual_rmsnorm_forward", s);
}

void layernorm_backward(Buf dinp, Buf dw, Buf db, CBuf dout, CBuf inp, CBuf w, const float* mean,
                        const float* rstd, int64_t N, int64_t C, DeviceBuffer& scratch, cudaStream_t s) {
  norm_backward(
      dinp, dout, inp, w, N, C, LayerNormInputGrad{mean, rstd},
      [&](const auto* dy, const auto* x) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(dy)>>;
        column_sums<2>(grad_ptr(dw), grad_ptr(db), N, C, LayerNormParamGrads<T>{dy, x, mean, rstd, C}, scratch, s);
      },
      "layernorm_backward", s);
}

void rmsnorm_backward(Buf dinp, Buf dw, CBuf dout, CBuf inp, CBuf w, const float* rstd, int64_t N, int64_t C,
                      DeviceBuffer& scratch, cudaStream_t s) {
  norm_backward(
      dinp, dout, inp, w, N, C, RmsNormInputGrad{rstd},
      [&](const auto* dy, const auto* x) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(dy)>>;
        if (dw) column_sums<1>(grad_ptr(dw), GradPtr{}, N, C, RmsNormParamGrad<T>{dy, x, rstd, C}, scratch, s);
      },
      "rmsnorm_backward", s);
}

}  // namespace tpt::cuda
