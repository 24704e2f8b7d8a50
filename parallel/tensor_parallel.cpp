#include "parallel/tensor_parallel.h"

#include "core/error.h"

namespace tpt {

int64_t tp_gather_bytes(int64_t n, DType t, int tp) {
  if (t == DType::F32 || tp == 1) return 0;
  // tp messages of whole 4-byte words; for odd n the parts are then moved next to each other
  return int64_t(tp) * words_of(n, t) * 4 + (n % 2 ? int64_t(tp) * dtype_size(n, t) : 0);
}

void tp_sum(Comm& tp, Buf x, int64_t n, const TPWire* wire) {
  if (tp.size() == 1) return;
  if (x.t == DType::F32) return tp.all_reduce(x.f32(), n, ReduceOp::Sum);
  TPT_CHECK(wire && wire->gather && wire->gather.t == x.t);
  Ops& ops = *wire->ops;
  const Buf gather = wire->gather;
  const int64_t words = words_of(n, x.t);
  tp.all_gather(static_cast<float*>(gather.p), static_cast<const float*>(x.p), words);  // (tp, words)
  Buf parts = gather;
  if (n % 2) {  // each part padded to a whole word: pack them as (tp, n) behind the gathered words
    parts = Buf(static_cast<char*>(gather.p) + int64_t(tp.size()) * words * 4, x.t);
    for (int r = 0; r < tp.size(); ++r) ops.copy(parts + int64_t(r) * n, CBuf(gather) + int64_t(r) * 2 * words, n);
  }
  ops.sum_parts(x, parts, tp.size(), n);
}

void sp_all_gather(Comm& tp, Buf full, CBuf shard, int64_t n, const TPWire* wire) {
  TPT_CHECK(full.t == shard.t);
  if (shard.t == DType::F32) return tp.all_gather(full.f32(), shard.f32(), n);
  const int T = tp.size();
  const int64_t words = words_of(n, shard.t);
  if (n % 2 == 0)  // the 16-bit blocks are whole 4-byte words: gathered straight into place
    return tp.all_gather(static_cast<float*>(full.p), static_cast<const float*>(shard.p), words);
  // odd n: each block travels padded to whole words, then moves next to the others
  TPT_CHECK(wire && wire->gather && wire->gather.t == shard.t);
  const Buf gather = wire->gather;
  tp.all_gather(static_cast<float*>(gather.p), static_cast<const float*>(shard.p), words);  // (T, words)
  for (int r = 0; r < T; ++r) wire->ops->copy(full + int64_t(r) * n, CBuf(gather) + int64_t(r) * 2 * words, n);
}

void sp_reduce_scatter(Comm& tp, Buf shard, CBuf full, int64_t n, const TPWire* wire) {
  TPT_CHECK(full.t == shard.t);
  if (shard.t == DType::F32) return tp.reduce_scatter(shard.f32(), full.f32(), n);
  const int T = tp.size(), me = tp.rank();
  if (T == 1 && n % 2 == 0)  // nothing to sum: a copy
    return tp.all_gather(static_cast<float*>(shard.p), static_cast<const float*>(full.p), n / 2);
  TPT_CHECK(wire && wire->gather && wire->gather.t == shard.t);
  Ops& ops = *wire->ops;
  const Buf gather = wire->gather;
  const int64_t stride = 2 * words_of(int64_t(T) * n, shard.t);  // elements per gathered partial (T * n, padded)
  tp.all_gather(static_cast<float*>(gather.p), static_cast<const float*>(full.p), stride / 2);  // (T, stride)
  // Pack this rank's block of every partial as (T, n) at the front, in place: block r moves from
  // r * stride + me * n down to r * n. With T >= 2 that never overlaps itself (except r = me = 0,
  // already in place) nor a block not yet moved (which lie at >= (r + 1) * stride >= 2 (r + 1) n).
  for (int r = 0; r < T; ++r)
    if (int64_t(r) * stride + int64_t(me) * n != int64_t(r) * n)
      ops.copy(gather + int64_t(r) * n, CBuf(gather) + int64_t(r) * stride + int64_t(me) * n, n);
  ops.sum_parts(shard, gather, T, n);
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
