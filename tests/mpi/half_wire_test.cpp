// bf16/fp16 tensor-parallel sums (all_reduce_half): 16-bit values on the wire, summed in fp32 in
// rank order, rounded -- checked against the sum computed by hand from every rank's rounded values.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/ops.h"
#include "parallel/runtime.h"
#include "parallel/tensor_parallel.h"

namespace tpt {
namespace {

float value(int rank, int64_t i) { return std::sin(0.37f * float(i) + 1.3f * float(rank)) * (1.0f + float(i % 7)); }

TEST(MpiHalfWire, SumOfRoundedValuesInRankOrder) {
  Grid g = make_grid(runtime_world_size(), 1, 1);  // one TP group of the whole world
  auto ops = make_cpu_ops(1);
  for (DType t : {DType::BF16, DType::F16}) {
    const int64_t n = 1001;  // odd: the last 16-bit word is half used
    // every rank computes every rank's values with the same code (so vectorised and scalar sinf
    // cannot disagree between ranks), keeps its own row as input
    std::vector<std::vector<float>> v(size_t(g.tp), std::vector<float>(static_cast<size_t>(n)));
    for (int r = 0; r < g.tp; ++r)
      for (int64_t i = 0; i < n; ++i) v[size_t(r)][size_t(i)] = value(r, i);
    std::vector<float> x = v[size_t(g.tp_rank)];
    std::vector<float> scratch(static_cast<size_t>((g.tp + 1) * ((n + 1) / 2) + n));
    all_reduce_half(*g.tp_group, *ops, x.data(), n, t, scratch.data());
    for (int64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < g.tp; ++r) want += round_to(v[size_t(r)][size_t(i)], t);
      ASSERT_EQ(x[size_t(i)], round_to(want, t)) << "element " << i << " dtype " << int(t);
    }
  }
}

}  // namespace
}  // namespace tpt
