// Megatron's blending arrays, built window by window from anchors (data/blend.h).
#include "data/blend.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace tpt {
namespace {

constexpr int64_t kWindow = int64_t(1) << 16;  // entries decoded at a time; an anchor every kWindow positions

// numpy's pairwise_sum for float64 (numpy/core/src/umath/loops_utils.h.src, PW_BLOCKSIZE 128).
double numpy_pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double res = -0.0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return numpy_pairwise_sum(a, n2) + numpy_pairwise_sum(a + n2, n - n2);
}

}  // namespace

std::vector<double> normalize_blend_weights(const std::vector<double>& weights) {
  TPT_CHECK(!weights.empty());
  const double sum = numpy_pairwise_sum(weights.data(), int64_t(weights.size()));
  std::vector<double> w(weights.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = weights[i] / sum;
  return w;
}

void build_blending_indices(const std::vector<double>& w, int64_t begin, int64_t n, std::vector<int64_t>& counts,
                            int16_t* dataset_index, int64_t* dataset_sample_index) {
  const size_t k = w.size();
  TPT_CHECK(k >= 1 && counts.size() == k && begin >= 0 && n >= 0);
  // Built with -ffp-contract=off (CMakeLists.txt): w * x is rounded before the subtraction, as in
  // helpers.cpp; an FMA would break exact ties (weights 5, 1, 1, 3 at i = 10) the other way.
  for (int64_t i = begin; i < begin + n; ++i) {
    const double x = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = w[0] * x - static_cast<double>(counts[0]);
    for (size_t d = 1; d < k; ++d) {
      const double error = w[d] * x - static_cast<double>(counts[d]);
      if (error > best_error) best_error = error, best = d;
    }
    if (dataset_index) dataset_index[i - begin] = static_cast<int16_t>(best);
    if (dataset_sample_index) dataset_sample_index[i - begin] = counts[best];
    ++counts[best];
  }
}

struct BlendedDataset::Index {
  std::mutex mutex;
  std::map<int64_t, std::vector<int64_t>> anchors;  // position -> counts before it
  int64_t window_begin = -1;                        // decoded entries [window_begin, + dataset.size())
  std::vector<int16_t> dataset;
  std::vector<int64_t> dataset_sample;
};

BlendedDataset::BlendedDataset(std::vector<std::unique_ptr<GPTDataset>> components, const std::vector<double>& weights)
    : components_(std::move(components)), index_(std::make_shared<Index>()) {
  TPT_CHECK(!components_.empty() && components_.size() == weights.size() && components_.size() <= 32767);
  for (const auto& c : components_) TPT_CHECK(c && c->num_samples() >= 1);
  weights_ = normalize_blend_weights(weights);
  index_->anchors[0] = std::vector<int64_t>(components_.size(), 0);
}

BlendedDataset::Source BlendedDataset::source(int64_t position) const {
  TPT_CHECK(position >= 0);
  if (components_.size() == 1) return {0, position};  // the greedy picks component 0 every time
  Index& ix = *index_;
  std::lock_guard<std::mutex> lock(ix.mutex);
  if (ix.window_begin < 0 || position < ix.window_begin ||
      position >= ix.window_begin + int64_t(ix.dataset.size())) {
    auto it = std::prev(ix.anchors.upper_bound(position));  // anchors[0] always exists
    int64_t pos = it->first;
    std::vector<int64_t> counts = it->second;
    for (;;) {  // to the window holding `position`, leaving an anchor at each multiple of kWindow
      const int64_t next = (pos / kWindow + 1) * kWindow;
      if (position < next) break;
      build_blending_indices(weights_, pos, next - pos, counts, nullptr, nullptr);
      pos = next;
      ix.anchors.emplace(pos, counts);
    }
    const int64_t n = (pos / kWindow + 1) * kWindow - pos;
    ix.dataset.resize(size_t(n));
    ix.dataset_sample.resize(size_t(n));
    build_blending_indices(weights_, pos, n, counts, ix.dataset.data(), ix.dataset_sample.data());
    ix.window_begin = pos;
  }
  const size_t j = size_t(position - ix.window_begin);
  return {ix.dataset[j], ix.dataset_sample[j]};
}

void BlendedDataset::get(int64_t position, int32_t* tokens) const {
  const Source s = source(position);
  components_[size_t(s.dataset)]->get(s.dataset_sample, tokens);
}

std::vector<int64_t> BlendedDataset::counts_at(int64_t position) const {
  TPT_CHECK(position >= 0);
  if (components_.size() == 1) return {position};
  std::vector<int64_t> counts;
  int64_t pos = 0;
  {
    std::lock_guard<std::mutex> lock(index_->mutex);
    auto it = std::prev(index_->anchors.upper_bound(position));
    pos = it->first;
    counts = it->second;
  }
  for (;;) {
    const int64_t next = std::min(position, (pos / kWindow + 1) * kWindow);
    build_blending_indices(weights_, pos, next - pos, counts, nullptr, nullptr);
    pos = next;
    if (pos == position) break;
    std::lock_guard<std::mutex> lock(index_->mutex);
    index_->anchors.emplace(pos, counts);
  }
  return counts;
}

int64_t BlendedDataset::replay_distance(int64_t position) const {
  TPT_CHECK(position >= 0);
  if (components_.size() == 1) return 0;
  std::lock_guard<std::mutex> lock(index_->mutex);
  return position - std::prev(index_->anchors.upper_bound(position))->first;
}

std::vector<int64_t> BlendedDataset::estimated_counts(int64_t position) const {
  TPT_CHECK(position >= 0);
  const size_t k = weights_.size();
  std::vector<int64_t> counts(k);
  std::vector<std::pair<double, size_t>> remainder(k);
  int64_t given = 0;
  for (size_t d = 0; d < k; ++d) {
    const double share = weights_[d] * double(position);  // < 2^63: the weights are normalised
    counts[d] = std::min(position, int64_t(std::floor(share)));
    given += counts[d];
    remainder[d] = {share - std::floor(share), d};
  }
  // hand out what rounding down left, largest remainders first (the normalised weights sum to 1 only
  // up to rounding: for a huge position the floors may also overshoot, taken back smallest first)
  std::stable_sort(remainder.begin(), remainder.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t j = 0; given < position; j = (j + 1) % k) ++counts[remainder[j].second], ++given;
  for (size_t j = 0; given > position; j = (j + 1) % k) {  // ends: some count is > 0 while given > 0
    const size_t d = remainder[k - 1 - j].second;
    if (counts[d] > 0) --counts[d], --given;
  }
  return counts;
}

void BlendedDataset::add_anchor(int64_t position, const std::vector<int64_t>& counts) {
  // every earlier position drew exactly one sample: the counts of a state sum to its position
  int64_t total = 0;
  bool ok = position >= 0 && counts.size() == components_.size();
  for (int64_t c : counts) ok = ok && c >= 0 && (total += c) <= position;
  if (!ok || total != position)
    input_error("blend state: per-component counts do not sum to the position " + std::to_string(position) +
                " (or do not match the " + std::to_string(components_.size()) + " components)");
  std::lock_guard<std::mutex> lock(index_->mutex);
  index_->anchors.emplace(position, counts);
}

}  // namespace tpt
