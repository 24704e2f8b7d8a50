// The byte-pair merge loop shared by every byte-level BPE tokenizer (data/bpe_tokenizer.h: GPT-2's
// vocab.json + merges.txt; data/byte_pair_tokenizer.h: tiktoken's tokenizer.model and Hugging Face's
// tokenizer.json), and the per-thread cache of encoded pieces they keep.
//
// merge_parts: a piece of text (one pre-tokenizer match) starts as one part per byte; the adjacent
// pair with the lowest rank(left, right) is merged into one part, the leftmost of equal ranks, one
// merge at a time, until no adjacent pair has a rank. This is tiktoken's `byte_pair_merge` and
// Hugging Face tokenizers' `Word::merge_all` (GPT-2's Python `bpe()` merges every occurrence of the
// best pair left to right in one step: the same parts whenever a merge's result ranks after the
// merge itself, as in every trained vocabulary). The tokenizer supplies rank(): tiktoken the rank
// of the concatenated bytes, GPT-2 and tokenizer.json the line of the pair in the merges.
// Short pieces use tiktoken's O(n·merges) scan, long ones (a page of CJK letters is one piece) a
// heap, O(n log n); both give the same parts (tests/unit/llama3_tokenizer_test.cpp checks this).
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tpt::bpe {

inline constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// Hash / equality that let an unordered_map<std::string, V> be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// The key of a merge pair in a StringMap of merge ranks: the left part's length (4 bytes), then both
// parts' bytes.
inline void pair_key(std::string& key, std::string_view left, std::string_view right) {
  const auto n = static_cast<uint32_t>(left.size());
  key.resize(4);
  std::memcpy(key.data(), &n, 4);
  key.append(left);
  key.append(right);
}

}  // namespace tpt::bpe

#if defined(__GLIBCXX__)
// libstdc++ keeps no hash codes in the nodes of a map whose hash it deems "fast" (any hash but its
// own string hashes), and then rehashes every string key it walks past in a bucket: a third of the
// tokenizer's time. Strings are not fast to hash.
template <>
struct std::__is_fast_hash<tpt::bpe::StringHash> : std::false_type {};
#endif

namespace tpt::bpe {

// Pieces longer than this (bytes) take the heap path.
inline constexpr size_t kHeapMergeFrom = 256;

// The parts of `piece` after merging, as their start offsets (the first is 0; part i ends where
// part i + 1 starts, the last at piece.size()). rank(std::string_view left, std::string_view right)
// returns the pair's rank, kNoRank if it never merges.
template <typename RankFn>
void merge_parts(std::string_view piece, const RankFn& rank, std::vector<uint32_t>& starts, bool force_heap = false) {
  const uint32_t n = static_cast<uint32_t>(piece.size());
  starts.clear();
  if (n == 0) return;
  if (n < kHeapMergeFrom && !force_heap) {
    // parts[i] = {start, rank of the pair (part i, part i + 1)}; a sentinel part at n.
    struct Part {
      uint32_t start;
      int32_t rank;
    };
    std::vector<Part> parts(n + 1);
    for (uint32_t i = 0; i <= n; ++i) parts[i] = {i, kNoRank};
    auto pair_rank = [&](size_t i) -> int32_t {  // pair (part i, part i + 1); needs i + 2 < parts.size()
      const uint32_t a = parts[i].start, b = parts[i + 1].start, e = parts[i + 2].start;
      return rank(piece.substr(a, b - a), piece.substr(b, e - b));
    };
    for (size_t i = 0; i + 2 < parts.size(); ++i) parts[i].rank = pair_rank(i);
    while (parts.size() > 2) {
      int32_t best = kNoRank;
      size_t at = 0;
      for (size_t i = 0; i + 2 < parts.size(); ++i)
        if (parts[i].rank < best) best = parts[i].rank, at = i;
      if (best == kNoRank) break;
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
      parts[at].rank = at + 2 < parts.size() ? pair_rank(at) : kNoRank;
      if (at > 0) parts[at - 1].rank = pair_rank(at - 1);
    }
    for (size_t i = 0; i + 1 < parts.size(); ++i) starts.push_back(parts[i].start);
    return;
  }
  // Heap path: parts as a linked list over byte offsets; candidate pairs ordered by (rank, start of
  // the left part); a candidate is stale once either of its parts has changed.
  std::vector<uint32_t> next(n + 1), prev(n + 1);
  std::vector<char> alive(n + 1, 1);
  for (uint32_t i = 0; i <= n; ++i) next[i] = i + 1, prev[i] = i == 0 ? 0 : i - 1;
  struct Cand {
    int32_t rank;
    uint32_t left, right, end;  // left part [left, right), right part [right, end)
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](uint32_t left) {  // the pair starting at part `left`, if it has a right neighbour
    const uint32_t right = next[left];
    if (right >= n) return;
    const uint32_t end = next[right];
    const int32_t r = rank(piece.substr(left, right - left), piece.substr(right, end - right));
    if (r != kNoRank) heap.push({r, left, right, end});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || next[c.right] != c.end) continue;
    alive[c.right] = 0;  // merge: the left part now ends at c.end
    next[c.left] = c.end;
    if (c.end <= n) prev[c.end] = c.left;
    if (c.left > 0) push(prev[c.left]);
    push(c.left);
  }
  for (uint32_t i = 0; i < n; i = next[i]) starts.push_back(i);
}

// A cache of encoded pieces for one tokenizer, one per thread (tokenizers are shared by the
// preprocessing threads): get() hands out the calling thread's map, emptied when it last served
// another tokenizer.
class PieceCache {
 public:
  using Map = StringMap<std::vector<int32_t>>;
  PieceCache();
  Map& get() const;
  // Entries a thread keeps at most, and the longest piece worth keeping (bytes).
  static constexpr size_t kMaxEntries = 1u << 18, kMaxPieceBytes = 128;

 private:
  uint64_t id_;  // unique per tokenizer object, never reused
};

}  // namespace tpt::bpe
