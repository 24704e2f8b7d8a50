// Token datasets (docs/ARCHITECTURE.md "Data formats" and "Numerics"): memory-mapped Megatron
// .bin/.idx and llm.c shards, split by documents, concatenated into one token stream per split,
// cut into samples of seq_length + 1 tokens, visited sequentially or by a seeded per-epoch
// permutation.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tpt {

// A validated, memory-mapped token corpus: a list of documents. Throws InputError naming the
// file on any inconsistency (magic, version, dtype, sizes/pointers past the end, tokens >= vocab).
class TokenCorpus {
 public:
  virtual ~TokenCorpus() = default;
  virtual int64_t num_documents() const = 0;
  virtual int64_t document_length(int64_t doc) const = 0;  // in tokens
  // Copies tokens [offset, offset + n) of document `doc` into out.
  virtual void read(int64_t doc, int64_t offset, int64_t n, int32_t* out) const = 0;
  virtual std::string description() const = 0;  // e.g. "Megatron dataset data/x (1234 docs, 5.6M tokens)"
};

// path: a Megatron prefix (path.idx + path.bin; the path of either file is accepted too), an
// llm.c .bin shard (recognised by its magic), or a glob (* ? [) of llm.c shards (read in byte-wise
// sorted order, one document each). Every token must be in [0, vocab_size); the files stay
// mapped for the corpus's lifetime.
std::unique_ptr<TokenCorpus> open_corpus(const std::string& path, int vocab_size);

// Megatron's split of `num_documents` by weights (e.g. {949, 50, 1}) into [begin, end) ranges
// for train / valid / test.
struct DocRange {
  int64_t begin = 0, end = 0;
};
std::vector<DocRange> split_documents(int64_t num_documents, const std::vector<double>& weights);

// The documents of one split concatenated in order into one token stream, cut into samples:
// sample i = tokens [i*S, i*S + S + 1). Visiting order: with shuffle=false position p is sample
// p % num_samples; with shuffle=true epoch e = p / num_samples uses a permutation seeded by
// (seed, e). Positions past one epoch wrap into the next epoch.
class GPTDataset {
 public:
  GPTDataset(std::shared_ptr<const TokenCorpus> corpus, DocRange docs, int seq_length, bool shuffle,
             uint64_t seed);
  int64_t num_tokens() const;
  int64_t num_samples() const;  // (num_tokens - 1) / seq_length
  // The sample at visiting position `position` (0-based), as S + 1 tokens.
  void get(int64_t position, int32_t* tokens) const;
  int64_t sample_index(int64_t position) const;  // which sample a position visits
  // The documents (numbered as in the corpus) that sample `sample` spans: [first, last].
  std::pair<int64_t, int64_t> document_span(int64_t sample) const;
  DocRange documents() const { return docs_; }

 private:
  struct PermutationCache;  // permutations of recently visited epochs (thread-safe)
  std::shared_ptr<const std::vector<int64_t>> permutation(int64_t epoch) const;

  std::shared_ptr<const TokenCorpus> corpus_;
  DocRange docs_;
  int seq_length_ = 0;
  bool shuffle_ = false;
  uint64_t seed_ = 0;
  std::vector<int64_t> doc_start_;  // token offset of each split document in the stream; back() = num_tokens
  int64_t num_samples_ = 0;
  std::shared_ptr<PermutationCache> cache_;
};

// The permutation of [0, n) that GPTDataset uses for epoch `epoch`: Fisher-Yates driven by a
// splitmix64 stream seeded from (seed, epoch). Fully specified here (no std:: distributions), so
// it is the same on every platform and standard library.
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace tpt
