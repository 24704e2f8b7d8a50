#include "parallel/tensor_parallel.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace tpt {

int64_t tp_gather_bytes(int64_t n, DType t, int tp) {
  if (t == DType::F32 || tp == 1) return 0;
  return dtype_size(int64_t(tp) * ((n + tp - 1) / tp), t);
}

namespace {
// The fp32 sum in rank order of every rank's partial of this rank's block of `counts` (one per rank,
// back to back in x), into out: an all-to-all of the blocks into gather (tp, counts[rank]), then
// Ops::sum_parts.
void sum_own_block(Comm& tp, Buf out, CBuf x, const std::vector<int64_t>& counts, const TPWire& wire) {
  const int T = tp.size();
  const int64_t mine = counts[size_t(tp.rank())];
  tp.all_to_all_v(x.p, counts, wire.gather.p, std::vector<int64_t>(size_t(T), mine), x.t);
  wire.ops->sum_parts(out, wire.gather, T, mine);
}
}  // namespace

void tp_sum(Comm& tp, Buf x, int64_t n, const TPWire* wire) {
  if (tp.size() == 1) return;
  if (x.t == DType::F32) return tp.all_reduce(x.f32(), n, ReduceOp::Sum);
  TPT_CHECK(wire && wire->gather && wire->gather.t == x.t);
  const int T = tp.size(), me = tp.rank();
  const int64_t b = (n + T - 1) / T;  // block r: [r b, min(n, (r + 1) b))
  std::vector<int64_t> counts(static_cast<size_t>(T));
  for (int r = 0; r < T; ++r) counts[size_t(r)] = std::clamp<int64_t>(n - int64_t(r) * b, 0, b);
  const Buf own = x + int64_t(me) * b;
  sum_own_block(tp, own, x, counts, *wire);
  if (n == int64_t(T) * b) return tp.all_gather(x.p, own.p, b, x.t);  // in place
  // blocks of unequal length: gathered as whole blocks of b behind each other in wire->gather
  const Buf gather = wire->gather;
  wire->ops->copy(gather + int64_t(me) * b, own, counts[size_t(me)]);
  tp.all_gather(gather.p, (gather + int64_t(me) * b).p, b, x.t);
  wire->ops->copy(x, gather, n);
}

void sp_all_gather(Comm& tp, Buf full, CBuf shard, int64_t n, const TPWire*) {
  TPT_CHECK(full.t == shard.t);
  tp.all_gather(full.p, shard.p, n, shard.t);
}

void sp_reduce_scatter(Comm& tp, Buf shard, CBuf full, int64_t n, const TPWire* wire) {
  TPT_CHECK(full.t == shard.t);
  if (shard.t == DType::F32) return tp.reduce_scatter(shard.f32(), full.f32(), n);
  if (tp.size() == 1) return tp.all_gather(shard.p, full.p, n, shard.t);  // nothing to sum: a copy
  TPT_CHECK(wire && wire->gather && wire->gather.t == shard.t);
  sum_own_block(tp, shard, full, std::vector<int64_t>(size_t(tp.size()), n), *wire);
}

void gather_from_tp_region_forward(Ops& ops, Comm& tp, float* full, const float* local, float* scratch,
                                   int64_t N, int64_t Ol) {
  const int T = tp.size();
  tp.all_gather(scratch, local, N * Ol);  // (T, N, Ol)
  for (int r = 0; r < T; ++r)
    for (int64_t n = 0; n < N; ++n) ops.copy(full + n * Ol * T + r * Ol, scratch + (int64_t(r) * N + n) * Ol, Ol);
}

void gather_from_tp_region_backward(Ops& ops, Comm& tp, float* dlocal, const float* dfull, int64_t N, int64_t Ol) {
  const int T = tp.size(), r = tp.rank();
  for (int64_t n = 0; n < N; ++n) ops.copy(dlocal + n * Ol, dfull + n * Ol * T + r * Ol, Ol);
}

}  // namespace tpt
