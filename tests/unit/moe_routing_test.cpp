// The router's host math (model/moe_routing.h) as it runs: its top-k against a full sort (value
// descending, ties to the lower index, as Megatron's torch.topk on CPU and tptrain's reference), with
// many ties; and the routing, the balancing losses and the backward bitwise the same on 1 and on 3
// OpenMP threads (every sum over tokens runs in token order).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
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

// The aux loss counts the top-k of its own scores (Megatron's compute_routing_scores_for_aux_loss:
// torch.topk of softmax(z)), not the router's choice among the logits: they differ where softmax
// rounds two logits to one score. Against a sort of the scores and a double-precision sum.
TEST(MoERouting, AuxLossCountsTheTopKOfItsOwnScores) {
  const int64_t E = 8, k = 2;
  for (int levels : {0, 3}) {
    const int64_t T = 64;
    std::vector<float> z = logits(T, E, levels, 9);
    // token 0: after expert 2, logits 1e-8 apart round to one softmax score; the router takes expert
    // 1 second (the larger logit), the aux scores' top-k the lower index, expert 0
    std::fill(z.begin(), z.begin() + E, -4.0f);
    z[0] = 0.0f, z[1] = 1e-8f, z[2] = 1.0f;
    RouterOptions o;
    o.E = E, o.k = k, o.aux_coeff = 1e-2;
    const Routing r = route(z.data(), T, o, [](int64_t) { return 0; }, 1, 1, [](std::vector<double>&) {});
    ASSERT_EQ(r.chosen[1], 1);
    std::vector<double> f(static_cast<size_t>(E), 0.0), P(static_cast<size_t>(E), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      const float* zt = z.data() + t * E;
      const float m = *std::max_element(zt, zt + E);
      std::vector<float> s(static_cast<size_t>(E));
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += s[size_t(e)] = std::exp(zt[e] - m);
      for (float& v : s) v /= sum;
      std::vector<int32_t> idx(static_cast<size_t>(E));
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)]; });
      if (t == 0) {
        ASSERT_EQ(idx[1], 0);
      }
      for (int64_t j = 0; j < k; ++j) f[size_t(idx[size_t(j)])] += 1;
      for (int64_t e = 0; e < E; ++e) P[size_t(e)] += s[size_t(e)];
    }
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += f[size_t(e)] * P[size_t(e)];
    const double aux = o.aux_coeff * double(E) / (double(k) * double(T) * double(T)) * dot;
    EXPECT_NEAR(r.aux, aux, 1e-12 * aux) << "levels " << levels;
  }
}

}  // namespace
}  // namespace tpt
