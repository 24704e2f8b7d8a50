// Megatron's tensor-parallel mappings -- the only places model code communicates.
//   f  (copy_to_tp_region):      identity forward, all-reduce backward   (before column-parallel)
//   g  (reduce_from_tp_region):  all-reduce forward, identity backward   (after row-parallel)
//   gather_from_tp_region:       all-gather forward, split backward      (column-parallel gather_output)
// Buffers live on the communicator's device. With TP = 1 every mapping is free.
#pragma once
#include <cstdint>

#include "core/ops.h"
#include "parallel/comm.h"

namespace tpt {

// The same sums in bf16/fp16 runs: the partial sums travel as 16-bit values (half the bytes of an
// fp32 all-reduce) -- an all-gather of every rank's packed values, then a sum in fp32 in rank
// order (identical on every rank), rounded to t. scratch holds (tp + 1) * ceil(n / 2) + n floats.
void all_reduce_half(Comm& tp, Ops& ops, float* x, int64_t n, DType t, float* scratch);

// How the mappings' sums travel: fp32 (wire == nullptr) or 16-bit values (bf16/fp16 runs).
struct TPWire {
  Ops* ops;
  DType dtype;
  float* scratch;  // see all_reduce_half
};

inline void tp_sum(Comm& tp, float* x, int64_t n, const TPWire* wire) {
  if (tp.size() == 1) return;
  if (wire) all_reduce_half(tp, *wire->ops, x, n, wire->dtype, wire->scratch);
  else tp.all_reduce(x, n, ReduceOp::Sum);
}

// f backward: sum the input gradients of a column-parallel layer over the TP group.
inline void copy_to_tp_region_backward(Comm& tp, float* grad, int64_t n, const TPWire* wire = nullptr) {
  tp_sum(tp, grad, n, wire);
}

// g forward: sum the partial outputs of a row-parallel layer over the TP group.
inline void reduce_from_tp_region_forward(Comm& tp, float* x, int64_t n, const TPWire* wire = nullptr) {
  tp_sum(tp, x, n, wire);
}

// Column-parallel gather_output: local (N, Ol) on each rank -> full (N, Ol * tp), columns in rank
// order. scratch holds tp * N * Ol floats.
void gather_from_tp_region_forward(Comm& tp, float* full, const float* local, float* scratch,
                                   int64_t N, int64_t Ol);
// Its backward: this rank's columns of dfull (N, Ol * tp) -> dlocal (N, Ol).
void gather_from_tp_region_backward(Comm& tp, float* dlocal, const float* dfull, int64_t N, int64_t Ol);

}  // namespace tpt
