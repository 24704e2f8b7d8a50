// The optimizer step's kernels: AdamW and the gradient reductions, on one range (adamw,
// sum_squares, has_nonfinite) and as multi-tensor work over a table of segments (adamw_segments,
// grad_stats; Ops::adamw_segments / grad_stats in core/ops.h). A multi-tensor launch takes its table
// as the kernel's argument (up to kTableSegments segments; a longer table takes one launch per
// kTableSegments): no upload, no per-tensor launch. Its blocks walk the concatenation of the
// segments in chunks of kChunk elements; each finds the segment of its first element by binary
// search and steps through the following ones. grad_stats adds the blocks' partial sums in block
// order (deterministic) and reads the squared norm and the nan/inf flag to the host in one copy.
#include <algorithm>
#include <type_traits>

#include "core/cuda/device_util.h"
#include "core/cuda/kernels.h"
#include "core/cuda/launch_util.h"
#include "core/gpu_workspace.h"

namespace tpt::cuda {
namespace {

// Kernel arguments may take 32 KiB from CUDA 12.1 on (Volta and newer), 4 KiB before.
#if CUDART_VERSION >= 12010
constexpr int kTableSegments = 512;
#else
constexpr int kTableSegments = 96;
#endif
constexpr int64_t kChunk = kMultiTensorChunk;  // elements per block (core/gpu_workspace.h: the plan counts the scratch)
static_assert(kChunk == int64_t(kThreads) * 16, "a block's threads take 16 elements each");

struct SegmentTable {
  int count = 0;
  int64_t begin[kTableSegments + 1];  // segment j: elements [begin[j], begin[j + 1]) of the concatenation
  int64_t offset[kTableSegments];
  int64_t local[kTableSegments];
  int tensor[kTableSegments];  // adamw_segments with scaled states: the scale tables' index
  bool flag[kTableSegments];
};
static_assert(sizeof(SegmentTable) < (CUDART_VERSION >= 12010 ? 32000 : 4000), "kernel argument size");

// Calls f(segment, index in the segment) for this thread's elements of block blockIdx.x's chunk.
template <class F>
__device__ inline void for_each_chunk_element(const SegmentTable& t, F&& f) {
  const int64_t total = t.begin[t.count];
  const int64_t start = int64_t(blockIdx.x) * kChunk, end = min(total, start + kChunk);
  int lo = 0, hi = t.count - 1;  // the last segment with begin <= start
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.begin[mid] <= start) lo = mid;
    else hi = mid - 1;
  }
  int seg = lo;
  for (int64_t e = start + threadIdx.x; e < end; e += blockDim.x) {
    while (e >= t.begin[seg + 1]) ++seg;
    f(seg, e - t.begin[seg]);
  }
}

// The compute copy of a master weight (core/dtype.h master_copy_bits: bf16 ties away from zero).
__device__ __forceinline__ void store_master_copy(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_master_copy(bf16* p, float v) { p->bits = master_to_bf16(v); }
__device__ __forceinline__ void store_master_copy(fp16* p, float v) { p->bits = fp32_to_fp16(v); }

// The step's pass over a table (core/math.h adamw_state_step). First pass with scaled fp16 states:
// each thread keeps the maxima of its run of elements in one segment and folds them into the
// tensor's amax (an integer max of the bits: for values >= 0 their order) when the segment ends.
__global__ void adamw_segments_kernel(SegmentTable t, AdamWStates b, bool sharded, GradPtr g, float* amax,
                                      AdamWParams a, float grad_scale) {
  float am = 0.0f, av = 0.0f, ap = 0.0f;
  int cur = -1;
  auto flush = [&] {
    if (cur < 0 || !amax) return;
    float* x = amax + 3 * t.tensor[cur];
    atomicMax(reinterpret_cast<int*>(x), __float_as_int(am));
    atomicMax(reinterpret_cast<int*>(x + 1), __float_as_int(av));
    atomicMax(reinterpret_cast<int*>(x + 2), __float_as_int(ap));
    am = av = ap = 0.0f;
  };
  for_each_chunk_element(t, [&](int seg, int64_t i) {
    if (seg != cur) {
      flush();
      cur = seg;
    }
    const int64_t off = t.offset[seg] + i, loc = t.local[seg] + i;
    adamw_state_step(b, a, g.load(off) * grad_scale, t.flag[seg], sharded ? loc : off, loc, off, t.tensor[seg], am, av,
                     ap);
  });
  flush();
}

// partial[2 * block] = the block's squared sum over flagged segments, partial[2 * block + 1] = 1 if
// it saw an inf or a nan (any segment)
__global__ void grad_stats_partial_kernel(double* partial, SegmentTable t, GradPtr x) {
  double s = 0;
  int bad = 0;
  for_each_chunk_element(t, [&](int seg, int64_t i) {
    const float v = x.load(t.offset[seg] + i);
    bad |= !isfinite(v);
    if (t.flag[seg]) s += double(v) * v;
  });
  s = block_reduce(s, SumOp{}, 0.0);
  bad = block_reduce(bad, SumOp{}, 0);
  if (threadIdx.x == 0) {
    partial[2 * blockIdx.x] = s;
    partial[2 * blockIdx.x + 1] = bad ? 1.0 : 0.0;
  }
}

// out[0] = sum of the blocks' sums (in a fixed order), out[1] = 1 if any block saw an inf or a nan
__global__ void grad_stats_finish_kernel(double* out, const double* partial, int64_t blocks) {
  double s = 0, bad = 0;
  for (int64_t j = threadIdx.x; j < blocks; j += blockDim.x) {
    s += partial[2 * j];
    bad = fmax(bad, partial[2 * j + 1]);
  }
  s = block_reduce(s, SumOp{}, 0.0);
  bad = block_reduce(bad, SumOp{}, 0.0);
  if (threadIdx.x == 0) {
    out[0] = s;
    out[1] = bad > 0 ? 1.0 : 0.0;
  }
}

// Calls launch(table, blocks, first block) for each run of up to kTableSegments segments (empty
// ones left out); returns the blocks launched in all.
template <class F>
int64_t for_each_table(const TensorSegment* segs, int count, F&& launch) {
  int64_t blocks_done = 0;
  SegmentTable t;
  auto flush = [&] {
    if (t.count == 0) return;
    const int64_t blocks = (t.begin[t.count] + kChunk - 1) / kChunk;
    launch(t, blocks, blocks_done);
    blocks_done += blocks;
    t.count = 0;
  };
  t.begin[0] = 0;
  for (int j = 0; j < count; ++j) {
    if (segs[j].n <= 0) continue;
    const int k = t.count;
    t.offset[k] = segs[j].offset;
    t.local[k] = segs[j].local;
    t.flag[k] = segs[j].flag;
    t.tensor[k] = segs[j].tensor;
    t.begin[k + 1] = t.begin[k] + segs[j].n;
    if (++t.count == kTableSegments) flush();
  }
  flush();
  return blocks_done;
}

template <class T>
struct AdamWF {
  float *p, *m, *v;
  const float* g;
  T* compute;  // may be null
  AdamWParams a;
  bool decay;
  float grad_scale;
  template <int W>
  __device__ void apply(int64_t i) const {
    float pp[W], gg[W], mm[W], vv[W];
    load_vec<W>(pp, p + i);
    load_vec<W>(gg, g + i);
    load_vec<W>(mm, m + i);
    load_vec<W>(vv, v + i);
#pragma unroll
    for (int k = 0; k < W; ++k) adamw_update(pp[k], gg[k] * grad_scale, mm[k], vv[k], a, decay);
    store_vec<W>(p + i, pp);
    store_vec<W>(m + i, mm);
    store_vec<W>(v + i, vv);
    if (compute)
#pragma unroll
      for (int k = 0; k < W; ++k) store_master_copy(compute + i + k, pp[k]);
  }
};

__global__ void sum_squares_partial_kernel(double* partial, GradPtr x, int64_t n) {
  double s = 0;
  TPT_GRID_LOOP(i, n) {
    const double v = x.load(i);
    s += v * v;
  }
  s = block_reduce(s, SumOp{}, 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double* out, const double* partial, int count) {
  double s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_reduce(s, SumOp{}, 0.0);
  if (threadIdx.x == 0) *out = s;
}

__global__ void nonfinite_kernel(int* flag, GradPtr x, int64_t n) {
  bool bad = false;
  TPT_GRID_LOOP(i, n) bad |= !isfinite(x.load(i));
  if (bad) *flag = 1;  // every writer stores the same value
}

}  // namespace

void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a, bool decay, Buf compute,
           float grad_scale, cudaStream_t s) {
  dispatch(compute.t, [&](auto tag) {
    using T = decltype(tag);
    const AdamWF<T> f{p, m, v, g, typed<T>(compute), a, decay, grad_scale};
    launch_elementwise<4>(n, all_aligned<4>(p, m, v, g, f.compute), f, s);
  });
}

template <class T>
struct MasterCopyF {
  T* dst;
  const float* master;
  template <int W>
  __device__ void apply(int64_t i) const {
#pragma unroll
    for (int k = 0; k < W; ++k) store_master_copy(dst + i + k, master[i + k]);
  }
};

void master_copy(Buf dst, const float* master, int64_t n, cudaStream_t s) {
  dispatch(dst.t, [&](auto tag) {
    using T = decltype(tag);
    launch_elementwise<1>(n, false, MasterCopyF<T>{typed<T>(dst), master}, s);
  });
}

void adamw_segments(const AdamWBuffers& b, const TensorSegment* segs, int count, const AdamWParams& a,
                    float grad_scale, const float* new_scales, cudaStream_t s) {
  TPT_CHECK(!b.remainders || (b.compute.t == DType::BF16 && !b.master));
  TPT_CHECK(b.master.t != DType::BF16 && (!b.scaled() || (b.scales && b.amax)));
  const AdamWStates st{b.master.p, b.master.t, b.m.p, b.v.p, b.m.t, b.v.t, b.compute.p, b.compute.t,
                       b.remainders, b.scaled() ? b.scales : nullptr, new_scales};
  float* amax = b.scaled() && !new_scales ? b.amax : nullptr;
  if (amax) TPT_CUDA_CHECK(cudaMemsetAsync(amax, 0, size_t(3 * b.tensors) * sizeof(float), s));
  for_each_table(segs, count, [&](const SegmentTable& t, int64_t blocks, int64_t) {
    adamw_segments_kernel<<<unsigned(blocks), kThreads, 0, s>>>(t, st, b.master_sharded, grad_ptr(b.grads), amax, a,
                                                                grad_scale);
    TPT_CUDA_LAUNCHED();
  });
}

GradStats grad_stats(CBuf x, const TensorSegment* segs, int count, DeviceBuffer& scratch, double* pinned,
                     cudaStream_t s) {
  // the blocks of all tables (a dry run of the host-side table building)
  const int64_t total_blocks = for_each_table(segs, count, [](const SegmentTable&, int64_t, int64_t) {});
  if (total_blocks == 0) return {};
  double* partial = scratch.as<double>(size_t(2 * total_blocks + 2));
  const int64_t blocks = for_each_table(segs, count, [&](const SegmentTable& t, int64_t n, int64_t first) {
    grad_stats_partial_kernel<<<unsigned(n), kThreads, 0, s>>>(partial + 2 + 2 * first, t, grad_ptr(x));
    TPT_CUDA_LAUNCHED();
  });
  grad_stats_finish_kernel<<<1, 1024, 0, s>>>(partial, partial + 2, blocks);
  TPT_CUDA_LAUNCHED();
  TPT_CUDA_CHECK(cudaMemcpyAsync(pinned, partial, 2 * sizeof(double), cudaMemcpyDeviceToHost, s));
  stream_wait(s);
  return {pinned[0], pinned[1] != 0.0};
}

double sum_squares(CBuf x, int64_t n, DeviceBuffer& scratch, double* pinned, cudaStream_t s) {
  if (n <= 0) return 0.0;
  const unsigned blocks = std::min<unsigned>(blocks_for(n), unsigned(kReduceBlocks));
  double* partial = scratch.as<double>(blocks + 1);
  sum_squares_partial_kernel<<<blocks, kThreads, 0, s>>>(partial + 1, grad_ptr(x), n);
  TPT_CUDA_LAUNCHED();
  sum_partials_kernel<<<1, 1024, 0, s>>>(partial, partial + 1, int(blocks));
  TPT_CUDA_LAUNCHED();
  TPT_CUDA_CHECK(cudaMemcpyAsync(pinned, partial, sizeof(double), cudaMemcpyDeviceToHost, s));
  stream_wait(s);
  return *pinned;
}

bool has_nonfinite(CBuf x, int64_t n, DeviceBuffer& scratch, int* pinned, cudaStream_t s) {
  if (n <= 0) return false;
  int* flag = scratch.as<int>(1);
  TPT_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), s));
  const unsigned blocks = std::min<unsigned>(blocks_for(n), unsigned(4 * kReduceBlocks));
  nonfinite_kernel<<<blocks, kThreads, 0, s>>>(flag, grad_ptr(x), n);
  TPT_CUDA_LAUNCHED();
  TPT_CUDA_CHECK(cudaMemcpyAsync(pinned, flag, sizeof(int), cudaMemcpyDeviceToHost, s));
  stream_wait(s);
  return *pinned != 0;
}

}  // namespace tpt::cuda
