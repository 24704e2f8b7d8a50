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
