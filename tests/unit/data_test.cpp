// Token datasets: Megatron .idx/.bin and llm.c shards (valid and corrupt), the document split,
// samples across document boundaries, visiting order and shuffling, the byte tokenizer and the
// preprocess document rules. Files are written by hand here, independently of the readers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"
#include "data/indexed_writer.h"
#include "data/text_documents.h"
#include "data/tokenizer.h"

namespace tpt {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

template <typename T>
void put(Bytes& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof v);
  std::memcpy(b.data() + at, &v, sizeof v);
}

void write_file(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void write_text(const std::string& path, const std::string& s) { write_file(path, Bytes(s.begin(), s.end())); }

// A Megatron .idx, byte by byte.
Bytes make_idx(uint8_t dtype, const std::vector<int32_t>& sizes, const std::vector<int64_t>& pointers,
               const std::vector<int64_t>& doc_idx, uint64_t version = 1) {
  Bytes b = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  put<uint64_t>(b, version);
  put<uint8_t>(b, dtype);
  put<uint64_t>(b, sizes.size());
  put<uint64_t>(b, doc_idx.size());
  for (int32_t s : sizes) put(b, s);
  for (int64_t p : pointers) put(b, p);
  for (int64_t d : doc_idx) put(b, d);
  return b;
}

constexpr int64_t kFromTokens = INT64_MIN;  // make_llmc: declare the true token count

Bytes make_llmc(const std::vector<uint16_t>& tokens, int32_t magic = 20240520, int32_t version = 1,
                int64_t declared = kFromTokens) {
  Bytes b;
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(declared != kFromTokens ? declared : static_cast<int64_t>(tokens.size()));
  for (int32_t h : header) put(b, h);
  for (uint16_t t : tokens) put(b, t);
  return b;
}

std::vector<int32_t> read_doc(const TokenCorpus& c, int64_t doc) {
  std::vector<int32_t> out(static_cast<size_t>(c.document_length(doc)));
  c.read(doc, 0, c.document_length(doc), out.data());
  return out;
}

// Runs f, expects an InputError whose message contains every one of `needles`.
void expect_input_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no InputError thrown (expected one mentioning " << needles.at(0) << ")";
  } catch (const InputError& e) {
    for (const std::string& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "message: " << e.what() << "\nmissing: " << n;
  }
}

class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("tpt_data_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Documents: doc0 = [1 2 3] (one sequence), doc1 = [4 5] + [6] (two sequences), doc2 = empty,
  // doc3 = [7 8 9 10]. In the .bin the sequences are stored out of order (seq3 first) to check
  // that the byte pointers are followed.
  std::string write_megatron_u16(const std::string& name) {
    Bytes bin;
    auto add = [&](std::vector<uint16_t> toks) {
      const int64_t at = static_cast<int64_t>(bin.size());
      for (uint16_t t : toks) put(bin, t);
      return at;
    };
    const int64_t p3 = add({7, 8, 9, 10}), p0 = add({1, 2, 3}), p1 = add({4, 5}), p2 = add({6});
    write_file(path(name + ".bin"), bin);
    write_file(path(name + ".idx"), make_idx(8, {3, 2, 1, 4}, {p0, p1, p2, p3}, {0, 1, 3, 3, 4}));
    return path(name);
  }

  std::string dir_;
};

// ---------------------------------------------------------------------------------------------
// Megatron indexed dataset

TEST_F(DataFiles, MegatronReadsDocumentsU16) {
  auto c = open_corpus(write_megatron_u16("ds"), 11);
  ASSERT_EQ(c->num_documents(), 4);
  EXPECT_EQ(read_doc(*c, 0), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(read_doc(*c, 1), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(c->document_length(2), 0);
  EXPECT_EQ(read_doc(*c, 3), (std::vector<int32_t>{7, 8, 9, 10}));
  int32_t two[2];
  c->read(1, 1, 2, two);  // crosses the sequence boundary inside document 1
  EXPECT_EQ(two[0], 5);
  EXPECT_EQ(two[1], 6);
  EXPECT_NE(c->description().find("4 docs"), std::string::npos) << c->description();
  // The .bin or .idx path itself is accepted too.
  EXPECT_EQ(open_corpus(path("ds.bin"), 11)->num_documents(), 4);
  EXPECT_EQ(open_corpus(path("ds.idx"), 11)->num_documents(), 4);
}

TEST_F(DataFiles, MegatronReadsI32HandWritten) {
  Bytes bin;
  for (int32_t t : {100000, 0, 65536, 7}) put(bin, t);
  write_file(path("i32.bin"), bin);
  write_file(path("i32.idx"), make_idx(4, {2, 2}, {0, 8}, {0, 1, 2}));
  auto c = open_corpus(path("i32"), 100001);
  ASSERT_EQ(c->num_documents(), 2);
  EXPECT_EQ(read_doc(*c, 0), (std::vector<int32_t>{100000, 0}));
  EXPECT_EQ(read_doc(*c, 1), (std::vector<int32_t>{65536, 7}));
}

TEST_F(DataFiles, MegatronWriterRoundTripsEveryIntegerDtype) {
  for (int code : {1, 2, 3, 4, 5, 8}) {
    const std::string prefix = path(std::string("w").append(std::to_string(code)));
    {
      IndexedDatasetWriter w(prefix, code);
      w.add_document(std::vector<int32_t>{1, 2, 3});
      w.add_sequence(std::vector<int32_t>{4});
      w.add_sequence(std::vector<int32_t>{});
      w.add_sequence(std::vector<int32_t>{5, 6});
      w.end_document();
      w.add_document(std::vector<int32_t>{127});
      w.finish();
      EXPECT_EQ(w.num_documents(), 3);
      EXPECT_EQ(w.num_tokens(), 7);
    }
    auto c = open_corpus(prefix, 128);
    ASSERT_EQ(c->num_documents(), 3) << "dtype " << code;
    EXPECT_EQ(read_doc(*c, 0), (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(read_doc(*c, 1), (std::vector<int32_t>{4, 5, 6}));
    EXPECT_EQ(read_doc(*c, 2), (std::vector<int32_t>{127}));
    EXPECT_FALSE(fs::exists(prefix + ".bin.tmp-" + std::to_string(::getpid())));
  }
}

TEST_F(DataFiles, MegatronWriterLeavesNothingBehindWhenAbandoned) {
  {
    IndexedDatasetWriter w(path("gone"), 8);
    w.add_document(std::vector<int32_t>{1});
  }
  EXPECT_TRUE(fs::is_empty(dir_));
  expect_input_error([&] { IndexedDatasetWriter w(path("no/such/dir/x"), 8); }, {"no/such/dir/x.bin"});
}

TEST_F(DataFiles, MegatronCorruptionsAreInputErrorsNamingTheFile) {
  const std::string p = write_megatron_u16("ok");
  const Bytes good_bin = [&] {
    std::ifstream f(p + ".bin", std::ios::binary);
    return Bytes(std::istreambuf_iterator<char>(f), {});
  }();
  const std::vector<int32_t> sizes = {3, 2, 1, 4};
  const std::vector<int64_t> ptrs = {8, 14, 18, 0}, docs = {0, 1, 3, 3, 4};
  struct Case {
    std::string name;
    Bytes idx;
    Bytes bin;
    std::string file;  // which file the message must name
    std::string what;
  };
  Bytes bad_magic = make_idx(8, sizes, ptrs, docs);
  bad_magic[0] = 'X';
  Bytes truncated_idx = make_idx(8, sizes, ptrs, docs);
  truncated_idx.resize(truncated_idx.size() - 3);
  Bytes long_idx = make_idx(8, sizes, ptrs, docs);
  long_idx.push_back(0);
  Bytes short_bin = good_bin;
  short_bin.resize(short_bin.size() - 2);
  Bytes big_token = good_bin;
  big_token[0] = 11;  // first token of sequence 3 (document 3) becomes 11 >= vocab 11
  const std::vector<Case> cases = {
      {"magic", bad_magic, good_bin, ".idx", "magic"},
      {"version", make_idx(8, sizes, ptrs, docs, 2), good_bin, ".idx", "version 2"},
      {"f32", make_idx(7, sizes, ptrs, docs), good_bin, ".idx", "not an integer"},
      {"f64", make_idx(6, sizes, ptrs, docs), good_bin, ".idx", "not an integer"},
      {"code9", make_idx(9, sizes, ptrs, docs), good_bin, ".idx", "unknown dtype"},
      {"idxshort", truncated_idx, good_bin, ".idx", "does not match"},
      {"idxlong", long_idx, good_bin, ".idx", "does not match"},
      {"header", Bytes{'M', 'M', 'I', 'D'}, good_bin, ".idx", "header"},
      {"binshort", make_idx(8, sizes, ptrs, docs), short_bin, ".bin", "past the end"},
      {"pointer", make_idx(8, sizes, {8, 14, 18, 19}, docs), good_bin, ".bin", "past the end"},
      {"negptr", make_idx(8, sizes, {8, 14, -2, 0}, docs), good_bin, ".bin", "past the end"},
      {"negsize", make_idx(8, {3, -2, 1, 4}, ptrs, docs), good_bin, ".idx", "negative size"},
      {"docstart", make_idx(8, sizes, ptrs, {1, 1, 3, 3, 4}), good_bin, ".idx", "starts at 1"},
      {"docorder", make_idx(8, sizes, ptrs, {0, 3, 1, 3, 4}), good_bin, ".idx", "decreases"},
      {"docend", make_idx(8, sizes, ptrs, {0, 1, 3, 3, 3}), good_bin, ".idx", "sequence count"},
      {"docempty", make_idx(8, sizes, ptrs, {}), good_bin, ".idx", "empty document index"},
      {"vocab", make_idx(8, sizes, ptrs, docs), big_token, ".bin", "token 11"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string prefix = path("bad_" + c.name);
    write_file(prefix + ".idx", c.idx);
    write_file(prefix + ".bin", c.bin);
    expect_input_error([&] { open_corpus(prefix, 11); }, {prefix + c.file, c.what});
  }
  // A negative token in a signed dtype.
  Bytes neg;
  put<int32_t>(neg, 5);
  put<int32_t>(neg, -1);
  write_file(path("neg.bin"), neg);
  write_file(path("neg.idx"), make_idx(4, {2}, {0}, {0, 1}));
  expect_input_error([&] { open_corpus(path("neg"), 11); }, {path("neg.bin"), "token -1"});
  // Missing halves.
  std::filesystem::remove(p + ".bin");
  expect_input_error([&] { open_corpus(p, 11); }, {p + ".bin", "not found"});
  expect_input_error([&] { open_corpus(path("nothing"), 11); }, {path("nothing.idx"), "not found"});
}

// ---------------------------------------------------------------------------------------------
// llm.c shards

TEST_F(DataFiles, LlmcShardIsOneDocument) {
  write_file(path("shard_000.bin"), make_llmc({50256, 1, 2, 65535}));
  auto c = open_corpus(path("shard_000.bin"), 65536);
  ASSERT_EQ(c->num_documents(), 1);
  EXPECT_EQ(read_doc(*c, 0), (std::vector<int32_t>{50256, 1, 2, 65535}));
  int32_t mid[2];
  c->read(0, 1, 2, mid);
  EXPECT_EQ(mid[0], 1);
  EXPECT_EQ(mid[1], 2);
}

TEST_F(DataFiles, LlmcGlobReadsShardsInSortedOrder) {
  write_file(path("train_002.bin"), make_llmc({3, 3}));
  write_file(path("train_000.bin"), make_llmc({1}));
  write_file(path("train_001.bin"), make_llmc({2, 2, 2}));
  write_file(path("val_000.bin"), make_llmc({9}));
  auto c = open_corpus(path("train_*.bin"), 10);
  ASSERT_EQ(c->num_documents(), 3);
  EXPECT_EQ(read_doc(*c, 0), (std::vector<int32_t>{1}));
  EXPECT_EQ(read_doc(*c, 1), (std::vector<int32_t>{2, 2, 2}));
  EXPECT_EQ(read_doc(*c, 2), (std::vector<int32_t>{3, 3}));
  EXPECT_EQ(open_corpus(path("train_00[01].bin"), 10)->num_documents(), 2);
  EXPECT_EQ(open_corpus(path("*_000.bin"), 10)->num_documents(), 2);
  expect_input_error([&] { open_corpus(path("test_*.bin"), 10); }, {path("test_*.bin"), "no file matches"});
  write_file(path("train_003.bin"), Bytes{1, 2, 3, 4, 5});
  expect_input_error([&] { open_corpus(path("train_*.bin"), 10); }, {path("train_003.bin"), "not an llm.c shard"});
}

TEST_F(DataFiles, LlmcCorruptionsAreInputErrorsNamingTheFile) {
  struct Case {
    std::string name;
    Bytes bytes;
    std::string what;
  };
  Bytes short_header = make_llmc({});
  short_header.resize(100);
  const std::vector<Case> cases = {
      {"magic", make_llmc({1, 2}, 20240521), "neither an llm.c shard"},
      {"version", make_llmc({1, 2}, 20240520, 2), "version 2"},
      {"count_big", make_llmc({1, 2}, 20240520, 1, 3), "truncated"},
      {"count_small", make_llmc({1, 2}, 20240520, 1, 1), "after the 1 tokens"},
      {"count_neg", make_llmc({1, 2}, 20240520, 1, -5), "negative token count"},
      {"header", short_header, "shorter than the 1024-byte header"},
      {"vocab", make_llmc({1, 10, 2}), "token 10 at position 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string p = path(c.name + ".bin");
    write_file(p, c.bytes);
    expect_input_error([&] { open_corpus(p, 10); }, {p, c.what});
    // Through a glob, a corrupt shard is named too.
    const bool shard = c.name != "magic";
    expect_input_error([&] { open_corpus(path(c.name + "*.bin"), 10); },
                       {p, shard ? c.what : "not an llm.c shard"});
  }
  expect_input_error([&] { open_corpus(path("absent.bin"), 10); }, {path("absent.bin"), "not found"});
}

// ---------------------------------------------------------------------------------------------
// Splits (Megatron's get_train_valid_test_split_)

void expect_split(int64_t n, const std::vector<double>& w, const std::vector<int64_t>& bounds) {
  const std::vector<DocRange> r = split_documents(n, w);
  ASSERT_EQ(r.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r[i].begin, bounds[i]) << "split " << i << " of " << n;
    EXPECT_EQ(r[i].end, bounds[i + 1]) << "split " << i << " of " << n;
  }
}

TEST(DataSplit, MatchesMegatronByHand) {
  expect_split(1000, {949, 50, 1}, {0, 949, 999, 1000});
  expect_split(10, {1, 0, 0}, {0, 10, 10, 10});
  expect_split(10, {1, 1, 0}, {0, 5, 10, 10});
  // 7 docs, 80/10/10: round(5.6)=6, +round(0.7)=7, +round(0.7)=8; diff 1 -> [0, 5, 6, 7].
  expect_split(7, {80, 10, 10}, {0, 5, 6, 7});
  // Python rounds half to even: 5 docs, 1:1 -> round(2.5)=2 twice -> [0,2,4,4], diff -1 -> [0,3,5,5].
  expect_split(5, {1, 1, 0}, {0, 3, 5, 5});
  // 3 docs, 1:1 -> round(1.5)=2 twice -> [0,2,4,4], diff 1 -> [0,1,3,3].
  expect_split(3, {1, 1, 0}, {0, 1, 3, 3});
  // {0,1,1} over 3: Megatron gives [0,-1,1,3]; clamped to valid ranges.
  expect_split(3, {0, 1, 1}, {0, 0, 1, 3});
  expect_split(0, {949, 50, 1}, {0, 0, 0, 0});
}

TEST(DataSplit, BadWeightsAreInputErrors) {
  expect_input_error([] { split_documents(10, {}); }, {"data.split"});
  expect_input_error([] { split_documents(10, {1, 1, 1, 1}); }, {"data.split"});
  expect_input_error([] { split_documents(10, {1, -1, 0}); }, {"data.split"});
  expect_input_error([] { split_documents(10, {1, 1}); }, {"data.split"});
  expect_input_error([] { split_documents(10, {0, 0, 0}); }, {"data.split"});
}

// ---------------------------------------------------------------------------------------------
// GPTDataset

// Documents of given lengths whose tokens are their position in the whole corpus.
class CountingCorpus final : public TokenCorpus {
 public:
  explicit CountingCorpus(std::vector<int64_t> lengths) : lengths_(std::move(lengths)) {
    start_.push_back(0);
    for (int64_t n : lengths_) start_.push_back(start_.back() + n);
  }
  int64_t num_documents() const override { return static_cast<int64_t>(lengths_.size()); }
  int64_t document_length(int64_t d) const override { return lengths_.at(d); }
  void read(int64_t d, int64_t off, int64_t n, int32_t* out) const override {
    EXPECT_TRUE(off >= 0 && n > 0 && off + n <= lengths_.at(d)) << "doc " << d << " off " << off << " n " << n;
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(start_[d] + off + i);
  }
  std::string description() const override { return "counting"; }

 private:
  std::vector<int64_t> lengths_, start_;
};

std::vector<int32_t> sample(const GPTDataset& ds, int64_t position, int seq_length) {
  std::vector<int32_t> out(static_cast<size_t>(seq_length) + 1);
  ds.get(position, out.data());
  return out;
}

std::vector<int32_t> iota_vec(int32_t from, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[i] = from + i;
  return v;
}

TEST(DataGPTDataset, SamplesCrossDocumentBoundaries) {
  auto corpus = std::make_shared<CountingCorpus>(std::vector<int64_t>{5, 0, 3, 7});  // 15 tokens
  GPTDataset ds(corpus, {0, 4}, 4, false, 1234);
  EXPECT_EQ(ds.num_tokens(), 15);
  EXPECT_EQ(ds.num_samples(), 3);  // (15 - 1) / 4
  EXPECT_EQ(sample(ds, 0, 4), iota_vec(0, 5));
  EXPECT_EQ(sample(ds, 1, 4), iota_vec(4, 5));  // doc0 end, (empty doc1), doc2, doc3 start
  EXPECT_EQ(sample(ds, 2, 4), iota_vec(8, 5));
  // Sequential positions wrap around every num_samples.
  for (int64_t p = 0; p < 10; ++p) EXPECT_EQ(ds.sample_index(p), p % 3);
  EXPECT_EQ(sample(ds, 4, 4), iota_vec(4, 5));

  // A split covering documents [2, 4) starts its stream at document 2.
  GPTDataset tail(corpus, {2, 4}, 4, false, 1234);
  EXPECT_EQ(tail.num_tokens(), 10);
  EXPECT_EQ(tail.num_samples(), 2);
  EXPECT_EQ(sample(tail, 0, 4), iota_vec(5, 5));
  EXPECT_EQ(sample(tail, 1, 4), iota_vec(9, 5));

  // Too short for one sample, or empty: zero samples, allowed.
  EXPECT_EQ(GPTDataset(corpus, {0, 1}, 5, false, 1).num_samples(), 0);  // 5 tokens, needs 6
  EXPECT_EQ(GPTDataset(corpus, {0, 1}, 4, false, 1).num_samples(), 1);  // exactly S + 1
  EXPECT_EQ(GPTDataset(corpus, {1, 2}, 4, false, 1).num_samples(), 0);
  EXPECT_EQ(GPTDataset(corpus, {4, 4}, 4, false, 1).num_samples(), 0);
}

TEST(DataGPTDataset, ManyDocumentsAreFoundByBinarySearch) {
  auto corpus = std::make_shared<CountingCorpus>(std::vector<int64_t>(200000, 3));  // 600000 tokens
  GPTDataset ds(corpus, {0, 200000}, 16, false, 0);
  EXPECT_EQ(ds.num_samples(), (600000 - 1) / 16);
  for (int64_t s : {int64_t{0}, int64_t{1}, int64_t{12345}, ds.num_samples() - 1})
    EXPECT_EQ(sample(ds, s, 16), iota_vec(static_cast<int32_t>(s * 16), 17));
}

TEST(DataGPTDataset, ShuffleIsADeterministicPermutationPerEpoch) {
  auto corpus = std::make_shared<CountingCorpus>(std::vector<int64_t>{401, 0, 600});  // 1001 tokens
  GPTDataset a(corpus, {0, 3}, 10, true, 1234), b(corpus, {0, 3}, 10, true, 1234), c(corpus, {0, 3}, 10, true, 99);
  const int64_t n = a.num_samples();
  ASSERT_EQ(n, 100);
  std::vector<int64_t> e0, e1, e0_again, other_seed;
  for (int64_t p = 0; p < n; ++p) e0.push_back(a.sample_index(p));
  for (int64_t p = n; p < 2 * n; ++p) e1.push_back(a.sample_index(p));
  for (int64_t p = 0; p < n; ++p) e0_again.push_back(b.sample_index(p));  // another instance
  for (int64_t p = 0; p < n; ++p) other_seed.push_back(c.sample_index(p));
  for (const auto* perm : {&e0, &e1, &other_seed}) {
    std::set<int64_t> seen(perm->begin(), perm->end());
    EXPECT_EQ(seen.size(), static_cast<size_t>(n));
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), n - 1);
  }
  EXPECT_EQ(e0, e0_again);
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, other_seed);
  std::vector<int64_t> identity(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) identity[i] = i;
  EXPECT_NE(e0, identity);
  // Going back to an earlier epoch gives the same order again; get() reads the visited sample.
  EXPECT_EQ(a.sample_index(3), e0[3]);
  EXPECT_EQ(sample(a, n + 7, 10), iota_vec(static_cast<int32_t>(e1[7] * 10), 11));
}

TEST(DataGPTDataset, ShuffleMatchesTheDocumentedGenerator) {
  // Computed by an independent Python transcription of splitmix64 + Fisher-Yates (dataset.h).
  EXPECT_EQ(shuffled_indices(10, 1234, 0), (std::vector<int64_t>{5, 0, 1, 4, 3, 2, 9, 8, 7, 6}));
  EXPECT_EQ(shuffled_indices(10, 1234, 1), (std::vector<int64_t>{4, 3, 2, 1, 9, 5, 6, 7, 0, 8}));
  EXPECT_EQ(shuffled_indices(10, 42, 0), (std::vector<int64_t>{6, 9, 0, 7, 1, 3, 8, 4, 5, 2}));
  EXPECT_TRUE(shuffled_indices(0, 1, 0).empty());
  EXPECT_EQ(shuffled_indices(1, 1, 5), (std::vector<int64_t>{0}));
}

TEST_F(DataFiles, GPTDatasetOverMegatronAndLlmcFiles) {
  std::shared_ptr<const TokenCorpus> c = open_corpus(write_megatron_u16("ds"), 11);  // 1..10 over 4 docs
  GPTDataset ds(c, {0, 4}, 3, false, 0);
  EXPECT_EQ(ds.num_samples(), 3);
  EXPECT_EQ(sample(ds, 0, 3), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(sample(ds, 1, 3), (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(sample(ds, 2, 3), (std::vector<int32_t>{7, 8, 9, 10}));

  write_file(path("s_1.bin"), make_llmc({10, 11, 12}));
  write_file(path("s_0.bin"), make_llmc({0, 1, 2, 3, 4}));
  GPTDataset shards(open_corpus(path("s_*.bin"), 13), {0, 2}, 4, false, 0);
  EXPECT_EQ(shards.num_samples(), 1);
  EXPECT_EQ(sample(shards, 0, 4), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  GPTDataset shards2(open_corpus(path("s_*.bin"), 13), {0, 2}, 3, false, 0);
  EXPECT_EQ(shards2.num_samples(), 2);
  EXPECT_EQ(sample(shards2, 1, 3), (std::vector<int32_t>{3, 4, 10, 11}));
}

// ---------------------------------------------------------------------------------------------
// Byte tokenizer and preprocess documents

TEST(DataTokenizer, BytesAndEod) {
  EXPECT_EQ(ByteTokenizer::kVocabSize, 257);
  EXPECT_EQ(ByteTokenizer::kEod, 256);
  EXPECT_EQ(ByteTokenizer::encode("Aé\n"), (std::vector<int32_t>{65, 0xC3, 0xA9, 10}));
  std::vector<int32_t> t = ByteTokenizer::encode("héllo wörld");
  EXPECT_EQ(ByteTokenizer::decode(t), "héllo wörld");
  EXPECT_EQ(ByteTokenizer::decode(std::vector<int32_t>{104, 105, 256}), "hi<|endoftext|>");
  EXPECT_EQ(ByteTokenizer::decode(std::vector<int32_t>{104, 300, -1}), "h\xEF\xBF\xBD\xEF\xBF\xBD");
}

std::vector<std::string> documents_of(const std::string& path, const std::string& key = "text") {
  std::vector<std::string> docs;
  const int64_t n = read_documents(path, key, [&](std::string_view d) { docs.emplace_back(d); });
  EXPECT_EQ(n, static_cast<int64_t>(docs.size()));
  return docs;
}

TEST_F(DataFiles, PreprocessDocumentRules) {
  write_text(path("blank.txt"), "first line\nstill first\n\n  \t\nsecond\n\n\n");
  EXPECT_EQ(documents_of(path("blank.txt")), (std::vector<std::string>{"first line\nstill first", "second"}));
  write_text(path("fortune.txt"), "a\n\nb\n%\nc\n%\n%\n  \n%\nd");
  EXPECT_EQ(documents_of(path("fortune.txt")), (std::vector<std::string>{"a\n\nb", "c", "d"}));
  write_text(path("crlf.txt"), "x\r\n%\r\ny\r\n");
  EXPECT_EQ(documents_of(path("crlf.txt")), (std::vector<std::string>{"x\r", "y\r"}));
  write_text(path("empty.txt"), "");
  EXPECT_TRUE(documents_of(path("empty.txt")).empty());

  write_text(path("d.jsonl"), "{\"text\": \"héllo\\nworld\", \"id\": 1}\n\n{\"text\": \"\"}\n{\"body\": \"b\", \"text\": \"x\"}\n");
  EXPECT_EQ(documents_of(path("d.jsonl")), (std::vector<std::string>{"héllo\nworld", "x"}));
  write_text(path("k.json"), "{\"body\": \"b1\"}\n{\"body\": \"b2\"}");
  EXPECT_EQ(documents_of(path("k.json"), "body"), (std::vector<std::string>{"b1", "b2"}));

  write_text(path("bad.jsonl"), "{\"text\": \"ok\"}\n{\"text\": oops}\n");
  expect_input_error([&] { documents_of(path("bad.jsonl")); }, {path("bad.jsonl") + ":2:", "JSON"});
  write_text(path("nokey.jsonl"), "{\"text\": \"ok\"}\n{\"txt\": \"ok\"}\n");
  expect_input_error([&] { documents_of(path("nokey.jsonl")); }, {path("nokey.jsonl") + ":2:", "\"text\""});
  write_text(path("notstr.jsonl"), "{\"text\": 5}\n");
  expect_input_error([&] { documents_of(path("notstr.jsonl")); }, {path("notstr.jsonl") + ":1:", "not a string"});
  write_text(path("array.jsonl"), "[1, 2]\n");
  expect_input_error([&] { documents_of(path("array.jsonl")); }, {path("array.jsonl") + ":1:", "object"});
  expect_input_error([&] { documents_of(path("missing.txt")); }, {path("missing.txt")});
}

}  // namespace
}  // namespace tpt
