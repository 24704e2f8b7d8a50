// Blended datasets (data/blend.h): Megatron's blending arrays against an independent reading of
// their definition, the window/anchor machinery against a plain replay, and the mapping of global
// samples onto the components' own samplers.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "data/blend.h"
#include "data/doc_masks.h"

namespace tpt {
namespace {

// The definition, written out independently: at every i, the component whose count lags furthest
// behind its share weight * max(i, 1) (megatron-core helpers.cpp; max(i, 1), not i + 1), the lowest
// index on ties; weights normalised by their left-to-right sum (numpy's too for fewer than 8 weights
// or exact sums, as in every vector below).
struct Reference {
  std::vector<int> dataset;
  std::vector<long long> sample;
};
Reference reference_blend(const std::vector<double>& raw, int n) {
  double sum = 0;
  for (double x : raw) sum += x;
  std::vector<double> w;
  for (double x : raw) w.push_back(x / sum);
  std::vector<long long> taken(raw.size(), 0);
  Reference r;
  for (int i = 0; i < n; ++i) {
    const double at = i < 1 ? 1.0 : double(i);
    int best = -1;
    double best_lag = 0;
    for (size_t d = 0; d < w.size(); ++d) {
      const double lag = w[d] * at - double(taken[d]);
      if (best < 0 || lag > best_lag) best = int(d), best_lag = lag;
    }
    r.dataset.push_back(best);
    r.sample.push_back(taken[size_t(best)]++);
  }
  return r;
}

// A corpus of one long document whose tokens are offset + position (so a sample says where it is from).
class RampCorpus final : public TokenCorpus {
 public:
  RampCorpus(int64_t n, int32_t offset) : n_(n), offset_(offset) {}
  int64_t num_documents() const override { return 1; }
  int64_t document_length(int64_t) const override { return n_; }
  void read(int64_t, int64_t off, int64_t n, int32_t* out) const override {
    for (int64_t i = 0; i < n; ++i) out[i] = offset_ + int32_t(off + i);
  }
  std::string description() const override { return "ramp"; }

 private:
  int64_t n_;
  int32_t offset_;
};

std::unique_ptr<BlendedDataset> make_blend(const std::vector<double>& weights, const std::vector<int64_t>& tokens,
                                           int S, bool shuffle) {
  std::vector<std::unique_ptr<GPTDataset>> parts;
  for (size_t d = 0; d < tokens.size(); ++d) {
    auto corpus = std::make_shared<RampCorpus>(tokens[d], int32_t(d) * 100000);
    parts.push_back(std::make_unique<GPTDataset>(corpus, DocRange{0, 1}, S, shuffle, 7));
  }
  return std::make_unique<BlendedDataset>(std::move(parts), weights);
}

const std::vector<std::vector<double>> kWeightVectors = {
    {0.3, 0.7}, {1, 1}, {0.001, 1}, {1, 0.001}, {0.2, 0.3, 0.5}, {5, 1, 1, 3}, {1e-6, 2, 3, 1e-3, 7},
    {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}};  // 11 components: numpy's 8-accumulator sum

TEST(Blend, IndicesMatchTheDefinitionForTenThousandSamples) {
  constexpr int kN = 10000;
  for (const auto& w : kWeightVectors) {
    const Reference ref = reference_blend(w, kN);
    std::vector<int64_t> counts(w.size(), 0);
    std::vector<int16_t> ds(kN);
    std::vector<int64_t> dsi(kN);
    build_blending_indices(normalize_blend_weights(w), 0, kN, counts, ds.data(), dsi.data());
    int mismatches = 0;
    for (int i = 0; i < kN; ++i) mismatches += ds[size_t(i)] != ref.dataset[size_t(i)] || dsi[size_t(i)] != ref.sample[size_t(i)];
    EXPECT_EQ(mismatches, 0) << "weights[0] " << w[0] << ", " << w.size() << " components";
    // and the share of each component is its weight to within one sample
    double sum = std::accumulate(w.begin(), w.end(), 0.0);
    for (size_t d = 0; d < w.size(); ++d) EXPECT_LE(std::abs(double(counts[d]) - w[d] / sum * kN), 1.0 + 1e-9);
  }
}

TEST(Blend, ExactTiesGoToTheLowestIndexWithoutFusedMultiplyAdd) {
  // weights 0.5, 0.1, 0.1, 0.3: at i = 10 every error is exactly 0 once w * i is rounded (0.1 * 10
  // rounds to 1); an FMA would see 0.1 * 10 - 1 = 5.6e-17 > 0 and pick component 1
  std::vector<int64_t> counts(4, 0);
  std::vector<int16_t> ds(12);
  build_blending_indices(normalize_blend_weights({5, 1, 1, 3}), 0, 12, counts, ds.data(), nullptr);
  EXPECT_EQ(ds, (std::vector<int16_t>{0, 3, 1, 0, 2, 0, 3, 0, 3, 0, 0, 3}));
}

TEST(Blend, VeryUnequalWeightsStillDrawTheSmallComponent) {
  std::vector<int64_t> counts(2, 0);
  std::vector<int16_t> ds(10000);
  build_blending_indices(normalize_blend_weights({0.001, 1}), 0, 10000, counts, ds.data(), nullptr);
  EXPECT_EQ(counts[0], 10);  // 10000 / 1001, rounded as the greedy does
  EXPECT_EQ(ds[0], 1);       // 1 * 1 - 0 beats 0.001
}

TEST(Blend, NormalisationSumsAsNumpyDoes) {
  // numpy's pairwise sum of 0.1 x 10 differs from the left-to-right sum in the last bit
  const std::vector<double> w(10, 0.1);
  double seq = 0;
  for (double x : w) seq += x;
  const double pairwise = ((0.1 + 0.1) + (0.1 + 0.1)) + ((0.1 + 0.1) + (0.1 + 0.1)) + 0.1 + 0.1;
  ASSERT_NE(seq, pairwise);
  EXPECT_EQ(normalize_blend_weights(w)[0], 0.1 / pairwise);
}

TEST(Blend, WindowsAnchorsAndRandomAccessAgreeWithOneReplay) {
  const std::vector<double> w = {0.2, 0.3, 0.5};
  const int64_t n = 200000;  // past three windows of 65536
  std::vector<int64_t> counts(3, 0);
  std::vector<int16_t> ds(static_cast<size_t>(n));
  std::vector<int64_t> dsi(static_cast<size_t>(n));
  build_blending_indices(normalize_blend_weights(w), 0, n, counts, ds.data(), dsi.data());
  auto blend = make_blend(w, {1000, 2000, 3000}, 10, false);
  for (int64_t i : {int64_t(199999), int64_t(0), int64_t(65535), int64_t(65536), int64_t(131071), int64_t(7)}) {
    const auto s = blend->source(i);
    EXPECT_EQ(s.dataset, ds[size_t(i)]) << i;
    EXPECT_EQ(s.dataset_sample, dsi[size_t(i)]) << i;
  }
  EXPECT_EQ(blend->counts_at(n), counts);
  // a fresh blend seeded at an unaligned position (as a checkpoint does) continues identically
  auto seeded = make_blend(w, {1000, 2000, 3000}, 10, false);
  std::vector<int64_t> at(3, 0);
  build_blending_indices(normalize_blend_weights(w), 0, 123457, at, nullptr, nullptr);
  seeded->add_anchor(123457, at);
  for (int64_t i = 123457; i < 123457 + 70000; i += 997) {
    EXPECT_EQ(seeded->source(i).dataset, ds[size_t(i)]) << i;
    EXPECT_EQ(seeded->source(i).dataset_sample, dsi[size_t(i)]) << i;
  }
  EXPECT_THROW(seeded->add_anchor(10, {1, 2, 3}), InputError);  // counts must sum to the position
}

TEST(Blend, SamplesComeFromTheComponentsOwnSamplersAndWrapTheirEpochs) {
  const int S = 4;
  for (bool shuffle : {false, true}) {
    auto blend = make_blend({1, 3}, {21, 61}, S, shuffle);  // 5 and 15 samples
    std::vector<int32_t> got(S + 1), want(S + 1);
    for (int64_t i = 0; i < 100; ++i) {  // 25 and 75 draws: 5 epochs of each
      const auto s = blend->source(i);
      blend->get(i, got.data());
      blend->component(s.dataset).get(s.dataset_sample, want.data());
      EXPECT_EQ(got, want);
      EXPECT_EQ(got[0] / 100000, s.dataset);  // the ramp's offset names the component
      EXPECT_EQ(got[0] % 100000, S * blend->component(s.dataset).sample_index(s.dataset_sample));
    }
    EXPECT_EQ(blend->counts_at(100), (std::vector<int64_t>{25, 75}));
  }
  // one component: every global sample is that component's sample at the same position
  auto one = make_blend({0.5}, {41}, S, true);
  for (int64_t i = 0; i < 30; ++i) EXPECT_EQ(one->source(i).dataset_sample, i);
}

TEST(Blend, EstimatedCountsStayWithinAFewSamplesOfTheGreedy) {
  for (const auto& w : kWeightVectors) {
    std::vector<int64_t> tokens(w.size(), 1000);
    auto blend = make_blend(w, tokens, 10, false);
    for (int64_t p : {int64_t(0), int64_t(1), int64_t(7), int64_t(65536 * 3 + 5), int64_t(1000003)}) {
      const std::vector<int64_t> est = blend->estimated_counts(p), exact = blend->counts_at(p);
      EXPECT_EQ(std::accumulate(est.begin(), est.end(), int64_t(0)), p);
      for (size_t d = 0; d < w.size(); ++d) EXPECT_LE(std::abs(est[d] - exact[d]), 3) << "position " << p << " component " << d;
    }
    // a position far beyond any replay: the counts still sum to it, each within one of w * p
    const int64_t huge = int64_t(1) << 61;
    const std::vector<int64_t> est = blend->estimated_counts(huge);
    EXPECT_EQ(std::accumulate(est.begin(), est.end(), int64_t(0)), huge);
    for (size_t d = 0; d < w.size(); ++d)
      EXPECT_LE(std::abs(double(est[d]) - blend->weights()[d] * double(huge)), 1024.0) << d;  // 2^61 * 2^-52 rounding
  }
}

TEST(Blend, ReplayDistanceCountsFromTheNearestKnownState) {
  auto blend = make_blend({0.2, 0.3, 0.5}, {1000, 2000, 3000}, 10, false);
  EXPECT_EQ(blend->replay_distance(200000), 200000);
  (void)blend->source(200000);  // anchors at 65536, 131072 and 196608 on the way
  EXPECT_EQ(blend->replay_distance(200000), 200000 - 196608);
  EXPECT_EQ(blend->replay_distance(int64_t(1) << 50), (int64_t(1) << 50) - 196608);
  EXPECT_EQ(make_blend({1}, {1000}, 10, false)->replay_distance(int64_t(1) << 50), 0);  // one path: no greedy
}

TEST(DocMasks, PositionsRestartAfterEodAndTheLossSkipsEodInputs) {
  const int32_t eod = 9;
  const std::vector<int32_t> t = {1, 2, 9, 3, 9, 9, 4, 5};
  std::vector<int32_t> pos(t.size());
  document_positions(t.data(), int64_t(t.size()), eod, pos.data());
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 0, 1, 0, 0, 1}));
  std::vector<float> w(t.size());
  EXPECT_EQ(eod_loss_mask(t.data(), int64_t(t.size()), eod, w.data()), 5);
  EXPECT_EQ(w, (std::vector<float>{1, 1, 0, 1, 0, 0, 1, 1}));
}

}  // namespace
}  // namespace tpt
