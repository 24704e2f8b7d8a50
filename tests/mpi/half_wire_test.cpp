// bf16/fp16 tensor-parallel sums (tp_sum on 16-bit tensors): 16-bit values on the wire, summed in
// fp32 in rank order, rounded -- checked against the sum computed by hand from every rank's values.
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
  for (DType t : {DType::BF16, DType::F16})
    for (int64_t n : {1001, 1000, 3}) {  // uneven blocks (and, for 3 on 4 ranks, an empty one)
      // every rank computes every rank's values with the same code (so vectorised and scalar sinf
      // cannot disagree between ranks), keeps its own row as input
      std::vector<std::vector<float>> v(size_t(g.tp), std::vector<float>(static_cast<size_t>(n)));
      for (int r = 0; r < g.tp; ++r)
        for (int64_t i = 0; i < n; ++i) v[size_t(r)][size_t(i)] = value(r, i);
      std::vector<uint16_t> x(size_t(n + 1));  // the stored tensor, with room for a whole last word
      ops->convert(Buf(x.data(), t), v[size_t(g.tp_rank)].data(), n);
      std::vector<char> gather(size_t(tp_gather_bytes(n, t, g.tp)));
      const TPWire wire{ops.get(), Buf(gather.data(), t)};
      tp_sum(*g.tp_group, Buf(x.data(), t), n, &wire);
      for (int64_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < g.tp; ++r) want += round_to(v[size_t(r)][size_t(i)], t);
        const float got = t == DType::BF16 ? bf16_to_fp32(x[size_t(i)]) : fp16_to_fp32(x[size_t(i)]);
        ASSERT_EQ(got, round_to(want, t)) << "element " << i << " of " << n << " dtype " << int(t);
      }
    }
}

}  // namespace
}  // namespace tpt
