// Megatron's tensor-parallel mappings -- the only places model code communicates.
//   f  (copy_to_tp_region):      identity forward, all-reduce backward   (before column-parallel)
//   g  (reduce_from_tp_region):  all-reduce forward, identity backward   (after row-parallel)
//   gather_from_tp_region:       all-gather forward, split backward      (column-parallel gather_output)
// Buffers live on the communicator's device. With TP = 1 every mapping is free.
#pragma once
#include <cstdint>

#include "parallel/comm.h"

namespace tpt {

// f backward: sum the input gradients of a column-parallel layer over the TP group.
inline void copy_to_tp_region_backward(Comm& tp, float* grad, int64_t n) {
  if (tp.size() > 1) tp.all_reduce(grad, n, ReduceOp::Sum);
}

// g forward: sum the partial outputs of a row-parallel layer over the TP group.
inline void reduce_from_tp_region_forward(Comm& tp, float* x, int64_t n) {
  if (tp.size() > 1) tp.all_reduce(x, n, ReduceOp::Sum);
}

// Column-parallel gather_output: local (N, Ol) on each rank -> full (N, Ol * tp), columns in rank
// order. scratch holds tp * N * Ol floats.
void gather_from_tp_region_forward(Comm& tp, float* full, const float* local, float* scratch,
                                   int64_t N, int64_t Ol);
// Its backward: this rank's columns of dfull (N, Ol * tp) -> dlocal (N, Ol).
void gather_from_tp_region_backward(Comm& tp, float* dlocal, const float* dfull, int64_t N, int64_t Ol);

}  // namespace tpt
