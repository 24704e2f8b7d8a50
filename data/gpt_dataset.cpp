// Splits by documents, the per-split token stream cut into samples, and the per-epoch shuffle
// (docs/ARCHITECTURE.md "Data", "Numerics").
#include <algorithm>
#include <cmath>
#include <mutex>

#include "core/config.h"
#include "core/error.h"
#include "data/dataset.h"

namespace tpt {
namespace {

// Python's round(): to nearest, ties to even (Megatron's split uses int(round(x))).
int64_t round_half_even(double x) {
  const double f = std::floor(x);
  const double d = x - f;
  int64_t r = static_cast<int64_t>(f);
  if (d > 0.5 || (d == 0.5 && (r & 1))) ++r;
  return r;
}

// splitmix64 (Steele, Lea, Flood 2014): a tiny generator whose output is fully specified.
struct SplitMix64 {
  uint64_t state;
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t next() { return mix(state += 0x9E3779B97F4A7C15ull); }
  // Uniform in [0, bound), unbiased (rejects the top 2^64 mod bound values).
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }
};

}  // namespace

std::vector<DocRange> split_documents(int64_t num_documents, const std::vector<double>& weights) {
  const std::string error = split_weights_error(weights);
  if (!error.empty()) input_error("data.split: " + error);
  const std::vector<double>& w = weights;
  const double sum = w[0] + w[1] + w[2];
  // Megatron's get_train_valid_test_split_: cumulative rounded boundaries, then shift all of them
  // so that the last one is num_documents.
  int64_t index[4] = {0, 0, 0, 0};
  for (int i = 0; i < 3; ++i)
    index[i + 1] = index[i] + round_half_even(w[i] / sum * static_cast<double>(num_documents));
  const int64_t diff = index[3] - num_documents;
  for (int i = 1; i < 4; ++i) index[i] -= diff;
  // Megatron can produce a negative boundary when a zero weight comes first (e.g. {0, 1, 1} with 3
  // documents); clamp so that every range is valid and the ranges still tile [0, num_documents).
  for (int i = 1; i < 4; ++i) index[i] = std::clamp(index[i], index[i - 1], num_documents);
  return {{index[0], index[1]}, {index[1], index[2]}, {index[2], index[3]}};
}

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch) {
  TPT_CHECK(n >= 0 && epoch >= 0);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  SplitMix64 rng{SplitMix64::mix(seed) ^ SplitMix64::mix(static_cast<uint64_t>(epoch) ^ 0xD1B54A32D192ED03ull)};
  for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(static_cast<uint64_t>(i) + 1)]);
  return perm;
}

// The permutations of the two most recently used epochs: a global batch that straddles an epoch
// boundary alternates between two of them without rebuilding either.
struct GPTDataset::PermutationCache {
  std::mutex mutex;
  int64_t epoch[2] = {-1, -1};
  std::shared_ptr<const std::vector<int64_t>> perm[2];
  int next = 0;  // slot to replace
};

GPTDataset::GPTDataset(std::shared_ptr<const TokenCorpus> corpus, DocRange docs, int seq_length, bool shuffle,
                       uint64_t seed)
    : corpus_(std::move(corpus)),
      docs_(docs),
      seq_length_(seq_length),
      shuffle_(shuffle),
      seed_(seed),
      cache_(std::make_shared<PermutationCache>()) {
  TPT_CHECK(corpus_ != nullptr && seq_length_ > 0);
  TPT_CHECK(docs_.begin >= 0 && docs_.begin <= docs_.end && docs_.end <= corpus_->num_documents());
  doc_start_.reserve(static_cast<size_t>(docs_.end - docs_.begin + 1));
  doc_start_.push_back(0);
  for (int64_t d = docs_.begin; d < docs_.end; ++d) doc_start_.push_back(doc_start_.back() + corpus_->document_length(d));
  num_samples_ = num_tokens() > 0 ? (num_tokens() - 1) / seq_length_ : 0;
}

int64_t GPTDataset::num_tokens() const { return doc_start_.back(); }
int64_t GPTDataset::num_samples() const { return num_samples_; }

std::shared_ptr<const std::vector<int64_t>> GPTDataset::permutation(int64_t epoch) const {
  PermutationCache& c = *cache_;
  std::lock_guard<std::mutex> lock(c.mutex);
  for (int i = 0; i < 2; ++i)
    if (c.epoch[i] == epoch) {
      c.next = 1 - i;
      return c.perm[i];
    }
  const int slot = c.next;
  c.perm[slot] = std::make_shared<const std::vector<int64_t>>(shuffled_indices(num_samples_, seed_, epoch));
  c.epoch[slot] = epoch;
  c.next = 1 - slot;
  return c.perm[slot];
}

int64_t GPTDataset::sample_index(int64_t position) const {
  TPT_CHECK(position >= 0 && num_samples_ > 0);
  const int64_t within = position % num_samples_;
  if (!shuffle_) return within;
  return (*permutation(position / num_samples_))[static_cast<size_t>(within)];
}

std::pair<int64_t, int64_t> GPTDataset::document_span(int64_t sample) const {
  TPT_CHECK(sample >= 0 && sample < num_samples_);
  const int64_t first = sample * seq_length_, last = first + seq_length_;  // tokens [first, last]
  auto doc_of = [&](int64_t token) {  // the last document starting at or before `token` (skips empty ones)
    return std::upper_bound(doc_start_.begin(), doc_start_.end(), token) - doc_start_.begin() - 1;
  };
  return {docs_.begin + doc_of(first), docs_.begin + doc_of(last)};
}

void GPTDataset::get(int64_t position, int32_t* tokens) const {
  int64_t token = sample_index(position) * seq_length_;  // position in this split's token stream
  int64_t n = static_cast<int64_t>(seq_length_) + 1;
  // The document holding `token`: the last one starting at or before it (skips empty documents).
  int64_t k = std::upper_bound(doc_start_.begin(), doc_start_.end(), token) - doc_start_.begin() - 1;
  while (n > 0) {
    const int64_t within = token - doc_start_[k];
    const int64_t take = std::min(n, doc_start_[k + 1] - token);
    if (take > 0) corpus_->read(docs_.begin + k, within, take, tokens);
    tokens += take;
    token += take;
    n -= take;
    ++k;
  }
}

}  // namespace tpt
