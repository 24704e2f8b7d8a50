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

// The sums of f and g on a tensor x of n elements of the compute dtype x.t, in place. fp32: an
// all-reduce. bf16/fp16: the partial sums travel as 16-bit values (half the bytes of an fp32
// all-reduce) -- an all-gather of every rank's values into wire->gather, then a sum in fp32 in rank
// order on wire->ops (identical on every rank), rounded once to x.t.
struct TPWire {
  Ops* ops;
  Buf gather;  // tp_gather_bytes(n, x.t, tp) bytes
};
void tp_sum(Comm& tp, Buf x, int64_t n, const TPWire* wire = nullptr);
// Bytes of the gather buffer of tp_sum for n elements of t on `tp` ranks (0 when none is needed).
int64_t tp_gather_bytes(int64_t n, DType t, int tp);

// f backward: sum the input gradients of a column-parallel layer over the TP group.
inline void copy_to_tp_region_backward(Comm& tp, Buf grad, int64_t n, const TPWire* wire = nullptr) {
  tp_sum(tp, grad, n, wire);
}

// g forward: sum the partial outputs of a row-parallel layer over the TP group.
inline void reduce_from_tp_region_forward(Comm& tp, Buf x, int64_t n, const TPWire* wire = nullptr) {
  tp_sum(tp, x, n, wire);
}

// Column-parallel gather_output: local (N, Ol) on each rank -> full (N, Ol * tp), columns in rank
// order. scratch holds tp * N * Ol floats. Buffers of `ops` (host or device: rows move by Ops::copy).
void gather_from_tp_region_forward(Ops& ops, Comm& tp, float* full, const float* local, float* scratch,
                                   int64_t N, int64_t Ol);
// Its backward: this rank's columns of dfull (N, Ol * tp) -> dlocal (N, Ol).
void gather_from_tp_region_backward(Ops& ops, Comm& tp, float* dlocal, const float* dfull, int64_t N, int64_t Ol);

}  // namespace tpt
