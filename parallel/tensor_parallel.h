// Megatron's tensor-parallel mappings -- the only places model code communicates.
//   f  (copy_to_tp_region):      identity forward, all-reduce backward   (before column-parallel)
//   g  (reduce_from_tp_region):  all-reduce forward, identity backward   (after row-parallel)
//   gather_from_tp_region:       all-gather forward, split backward      (column-parallel gather_output)
// and, with sequence parallelism (parallel.sequence_parallel, Korthikanti et al. 2022):
//   gather_from_sequence_parallel_region:      all-gather forward, reduce-scatter backward (before column-parallel)
//   reduce_scatter_to_sequence_parallel_region: reduce-scatter forward, all-gather backward (after row-parallel)
// Buffers live on the communicator's device. With TP = 1 every mapping is free.
#pragma once
#include <cstdint>

#include "core/ops.h"
#include "parallel/comm.h"

namespace tpt {

// The sums of f and g on a tensor x of n elements of the compute dtype x.t, in place. fp32: an
// all-reduce. bf16/fp16: the partial sums travel as 16-bit values (half the bytes of an fp32
// all-reduce) as a reduce-scatter and an all-gather: x cut into tp blocks of ceil(n / tp), an
// all-to-all brings every rank's partial of block `rank` into wire->gather, summed there in fp32 in
// rank order on wire->ops and rounded once to x.t, then the rounded blocks are all-gathered -- each
// element the same bits on every rank as one sum of all the partials in rank order.
struct TPWire {
  Ops* ops;
  Buf gather;  // tp_gather_bytes(n, x.t, tp) bytes
};
void tp_sum(Comm& tp, Buf x, int64_t n, const TPWire* wire = nullptr);
// Bytes of the gather buffer of tp_sum for n elements of t on `tp` ranks (0 when none is needed):
// tp blocks of ceil(n / tp) elements -- about the tensor's own size, whatever tp. The same buffer
// serves sp_reduce_scatter of a full tensor of n elements.
int64_t tp_gather_bytes(int64_t n, DType t, int tp);

// f backward: sum the input gradients of a column-parallel layer over the TP group.
inline void copy_to_tp_region_backward(Comm& tp, Buf grad, int64_t n, const TPWire* wire = nullptr) {
  tp_sum(tp, grad, n, wire);
}

// g forward: sum the partial outputs of a row-parallel layer over the TP group.
inline void reduce_from_tp_region_forward(Comm& tp, Buf x, int64_t n, const TPWire* wire = nullptr) {
  tp_sum(tp, x, n, wire);
}

// Sequence parallelism: the (N, C) activations of the LayerNorm / residual regions are split by
// tokens (rows) into tp contiguous blocks, TP rank r holding rows [r N/tp, (r+1) N/tp). `n` is the
// number of elements of one block (N/tp * C); the full tensor holds tp * n, blocks in rank order.
// fp32: Comm::all_gather / Comm::reduce_scatter. bf16/fp16: the all-gather moves the 16-bit values
// as they are, and the reduce-scatter, like tp_sum, brings every rank's 16-bit partial of this rank's
// block into wire->gather (an all-to-all; tp_gather_bytes(tp * n, t, tp) bytes) and sums them in fp32
// in rank order, rounded once -- the same bits on every layout's rank that holds them.
// full (tp * n) = every rank's shard (n), in rank order.
void sp_all_gather(Comm& tp, Buf full, CBuf shard, int64_t n, const TPWire* wire = nullptr);
// shard (n) = block `rank` of full (tp * n) summed over the ranks.
void sp_reduce_scatter(Comm& tp, Buf shard, CBuf full, int64_t n, const TPWire* wire = nullptr);

// gather_from_sequence_parallel_region forward: this rank's tokens (n) -> all tokens (tp * n), the
// input of a column-parallel GEMM (QKV, fc1, the LM head).
inline void gather_from_sequence_parallel_region_forward(Comm& tp, Buf full, CBuf shard, int64_t n,
                                                         const TPWire* wire = nullptr) {
  sp_all_gather(tp, full, shard, n, wire);
}
// The same gather of n bytes per rank: an FP8 GEMM input's codes (model/fp8_linear.h Fp8TokenGather), cast
// with one scale on every rank; shard may be full + rank * n.
inline void gather_from_sequence_parallel_region_codes(Comm& tp, uint8_t* full, const uint8_t* shard, int64_t n) {
  tp.all_gather(full, shard, n, DType::U8);
}
// Its backward: the column-parallel GEMM's input gradient (tp * n, partial on each rank) summed over
// TP, this rank's tokens kept (n).
inline void gather_from_sequence_parallel_region_backward(Comm& tp, Buf dshard, CBuf dfull, int64_t n,
                                                          const TPWire* wire = nullptr) {
  sp_reduce_scatter(tp, dshard, dfull, n, wire);
}
// reduce_scatter_to_sequence_parallel_region forward: the partial outputs (tp * n) of a row-parallel
// GEMM (attention projection, fc2) or of the vocab-parallel embedding summed over TP, this rank's
// tokens kept (n).
inline void reduce_scatter_to_sequence_parallel_region_forward(Comm& tp, Buf shard, CBuf full, int64_t n,
                                                               const TPWire* wire = nullptr) {
  sp_reduce_scatter(tp, shard, full, n, wire);
}
// Its backward: the gradient of this rank's tokens (n) -> the gradient of all tokens (tp * n).
inline void reduce_scatter_to_sequence_parallel_region_backward(Comm& tp, Buf dfull, CBuf dshard, int64_t n,
                                                                const TPWire* wire = nullptr) {
  sp_all_gather(tp, dfull, dshard, n, wire);
}

// Vocab-parallel cross-entropy (Megatron's _VocabParallelCrossEntropy), fp32 row statistics of the
// logits of this rank's vocabulary rows: the maxima over the whole vocabulary (MAX over TP), then
// the target logits and sums of exponentials (SUM over TP).
inline void vocab_parallel_max(Comm& tp, float* row_max, int64_t n) {
  if (tp.size() > 1) tp.all_reduce(row_max, n, ReduceOp::Max);
}
inline void vocab_parallel_sum(Comm& tp, float* x, int64_t n) {
  if (tp.size() > 1) tp.all_reduce(x, n, ReduceOp::Sum);
}

// FP8 (docs/FP8.md "Amax reduction"): n amaxes (fp32 >= 0 or NaN, in the groups' memory: device groups' on the device)
// made the maximum over each given group in turn (null: none), so that the ranks holding parts of one
// tensor scale it alike. The maximum of the bit patterns (an I32 MAX: for values >= 0 the order of the
// bits is the order of the values, and a NaN's bits are above every other's), which is core/fp8.h's
// fp8_amax_step bit for bit: a NaN on any rank makes the amax a NaN everywhere.
inline void fp8_amax_reduce(float* amax, int n, Comm* const* groups, int num_groups) {
  static_assert(sizeof(float) == sizeof(int32_t));
  for (int g = 0; g < num_groups; ++g)
    if (groups[g] && groups[g]->size() > 1) groups[g]->all_reduce(amax, n, DType::I32, ReduceOp::Max);
}

// Column-parallel gather_output: local (N, Ol) on each rank -> full (N, Ol * tp), columns in rank
// order. scratch holds tp * N * Ol floats. Buffers of `ops` (host or device: rows move by Ops::copy).
void gather_from_tp_region_forward(Ops& ops, Comm& tp, float* full, const float* local, float* scratch,
                                   int64_t N, int64_t Ol);
// Its backward: this rank's columns of dfull (N, Ol * tp) -> dlocal (N, Ol).
void gather_from_tp_region_backward(Ops& ops, Comm& tp, float* dlocal, const float* dfull, int64_t N, int64_t Ol);

}  // namespace tpt
