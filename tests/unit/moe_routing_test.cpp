// The router's host math (model/moe_routing.h) as it runs: its top-k against a full sort (value
// descending, ties to the lower index, as Megatron's torch.topk on CPU and tptrain's reference), with
// many ties; and the routing, the balancing losses and the backward bitwise the same on 1 and on 3
// OpenMP threads (every sum over tokens runs in token order).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "model/moe_routing.h"

namespace tpt {
namespace {

std::vector<float> logits(int64_t T, int64_t E, int levels, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> z(size_t(T * E));
  for (float& v : z) v = levels ? float(int(rng() % uint32_t(levels))) * 0.25f : std::normal_distribution<float>()(rng);
  return z;
}

TEST(MoERouting, TopKIsTheSortedOrderWithTiesToTheLowerIndex) {
  const int64_t T = 200, E = 16, k = 5;
  RouterOptions o;
  o.E = E, o.k = k;
  const std::vector<float> z = logits(T, E, 4, 3);  // 4 distinct values: ties everywhere
  const Routing r = route(z.data(), T, o, [](int64_t) { return 0; }, 1, 1, [](std::vector<double>&) {});
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    const float* zt = z.data() + t * E;
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return zt[a] > zt[b]; });
    for (int64_t j = 0; j < k; ++j) ASSERT_EQ(r.chosen[size_t(t * k + j)], idx[size_t(j)]) << "token " << t << " choice " << j;
  }
}

TEST(MoERouting, ThreadsDoNotChangeTheBits) {
  const int64_t T = 256, E = 32, k = 4, B = 4;
  for (MoEScore score : {MoEScore::Softmax, MoEScore::Sigmoid})
    for (MoEBalancing bal : {MoEBalancing::AuxLoss, MoEBalancing::SeqAuxLoss}) {
      RouterOptions o;
      o.E = E, o.k = k, o.score = score, o.balancing = bal, o.aux_coeff = 1e-2, o.z_coeff = 1e-3;
      const std::vector<float> z = logits(T, E, 0, 5);
      std::vector<float> dprob(size_t(T * k));
      for (size_t i = 0; i < dprob.size(); ++i) dprob[i] = 0.01f * float(int(i % 7) - 3);
      auto run = [&](int threads, std::vector<float>& dlogits) {
        omp_set_num_threads(threads);
        const Routing r = route(z.data(), T, o, [&](int64_t t) { return t / (T / B); }, B, 2, [](std::vector<double>&) {});
        dlogits.assign(size_t(T * E), 0.0f);
        routing_backward(r, dprob.data(), o, 0.5f, dlogits.data());
        return r;
      };
      std::vector<float> d1, d3;
      const Routing a = run(1, d1), b = run(3, d3);
      omp_set_num_threads(1);
      EXPECT_EQ(a.expert, b.expert);
      EXPECT_EQ(a.prob, b.prob);
      EXPECT_EQ(a.scores, b.scores);
      EXPECT_EQ(a.dlogits_aux, b.dlogits_aux);
      EXPECT_EQ(a.aux, b.aux);
      EXPECT_EQ(a.z, b.z);
      EXPECT_EQ(d1, d3);
      EXPECT_GT(a.aux, 0);
      EXPECT_GT(a.z, 0);
    }
}

}  // namespace
}  // namespace tpt
