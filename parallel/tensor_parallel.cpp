#include "parallel/tensor_parallel.h"

#include <cstring>

namespace tpt {

void all_reduce_half(Comm& tp, Ops& ops, float* x, int64_t n, DType t, float* scratch) {
  const int64_t words = (n + 1) / 2;  // two 16-bit values per float-sized word
  auto* mine = reinterpret_cast<uint16_t*>(scratch);
  float* all = scratch + words;                 // (tp, words)
  float* part = all + words * tp.size();        // (n)
  ops.pack_half(mine, x, n, t);
  tp.all_gather(all, scratch, words);
  for (int r = 0; r < tp.size(); ++r) {
    ops.unpack_half(r == 0 ? x : part, reinterpret_cast<const uint16_t*>(all + words * r), n, t);
    if (r > 0) ops.accumulate(x, part, n);
  }
  ops.round_to(x, n, t);
}

void gather_from_tp_region_forward(Comm& tp, float* full, const float* local, float* scratch,
                                   int64_t N, int64_t Ol) {
  const int T = tp.size();
  tp.all_gather(scratch, local, N * Ol);  // (T, N, Ol)
  for (int r = 0; r < T; ++r)
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(full + n * Ol * T + r * Ol, scratch + (int64_t(r) * N + n) * Ol, Ol * sizeof(float));
}

void gather_from_tp_region_backward(Comm& tp, float* dlocal, const float* dfull, int64_t N, int64_t Ol) {
  const int T = tp.size(), r = tp.rank();
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(dlocal + n * Ol, dfull + n * Ol * T + r * Ol, Ol * sizeof(float));
}

}  // namespace tpt
