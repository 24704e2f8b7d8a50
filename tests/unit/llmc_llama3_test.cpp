// llm.c's Llama 3 shards (magic 20240801, version 7, uint32 tokens; llm.c's dev/data/data_common.py
// write_datafile(..., "llama-3")), written byte by byte here: read as one document each, the same
// tokens and samples as the equivalent Megatron int32 dataset, next to GPT-2's uint16 shards in one
// glob; malformed headers and out-of-vocabulary tokens are InputErrors naming the problem.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"
#include "data/indexed_writer.h"
#include "data/megatron_format.h"

namespace tpt {
namespace {

using Bytes = std::vector<uint8_t>;

template <typename T>
void put(Bytes& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof v);
  std::memcpy(b.data() + at, &v, sizeof v);
}

template <typename T>
Bytes make_shard(const std::vector<T>& tokens, int32_t magic, int32_t version, int64_t declared = -1) {
  Bytes b;
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = int32_t(declared >= 0 ? declared : int64_t(tokens.size()));
  for (int32_t h : header) put(b, h);
  for (T t : tokens) put(b, t);
  return b;
}

std::string dir() {
  const std::string d = ::testing::TempDir() + "/llmc_llama3_test";
  std::filesystem::create_directories(d);
  return d;
}

std::string write(const std::string& name, const Bytes& b) {
  const std::string path = dir() + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  return path;
}

std::vector<int32_t> read_doc(const TokenCorpus& c, int64_t doc) {
  std::vector<int32_t> out(size_t(c.document_length(doc)));
  c.read(doc, 0, c.document_length(doc), out.data());
  return out;
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InputError (expected one mentioning " << needle << ")";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

const std::vector<uint32_t> kTokens = {128000, 2028, 374, 264, 1296, 11914, 13, 128001, 0, 65535, 65536, 128255, 70000};

TEST(LlmcLlama3, ReadsUint32Shards) {
  const std::string shard = write("llama3_000.bin", make_shard(kTokens, llmc::kMagicLlama3, llmc::kVersionLlama3));
  const auto c = open_corpus(shard, 128256);
  ASSERT_EQ(c->num_documents(), 1);
  EXPECT_EQ(read_doc(*c, 0), std::vector<int32_t>(kTokens.begin(), kTokens.end()));
  std::vector<int32_t> mid(3);
  c->read(0, 9, 3, mid.data());
  EXPECT_EQ(mid, (std::vector<int32_t>{65535, 65536, 128255}));
  EXPECT_NE(c->description().find("uint32"), std::string::npos) << c->description();
}

TEST(LlmcLlama3, SameTokensAndSamplesAsMegatronInt32) {
  const std::string shard = write("same_000.bin", make_shard(kTokens, llmc::kMagicLlama3, llmc::kVersionLlama3));
  const std::string prefix = dir() + "/same_megatron";
  {
    IndexedDatasetWriter w(prefix, megatron::kI32);
    w.add_document(std::vector<int32_t>(kTokens.begin(), kTokens.end()));
    w.finish();
  }
  std::shared_ptr<const TokenCorpus> a = open_corpus(shard, 128256), b = open_corpus(prefix, 128256);
  EXPECT_EQ(read_doc(*a, 0), read_doc(*b, 0));
  const GPTDataset da(a, {0, 1}, 4, true, 7), db(b, {0, 1}, 4, true, 7);
  ASSERT_EQ(da.num_samples(), db.num_samples());
  for (int64_t p = 0; p < 2 * da.num_samples(); ++p) {
    std::vector<int32_t> x(5), y(5);
    da.get(p, x.data());
    db.get(p, y.data());
    EXPECT_EQ(x, y) << "position " << p;
  }
}

TEST(LlmcLlama3, GlobMixesGpt2AndLlama3Shards) {
  write("mix_000.bin", make_shard<uint16_t>({1, 2, 65535}, llmc::kMagic, llmc::kVersion));
  write("mix_001.bin", make_shard<uint32_t>({70000, 3}, llmc::kMagicLlama3, llmc::kVersionLlama3));
  const auto c = open_corpus(dir() + "/mix_*.bin", 128256);
  ASSERT_EQ(c->num_documents(), 2);
  EXPECT_EQ(read_doc(*c, 0), (std::vector<int32_t>{1, 2, 65535}));
  EXPECT_EQ(read_doc(*c, 1), (std::vector<int32_t>{70000, 3}));
  EXPECT_NE(c->description().find("uint16 and uint32"), std::string::npos) << c->description();
}

TEST(LlmcLlama3, BadShards) {
  const int32_t M = llmc::kMagicLlama3;
  auto open = [](const std::string& path, int vocab = 128256) { return [=] { open_corpus(path, vocab); }; };
  expect_error(open(write("v1.bin", make_shard(kTokens, M, 1))), "version 1 (expected 7: uint32 tokens, with magic 20240801)");
  expect_error(open(write("gpt2v7.bin", make_shard(kTokens, llmc::kMagic, 7))), "version 7 (expected 1");
  expect_error(open(write("long.bin", make_shard(kTokens, M, 7, int64_t(kTokens.size()) + 1))), "truncated?");
  expect_error(open(write("short.bin", make_shard(kTokens, M, 7, int64_t(kTokens.size()) - 1))),
               "4 bytes after the 12 tokens");
  expect_error(open(write("vocab.bin", make_shard(kTokens, M, 7)), 128001), "token 128001 at position 7");
  expect_error(open(write("huge.bin", make_shard<uint32_t>({1, 0xFFFFFFFFu}, M, 7))), "token 4294967295 at position 1");
  expect_error(open(write("bad_magic.bin", make_shard(kTokens, 20240802, 7))), "neither an llm.c shard");
}

}  // namespace
}  // namespace tpt
