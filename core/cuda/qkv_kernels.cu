// The CUDA backend's kernels on the QKV projection's output: the grouped-query QKV regroup (a pure
// permutation: raw element copies, 16 bytes at a time where the head dimension allows) and RoPE (in
// place, a thread per rotated pair, cos / sin in fp32 as the CPU backend). RoPE is instantiated for
// the storage type of the compute-dtype tensors (device_util.h): converted on load, computed in fp32,
// rounded once on store.
#include <cstdint>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"
#include "core/cuda/launch_util.h"

namespace tpt::cuda {
namespace {

// ---------------------------------------------------------------- QKV regroup
// Element i of out: row n, head slot `hs` of its layout, channel d. Its source in the other layout:
//   to heads (out is heads): slot hs < G Q is query q = hs % Q of group hs / Q, G Q + g the key of
//     group g, G Q + G + g its value -> grouped slot g (Q + 2) + (q | Q | Q + 1);
//   to grouped (out is grouped): slot g (Q + 2) + j -> heads slot j < Q ? g Q + j : j == Q ? G Q + g
//     : G Q + G + g.
// R is an unsigned type of the element's size: the values are copied, never converted. Vectors of
// W elements need D % W == 0.

template <class R>
struct RegroupF {
  R* out;
  const R* in;
  int64_t G, Q, D;
  bool to_heads;
  template <int W>
  __device__ void apply(int64_t i) const {
    const int64_t row = G * (Q + 2) * D;
    const int64_t n = i / row, c = i % row, hs = c / D, d = c % D;
    int64_t src;
    if (to_heads) {
      const int64_t GQ = G * Q;
      src = hs < GQ       ? (hs / Q) * (Q + 2) + hs % Q
            : hs < GQ + G ? (hs - GQ) * (Q + 2) + Q
                          : (hs - GQ - G) * (Q + 2) + Q + 1;
    } else {
      const int64_t g = hs / (Q + 2), j = hs % (Q + 2);
      src = j < Q ? g * Q + j : j == Q ? G * Q + g : G * Q + G + g;
    }
    const R* from = in + n * row + src * D + d;
    if constexpr (W == 1) {
      out[i] = *from;
    } else {
      using V = typename RawBytes<W * int(sizeof(R))>::type;
      *reinterpret_cast<V*>(out + i) = *reinterpret_cast<const V*>(from);
    }
  }
};

// ---------------------------------------------------------------- RoPE
// A thread per pair p of the N (H + KV) rot/2 pairs: j = p % (rot/2) within head slot h = p / (rot/2)
// % (H + KV) (the query heads, then the key heads: contiguous at the start of the row) of token n.
template <class T>
__global__ void rope_kernel(T* qkv, const float* inv_freq, const int32_t* positions, int64_t N, int64_t S,
                            int64_t heads, int64_t row, int64_t D, int64_t half, bool interleaved, bool inverse) {
  TPT_GRID_LOOP(p, N * heads * half) {
    const int64_t j = p % half, h = p / half % heads, n = p / (half * heads);
    const float pos = float(positions ? int64_t(positions[n]) : n % S);
    const float angle = pos * inv_freq[j];
    const float c = cosf(angle), sn = sinf(angle);
    T* x = qkv + n * row + h * D;
    const int64_t i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
    float x0 = ld(x, i0), x1 = ld(x, i1);
    rope_rotate(x0, x1, c, inverse ? -sn : sn);
    st(x, i0, x0);
    st(x, i1, x1);
  }
}

}  // namespace

void qkv_regroup(Buf out, CBuf in, int64_t N, int64_t G, int64_t Q, int64_t D, bool to_heads, cudaStream_t s) {
  check_same(out.t, in.t, "qkv_regroup");
  TPT_CHECK(G >= 1 && Q >= 1 && D >= 1);
  const int64_t n = N * G * (Q + 2) * D;
  if (n <= 0) return;
  TPT_CHECK(out.p != in.p);  // a permutation out of place
  auto run = [&](auto rtag) {
    using R = decltype(rtag);
    constexpr int W = int(16 / sizeof(R));
    const RegroupF<R> f{typed<R>(out), typed<R>(in), G, Q, D, to_heads};
    launch_elementwise<W>(n, all_aligned<W>(f.out, f.in) && D % W == 0, f, s);
  };
  if (dtype_bytes(out.t) == 4) run(uint32_t{});
  else run(uint16_t{});
}

void rope(Buf qkv, const float* inv_freq, const int32_t* positions, int64_t N, int64_t S, int64_t H, int64_t KV,
          int64_t D, int64_t rot, bool interleaved, bool inverse, cudaStream_t s) {
  TPT_CHECK(rot >= 0 && rot % 2 == 0 && rot <= D && H >= 0 && KV >= 0 && (positions || S >= 1));
  const int64_t half = rot / 2, heads = H + KV, pairs = N * heads * half;
  if (pairs <= 0) return;
  dispatch(qkv.t, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<blocks_for(pairs), kThreads, 0, s>>>(typed<T>(qkv), inv_freq, positions, N, S, heads,
                                                          (H + 2 * KV) * D, D, half, interleaved, inverse);
    TPT_CUDA_LAUNCHED();
  });
}

}  // namespace tpt::cuda
