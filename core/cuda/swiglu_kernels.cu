// SwiGLU's forward and backward on the CUDA backend: single element-wise passes over core/math.h's
// silu, instantiated for the storage type of the compute-dtype tensors (device_util.h): converted on
// load, computed in fp32, rounded once on store.
#include <cstdint>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"
#include "core/cuda/launch_util.h"

namespace tpt::cuda {
namespace {

// Element i of out (N, F) is row n = i / F, column f = i % F; its gate and up are inp[n 2F + f]
// and inp[n 2F + F + f]. Vectors need F % W == 0 (W elements stay in one row).

template <class T>
struct SwigluForwardF {
  T* out;
  const T* inp;
  int64_t F;
  template <int W>
  __device__ void apply(int64_t i) const {
    const int64_t n = i / F, f = i % F;
    const T* g = inp + n * 2 * F + f;
    float gv[W], uv[W];
    load_vec<W>(gv, g);
    load_vec<W>(uv, g + F);
#pragma unroll
    for (int k = 0; k < W; ++k) gv[k] = silu(gv[k]) * uv[k];
    store_vec<W>(out + i, gv);
  }
};

template <class T>
struct SwigluBackwardF {
  T* dinp;
  const T* dout;
  const T* inp;
  int64_t F;
  template <int W>
  __device__ void apply(int64_t i) const {
    const int64_t n = i / F, f = i % F, at = n * 2 * F + f;
    float gv[W], uv[W], dy[W], dg[W], du[W];
    load_vec<W>(gv, inp + at);
    load_vec<W>(uv, inp + at + F);
    load_vec<W>(dy, dout + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      dg[k] = dy[k] * uv[k] * silu_grad(gv[k]);
      du[k] = dy[k] * silu(gv[k]);
    }
    store_vec<W>(dinp + at, dg);
    store_vec<W>(dinp + at + F, du);
  }
};

}  // namespace

void swiglu_forward(Buf out, CBuf inp, int64_t N, int64_t F, cudaStream_t s) {
  check_same(out.t, inp.t, "swiglu_forward");
  if (N <= 0 || F <= 0) return;
  dispatch(out.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    const SwigluForwardF<T> f{typed<T>(out), typed<T>(inp), F};
    launch_elementwise<W>(N * F, all_aligned<W>(f.out, f.inp) && F % W == 0, f, s);
  });
}

void swiglu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t N, int64_t F, cudaStream_t s) {
  check_same(dinp.t, dout.t, "swiglu_backward");
  check_same(dinp.t, inp.t, "swiglu_backward");
  if (N <= 0 || F <= 0) return;
  dispatch(dinp.t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = vec_width<T>();
    const SwigluBackwardF<T> f{typed<T>(dinp), typed<T>(dout), typed<T>(inp), F};
    launch_elementwise<W>(N * F, all_aligned<W>(f.dinp, f.dout, f.inp) && F % W == 0, f, s);
  });
}

}  // namespace tpt::cuda
