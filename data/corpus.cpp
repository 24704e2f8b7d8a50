// Token corpora: memory-mapped Megatron indexed datasets (.idx/.bin) and llm.c shards, validated
// once at open (docs/ARCHITECTURE.md "Data formats"): every inconsistency is an InputError naming
// the file, so a bad file never crashes a run halfway through.
#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/mmap_file.h"
#include "data/dataset.h"
#include "data/megatron_format.h"

namespace tpt {
namespace {

template <typename T>
T load(const uint8_t* p) {  // unaligned little-endian load (the .idx arrays start at byte 34)
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Calls f(T{}) with T the C++ type of a Megatron integer dtype code.
template <typename F>
void with_token_type(int code, F&& f) {
  switch (code) {
    case megatron::kU8: f(uint8_t{}); break;
    case megatron::kI8: f(int8_t{}); break;
    case megatron::kI16: f(int16_t{}); break;
    case megatron::kI32: f(int32_t{}); break;
    case megatron::kI64: f(int64_t{}); break;
    case megatron::kU16: f(uint16_t{}); break;
    default: TPT_CHECK(false && "token dtype validated at open");
  }
}

template <typename T>
void decode_tokens(const uint8_t* src, int64_t n, int32_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(load<T>(src + i * sizeof(T)));
}

// Smallest and largest token of n tokens of type T at src.
template <typename T>
void token_range(const uint8_t* src, int64_t n, int64_t& lo, int64_t& hi) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(load<T>(src + i * sizeof(T)));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
}

// Index of the first token of n outside [0, vocab_size), or -1.
template <typename T>
int64_t first_bad_token(const uint8_t* src, int64_t n, int vocab_size) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(load<T>(src + i * sizeof(T)));
    if (v < 0 || v >= vocab_size) return i;
  }
  return -1;
}

std::string human_count(int64_t n) {
  char buf[32];
  if (n < 10000) return std::to_string(n);
  if (n < 10000000) std::snprintf(buf, sizeof buf, "%.1fK", n / 1e3);
  else if (n < 10000000000LL) std::snprintf(buf, sizeof buf, "%.1fM", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%.1fB", n / 1e9);
  return buf;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ---------------------------------------------------------------------------------------------
// Megatron indexed dataset.

class MegatronCorpus final : public TokenCorpus {
 public:
  MegatronCorpus(const std::string& prefix, int vocab_size)
      : prefix_(prefix), idx_(prefix + ".idx"), bin_(prefix + ".bin") {
    parse_index();
    validate_sequences();
    validate_tokens(vocab_size);
  }

  int64_t num_documents() const override { return num_docs_; }

  int64_t document_length(int64_t doc) const override {
    TPT_CHECK(doc >= 0 && doc < num_docs_);
    return seq_start_[doc_entry(doc + 1)] - seq_start_[doc_entry(doc)];
  }

  void read(int64_t doc, int64_t offset, int64_t n, int32_t* out) const override {
    TPT_CHECK(offset >= 0 && n >= 0 && offset + n <= document_length(doc));
    int64_t token = seq_start_[doc_entry(doc)] + offset;  // position in the whole corpus
    // The sequence holding `token`: the last one starting at or before it (skips empty ones).
    int64_t seq = std::upper_bound(seq_start_.begin(), seq_start_.end(), token) - seq_start_.begin() - 1;
    while (n > 0) {
      const int64_t within = token - seq_start_[seq];
      const int64_t take = std::min(n, seq_size(seq) - within);
      const uint8_t* src = bin_.data() + seq_pointer(seq) + within * static_cast<int64_t>(itemsize_);
      with_token_type(dtype_, [&](auto t) { decode_tokens<decltype(t)>(src, take, out); });
      out += take;
      token += take;
      n -= take;
      ++seq;
    }
  }

  std::string description() const override {
    return "Megatron dataset " + prefix_ + " (" + std::to_string(num_docs_) + " docs, " +
           human_count(seq_start_.back()) + " tokens, " + megatron::dtype_name(dtype_) + ")";
  }

 private:
  [[noreturn]] void idx_error(const std::string& what) const { input_error(idx_.path() + ": " + what); }
  [[noreturn]] void bin_error(const std::string& what) const { input_error(bin_.path() + ": " + what); }

  int64_t seq_size(int64_t s) const { return load<int32_t>(sizes_ + 4 * s); }
  int64_t seq_pointer(int64_t s) const { return load<int64_t>(pointers_ + 8 * s); }
  int64_t doc_entry(int64_t d) const { return load<int64_t>(doc_idx_ + 8 * d); }

  void parse_index() {
    const uint8_t* p = idx_.data();
    const size_t size = idx_.size();
    if (size < megatron::kIdxHeaderBytes)
      idx_error("not a Megatron index: " + std::to_string(size) + " bytes, shorter than the " +
                std::to_string(megatron::kIdxHeaderBytes) + "-byte header");
    if (std::memcmp(p, megatron::kIdxMagic, sizeof megatron::kIdxMagic) != 0)
      idx_error("not a Megatron index: bad magic (expected \"MMIDIDX\\x00\\x00\")");
    const uint64_t version = load<uint64_t>(p + 9);
    if (version != megatron::kIdxVersion)
      idx_error("unsupported index version " + std::to_string(version) + " (expected 1)");
    dtype_ = p[17];
    itemsize_ = megatron::dtype_itemsize(dtype_);
    if (itemsize_ == 0) idx_error("unknown dtype code " + std::to_string(dtype_));
    if (!megatron::dtype_is_integer(dtype_))
      idx_error("dtype " + megatron::dtype_name(dtype_) + " (code " + std::to_string(dtype_) +
                ") is not an integer token type");
    const uint64_t nseq = load<uint64_t>(p + 18);
    const uint64_t ndoc = load<uint64_t>(p + 26);
    // Expected length, computed without overflow: counts larger than the file are rejected first.
    const uint64_t body = size - megatron::kIdxHeaderBytes;
    if (nseq > body / 12 || ndoc > body / 8 || 12 * nseq + 8 * ndoc != body)
      idx_error("length " + std::to_string(size) + " bytes does not match its header (" + std::to_string(nseq) +
                " sequences and " + std::to_string(ndoc) + " document index entries need " +
                (nseq > body || ndoc > body ? std::string("more")
                                            : std::to_string(megatron::kIdxHeaderBytes + 12 * nseq + 8 * ndoc)) +
                " bytes); truncated or corrupt?");
    if (ndoc == 0) idx_error("empty document index (it must start with 0 and end with the sequence count)");
    num_seqs_ = static_cast<int64_t>(nseq);
    num_docs_ = static_cast<int64_t>(ndoc) - 1;
    sizes_ = p + megatron::kIdxHeaderBytes;
    pointers_ = sizes_ + 4 * nseq;
    doc_idx_ = pointers_ + 8 * nseq;

    if (doc_entry(0) != 0) idx_error("document index starts at " + std::to_string(doc_entry(0)) + ", not 0");
    for (int64_t d = 1; d <= num_docs_; ++d)
      if (doc_entry(d) < doc_entry(d - 1))
        idx_error("document index decreases at entry " + std::to_string(d) + " (" +
                  std::to_string(doc_entry(d - 1)) + " then " + std::to_string(doc_entry(d)) + ")");
    if (doc_entry(num_docs_) != num_seqs_)
      idx_error("document index ends at " + std::to_string(doc_entry(num_docs_)) + ", not at the sequence count " +
                std::to_string(num_seqs_));
  }

  void validate_sequences() {
    const int64_t bin_size = static_cast<int64_t>(bin_.size());
    const int64_t item = static_cast<int64_t>(itemsize_);
    seq_start_.resize(num_seqs_ + 1);
    seq_start_[0] = 0;
    for (int64_t s = 0; s < num_seqs_; ++s) {
      const int64_t n = seq_size(s), ptr = seq_pointer(s);
      if (n < 0) idx_error("sequence " + std::to_string(s) + " has negative size " + std::to_string(n));
      if (ptr < 0 || ptr > bin_size || n > (bin_size - ptr) / item)
        bin_error("sequence " + std::to_string(s) + " (" + std::to_string(n) + " tokens at byte " +
                  std::to_string(ptr) + ", per " + idx_.path() + ") runs past the end of the file (" +
                  std::to_string(bin_size) + " bytes); truncated?");
      seq_start_[s + 1] = seq_start_[s] + n;
    }
  }

  void validate_tokens(int vocab_size) {
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
    with_token_type(dtype_, [&](auto t) {
      using T = decltype(t);
      int64_t lo_all = lo, hi_all = hi;
      const int64_t nseq = num_seqs_;
#pragma omp parallel for schedule(dynamic, 64) reduction(min : lo_all) reduction(max : hi_all)
      for (int64_t s = 0; s < nseq; ++s) token_range<T>(bin_.data() + seq_pointer(s), seq_size(s), lo_all, hi_all);
      lo = lo_all;
      hi = hi_all;
    });
    if (num_seqs_ == 0 || (lo >= 0 && hi < vocab_size)) return;
    // Name the first offending token.
    int64_t doc = 0;
    for (int64_t s = 0; s < num_seqs_; ++s) {
      while (doc < num_docs_ && doc_entry(doc + 1) <= s) ++doc;
      int64_t i = -1;
      with_token_type(dtype_, [&](auto t) { i = first_bad_token<decltype(t)>(bin_.data() + seq_pointer(s), seq_size(s), vocab_size); });
      if (i < 0) continue;
      int64_t v = 0;
      with_token_type(dtype_, [&](auto t) {
        using T = decltype(t);
        v = static_cast<int64_t>(load<T>(bin_.data() + seq_pointer(s) + i * sizeof(T)));
      });
      bin_error("token " + std::to_string(v) + " at position " + std::to_string(i) + " of sequence " +
                std::to_string(s) + " (document " + std::to_string(doc) + ") is outside the vocabulary [0, " +
                std::to_string(vocab_size) + ")");
    }
    TPT_CHECK(false && "an out-of-range token was found by the scan");
  }

  std::string prefix_;
  MappedFile idx_, bin_;
  int dtype_ = 0;
  size_t itemsize_ = 0;
  int64_t num_seqs_ = 0, num_docs_ = 0;
  const uint8_t* sizes_ = nullptr;     // int32[num_seqs_] inside idx_
  const uint8_t* pointers_ = nullptr;  // int64[num_seqs_]: byte offsets into bin_
  const uint8_t* doc_idx_ = nullptr;   // int64[num_docs_ + 1]: first sequence of each document
  std::vector<int64_t> seq_start_;     // token offset of each sequence in the corpus; back() = total
};

// ---------------------------------------------------------------------------------------------
// llm.c shards: one document each; uint16 tokens (GPT-2's, version 1) or uint32 (Llama 3's, version 7).

bool has_llmc_magic(const std::string& path) {
  MappedFile f(path);
  if (f.size() < 4) return false;
  const int32_t magic = load<int32_t>(f.data());
  return magic == llmc::kMagic || magic == llmc::kMagicLlama3;
}

class LlmcCorpus final : public TokenCorpus {
 public:
  LlmcCorpus(const std::string& what, const std::vector<std::string>& paths, int vocab_size) : what_(what) {
    for (const std::string& path : paths) open_shard(path, vocab_size);
  }

  int64_t num_documents() const override { return static_cast<int64_t>(shards_.size()); }
  int64_t document_length(int64_t doc) const override {
    TPT_CHECK(doc >= 0 && doc < num_documents());
    return shards_[doc].num_tokens;
  }
  void read(int64_t doc, int64_t offset, int64_t n, int32_t* out) const override {
    TPT_CHECK(offset >= 0 && n >= 0 && offset + n <= document_length(doc));
    const Shard& s = shards_[doc];
    const uint8_t* src = s.file.data() + llmc::kHeaderBytes + s.itemsize * offset;
    if (s.itemsize == 2) decode_tokens<uint16_t>(src, n, out);
    else decode_tokens<uint32_t>(src, n, out);  // < vocab_size, checked at open
  }
  std::string description() const override {
    int64_t total = 0;
    bool u16 = false, u32 = false;
    for (const Shard& s : shards_) {
      total += s.num_tokens;
      (s.itemsize == 2 ? u16 : u32) = true;
    }
    return "llm.c shards " + what_ + " (" + std::to_string(shards_.size()) + " shard" +
           (shards_.size() == 1 ? "" : "s") + ", " + human_count(total) + " tokens, " +
           (u16 && u32 ? "uint16 and uint32" : u32 ? "uint32" : "uint16") + ")";
  }

 private:
  struct Shard {
    MappedFile file;
    int64_t num_tokens = 0;
    int64_t itemsize = 2;  // uint16 (version 1) or uint32 (version 7)
  };

  void open_shard(const std::string& path, int vocab_size) {
    Shard shard{MappedFile(path), 0};
    const MappedFile& f = shard.file;
    auto bad = [&](const std::string& what) { input_error(path + ": " + what); };
    if (f.size() < llmc::kHeaderBytes)
      bad("not an llm.c shard: " + std::to_string(f.size()) + " bytes, shorter than the 1024-byte header");
    const int32_t magic = load<int32_t>(f.data()), version = load<int32_t>(f.data() + 4);
    const int32_t count = load<int32_t>(f.data() + 8);
    if (magic != llmc::kMagic && magic != llmc::kMagicLlama3)
      bad("not an llm.c shard: magic " + std::to_string(magic) + " (expected 20240520, GPT-2, or 20240801, Llama 3)");
    if (magic == llmc::kMagic && version != llmc::kVersion)
      bad("unsupported llm.c shard version " + std::to_string(version) + " (expected 1: uint16 tokens, with magic 20240520)");
    if (magic == llmc::kMagicLlama3 && version != llmc::kVersionLlama3)
      bad("unsupported llm.c shard version " + std::to_string(version) + " (expected 7: uint32 tokens, with magic 20240801)");
    if (count < 0) bad("negative token count " + std::to_string(count) + " in the header");
    shard.itemsize = magic == llmc::kMagic ? 2 : 4;
    const uint64_t expected = llmc::kHeaderBytes + static_cast<uint64_t>(shard.itemsize) * static_cast<uint64_t>(count);
    if (expected > f.size())
      bad("header declares " + std::to_string(count) + " tokens (" + std::to_string(expected) +
          " bytes) but the file has only " + std::to_string(f.size()) + " bytes; truncated?");
    if (expected < f.size())
      bad("file has " + std::to_string(f.size() - expected) + " bytes after the " + std::to_string(count) +
          " tokens its header declares");
    shard.num_tokens = count;

    // Every token must be < vocab_size (unsigned tokens are never negative).
    const uint8_t* tokens = f.data() + llmc::kHeaderBytes;
    const int64_t item = shard.itemsize;
    const int64_t chunk = 1 << 20, nchunks = (shard.num_tokens + chunk - 1) / chunk;
    int64_t hi = -1;
#pragma omp parallel for schedule(static) reduction(max : hi)
    for (int64_t c = 0; c < nchunks; ++c) {
      int64_t lo_unused = 0;
      const int64_t n = std::min(chunk, shard.num_tokens - c * chunk);
      if (item == 2) token_range<uint16_t>(tokens + item * c * chunk, n, lo_unused, hi);
      else token_range<uint32_t>(tokens + item * c * chunk, n, lo_unused, hi);
    }
    if (hi >= vocab_size) {
      const int64_t i = item == 2 ? first_bad_token<uint16_t>(tokens, shard.num_tokens, vocab_size)
                                  : first_bad_token<uint32_t>(tokens, shard.num_tokens, vocab_size);
      const int64_t v = item == 2 ? int64_t(load<uint16_t>(tokens + 2 * i)) : int64_t(load<uint32_t>(tokens + 4 * i));
      bad("token " + std::to_string(v) + " at position " + std::to_string(i) + " is outside the vocabulary [0, " +
          std::to_string(vocab_size) + ")");
    }
    shards_.push_back(std::move(shard));
  }

  std::string what_;
  std::vector<Shard> shards_;
};

std::vector<std::string> glob_paths(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) input_error("data path '" + pattern + "': glob failed");
  std::sort(paths.begin(), paths.end());  // byte order, whatever the locale
  return paths;
}

}  // namespace

std::unique_ptr<TokenCorpus> open_corpus(const std::string& path, int vocab_size) {
  if (vocab_size <= 0) input_error("open_corpus: vocab_size must be positive, got " + std::to_string(vocab_size));
  if (path.find_first_of("*?[") != std::string::npos) {
    std::vector<std::string> paths = glob_paths(path);
    if (paths.empty()) input_error("data path '" + path + "': no file matches this pattern");
    for (const std::string& p : paths)
      if (!has_llmc_magic(p))
        input_error(p + ": not an llm.c shard (matched by '" + path + "'; a glob must match llm.c .bin shards only)");
    return std::make_unique<LlmcCorpus>(path, paths, vocab_size);
  }
  if (ends_with(path, ".bin") && file_exists(path)) {
    if (has_llmc_magic(path)) return std::make_unique<LlmcCorpus>(path, std::vector<std::string>{path}, vocab_size);
    // Perhaps the .bin half of a Megatron dataset given with its extension.
    const std::string stem = path.substr(0, path.size() - 4);
    if (file_exists(stem + ".idx")) return std::make_unique<MegatronCorpus>(stem, vocab_size);
    input_error(path + ": neither an llm.c shard (its first int32 is not 20240520 or 20240801) nor the .bin of a "
                "Megatron dataset (no " + stem + ".idx)");
  }
  if (ends_with(path, ".idx") && file_exists(path) && !file_exists(path + ".idx"))
    return std::make_unique<MegatronCorpus>(path.substr(0, path.size() - 4), vocab_size);
  for (const char* ext : {".idx", ".bin"})
    if (!file_exists(path + ext))
      input_error(path + ext + ": not found (data path '" + path +
                  "' is read as a Megatron prefix: it needs " + path + ".idx and " + path + ".bin)");
  return std::make_unique<MegatronCorpus>(path, vocab_size);
}

}  // namespace tpt
