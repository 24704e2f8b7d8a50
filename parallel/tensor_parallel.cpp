#include "parallel/tensor_parallel.h"

#include <cstring>

namespace tpt {

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
