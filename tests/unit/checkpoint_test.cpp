// parallel/checkpoint.h in one process (make_self_comm): the format, saving shards of one box
// layout and loading them into another, checksums, fallback past damaged or partial checkpoints,
// the model-shape check and keep_last.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/checkpoint.h"
#include "tests/common/box_elements.h"

namespace tpt {
namespace {

namespace fs = std::filesystem;

// Value of global element `flat` of tensor `salt` at checkpoint `version`.
float value(int salt, int64_t flat, int version) { return float(salt * 1000 + flat) + 0.25f * float(version); }

int64_t volume(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// A shard: the box of a global tensor inside a (possibly larger) local tensor. The box holds the
// tensor's values; local elements outside the box hold -7 (they must never reach a file).
struct Shard {
  CkptTensor t;
  std::vector<float> data;
  Shard(std::string name, std::vector<int64_t> global, std::vector<int64_t> off, std::vector<int64_t> size,
        std::vector<int64_t> local, int salt, int version) {
    t = {std::move(name), std::move(global), std::move(off), std::move(size), std::move(local), nullptr};
    data.assign(size_t(volume(t.local_shape)), -7.0f);
    t.data = data.data();
    test::for_each_box_element(t, [&](int64_t local_i, int64_t global_i) {
      data[size_t(local_i)] = value(salt, global_i, version);
    });
  }
};

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("tptrain_ckpt_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    comm_ = make_self_comm();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Saves A [6, 10] as two row shards (the first with padding rows) and B [3, 4, 5] as three
  // shards along dimension 1 (one with padding), in three files, plus an empty box (skipped).
  void save(int64_t iteration, int version, int keep_last = 0) {
    CheckpointWriter w(*comm_, dir_, iteration);
    Shard a0("A", {6, 10}, {0, 0}, {3, 10}, {4, 10}, 1, version), a1("A", {6, 10}, {3, 0}, {3, 10}, {3, 10}, 1, version);
    Shard b0("B", {3, 4, 5}, {0, 0, 0}, {3, 1, 5}, {3, 1, 5}, 2, version),
        b1("B", {3, 4, 5}, {0, 1, 0}, {3, 2, 5}, {3, 3, 6}, 2, version),
        b2("B", {3, 4, 5}, {0, 3, 0}, {3, 1, 5}, {3, 1, 5}, 2, version);
    Shard empty("A", {6, 10}, {6, 0}, {0, 10}, {2, 10}, 1, version);
    w.write_file("model_tp00_pp000.safetensors", {a0.t, b0.t});
    w.write_file("model_tp01_pp000.safetensors", {a1.t, b1.t, empty.t});
    w.write_file("model_tp02_pp000.safetensors", {b2.t});
    w.commit({{"consumed_samples", iteration * 4}, {"loss_scaler", nullptr}}, keep_last);
  }

  // Loads `want` (boxes of A and B in another layout) and checks every element against `version`.
  void expect_loaded(CheckpointReader& r, int version) {
    std::vector<Shard> want;
    want.reserve(3);
    want.emplace_back("A", std::vector<int64_t>{6, 10}, std::vector<int64_t>{0, 3}, std::vector<int64_t>{6, 4},
                      std::vector<int64_t>{7, 5}, 1, version);  // columns, padded
    want.emplace_back("A", std::vector<int64_t>{6, 10}, std::vector<int64_t>{0, 0}, std::vector<int64_t>{6, 10},
                      std::vector<int64_t>{6, 10}, 1, version);  // whole
    want.emplace_back("B", std::vector<int64_t>{3, 4, 5}, std::vector<int64_t>{1, 1, 2},
                      std::vector<int64_t>{2, 3, 3}, std::vector<int64_t>{2, 4, 3}, 2, version);  // across shards
    for (Shard& s : want) {
      std::vector<float> expect = s.data;
      for (float& x : expect)
        if (x == -7.0f) x = 0.0f;  // outside the box: zero after a load
      std::fill(s.data.begin(), s.data.end(), 123.0f);
      r.read(s.t);
      EXPECT_EQ(s.data, expect) << s.t.name << " box " << shape_string(s.t.box_offset) << " + " << shape_string(s.t.box_size);
    }
  }

  std::unique_ptr<CheckpointReader> open(const std::string& dir, bool all = true) {
    LoadRequest req;
    req.dir = dir;
    req.verify_all_files = all;
    return CheckpointReader::open(*comm_, req);
  }

  std::string shard_path(int64_t iteration, const std::string& file) const {
    return dir_ + "/" + checkpoint_dir_name(iteration) + "/" + file;
  }

  void flip_byte(const std::string& path, long from_end) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-from_end, std::ios::end);
    char c;
    f.get(c);
    f.seekp(-from_end, std::ios::end);
    f.put(char(c ^ 0x10));
  }

  std::string dir_;
  std::unique_ptr<Comm> comm_;
};

TEST(Crc32c, KnownValueAndChaining) {
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c(crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
  EXPECT_EQ(crc32c(0, "", 0), 0u);
  std::vector<uint8_t> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 7);
  uint32_t whole = crc32c(0, big.data(), big.size());
  EXPECT_EQ(crc32c(crc32c(0, big.data(), 333), big.data() + 333, 667), whole);
  big[500] ^= 1;
  EXPECT_NE(crc32c(0, big.data(), big.size()), whole);
}

TEST(CheckpointNames, FollowTheContract) {
  EXPECT_EQ(checkpoint_dir_name(200), "iter_0000200");
  EXPECT_EQ(model_shard_name(0, 0), "model_tp00_pp000.safetensors");
  EXPECT_EQ(optim_shard_name(1, 2, 3), "optim_tp01_pp002_dp003.safetensors");
}

TEST_F(CheckpointTest, SavesAndLoadsAcrossBoxLayouts) {
  save(5, 1);
  EXPECT_TRUE(fs::is_directory(dir_ + "/iter_0000005"));
  EXPECT_FALSE(fs::exists(dir_ + "/iter_0000005.partial"));
  std::ifstream latest(dir_ + "/latest_checkpointed_iteration.txt");
  std::string text((std::istreambuf_iterator<char>(latest)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "5\n");
  // only meta.json and the shards: the sidecars are merged and removed
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir_ + "/iter_0000005")) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"meta.json", "model_tp00_pp000.safetensors", "model_tp01_pp000.safetensors",
                                             "model_tp02_pp000.safetensors"}));

  auto r = open(dir_);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->iteration(), 5);
  const nlohmann::json& m = r->meta();
  EXPECT_EQ(m["format"], kCheckpointFormat);
  EXPECT_EQ(m["format_version"], kCheckpointFormatVersion);
  EXPECT_EQ(m["consumed_samples"], 20);
  EXPECT_TRUE(m["loss_scaler"].is_null());
  EXPECT_EQ(m["checksum"], "crc32c");
  const auto& f1 = m["files"]["model_tp01_pp000.safetensors"];
  EXPECT_EQ(f1["tensors"].size(), 2u);  // the empty box is not saved
  EXPECT_EQ(f1["tensors"][1]["box_offset"], (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(f1["tensors"][1]["box_size"], (std::vector<int64_t>{3, 2, 5}));
  EXPECT_EQ(f1["bytes"].get<uint64_t>(), fs::file_size(shard_path(5, "model_tp01_pp000.safetensors")));
  EXPECT_EQ(r->tensors().at("B"), (std::vector<int64_t>{3, 4, 5}));
  expect_loaded(*r, 1);
  // the same checkpoint named by its directory
  auto r2 = open(dir_ + "/iter_0000005");
  ASSERT_TRUE(r2);
  expect_loaded(*r2, 1);
}

TEST_F(CheckpointTest, VerifiesAndReadsOnlyWhatItsBoxesNeed) {
  save(1, 1);
  const std::string f1 = shard_path(1, "model_tp01_pp000.safetensors");
  flip_byte(shard_path(1, "model_tp00_pp000.safetensors"), 10);  // a file the request does not touch
  flip_byte(f1, 10);  // inside B of a file it touches, but only A is asked for
  LoadRequest req;
  req.dir = dir_;
  req.wanted.push_back({"A", {6, 10}, {3, 0}, {3, 10}, {3, 10}, nullptr});  // A's box in f1 exactly
  auto r = CheckpointReader::open(*comm_, req);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->iteration(), 1);
  EXPECT_EQ(r->bytes_verified(), 30u * 4);  // A's CRC-32C, not the whole file
  std::vector<float> buf(30);
  CkptTensor t = req.wanted[0];
  t.data = buf.data();
  r->read(t);
  EXPECT_EQ(buf[0], value(1, 30, 1));
  EXPECT_EQ(buf[29], value(1, 59, 1));
  EXPECT_EQ(r->bytes_read(), 30u * 4);
  // asking for B too: its flipped byte is found (and there is no older checkpoint)
  req.wanted.push_back({"B", {3, 4, 5}, {0, 1, 0}, {3, 1, 5}, {3, 1, 5}, nullptr});
  EXPECT_THROW(CheckpointReader::open(*comm_, req), InputError);
  // a damaged header is found even when only some tensors are read
  save(2, 2);
  flip_byte(shard_path(2, "model_tp01_pp000.safetensors"), 10);  // B again
  std::fstream h(shard_path(2, "model_tp01_pp000.safetensors"), std::ios::in | std::ios::out | std::ios::binary);
  h.seekp(12);  // inside the header JSON: {"A":{"data_offsets":...
  h.put('Z');
  h.close();
  req.wanted.pop_back();
  EXPECT_EQ(CheckpointReader::open(*comm_, req)->iteration(), 1);  // 2 is rejected: back to 1
}

TEST_F(CheckpointTest, ChecksumMismatchFallsBackThenFails) {
  save(1, 1);
  save(2, 2);
  flip_byte(shard_path(2, "model_tp01_pp000.safetensors"), 5);
  auto r = open(dir_);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->iteration(), 1);
  expect_loaded(*r, 1);
  flip_byte(shard_path(1, "model_tp00_pp000.safetensors"), 5);
  try {
    open(dir_);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("no usable checkpoint"), std::string::npos) << msg;
    EXPECT_NE(msg.find("iter_0000002: model_tp01_pp000.safetensors: checksum mismatch"), std::string::npos) << msg;
    EXPECT_NE(msg.find("iter_0000001: model_tp00_pp000.safetensors: checksum mismatch"), std::string::npos) << msg;
  }
}

TEST_F(CheckpointTest, TruncatedMissingAndGarbledFallBack) {
  save(1, 1);
  save(2, 2);
  fs::resize_file(shard_path(2, "model_tp00_pp000.safetensors"), 100);
  EXPECT_EQ(open(dir_)->iteration(), 1);
  save(3, 3);
  fs::remove(shard_path(3, "model_tp01_pp000.safetensors"));
  EXPECT_EQ(open(dir_)->iteration(), 1);
  save(4, 4);
  std::ofstream(shard_path(4, "meta.json")) << "{\"format\": \"tptrain-checkpoint\", \"iter";
  auto r = open(dir_);
  EXPECT_EQ(r->iteration(), 1);
  expect_loaded(*r, 1);
}

TEST_F(CheckpointTest, PartialDirectoriesAreIgnored) {
  save(1, 1);
  save(2, 2);
  // a crash during the save of 2 would have left 2 as .partial with the latest file at 1
  fs::rename(dir_ + "/iter_0000002", dir_ + "/iter_0000002.partial");
  EXPECT_EQ(open(dir_)->iteration(), 1);  // the latest file names 2, which is not complete
  std::ofstream(dir_ + "/latest_checkpointed_iteration.txt") << "1\n";
  auto r = open(dir_);
  EXPECT_EQ(r->iteration(), 1);
  expect_loaded(*r, 1);
  // the next save removes stale .partial directories
  save(3, 3);
  EXPECT_FALSE(fs::exists(dir_ + "/iter_0000002.partial"));
  EXPECT_EQ(open(dir_)->iteration(), 3);
}

TEST_F(CheckpointTest, NoCheckpointIsNullButBrokenOnesAreAnError) {
  EXPECT_EQ(open(dir_ + "/missing"), nullptr);
  fs::create_directories(dir_);
  EXPECT_EQ(open(dir_), nullptr);
  fs::create_directories(dir_ + "/iter_0000009.partial");
  EXPECT_EQ(open(dir_), nullptr);
  std::ofstream(dir_ + "/latest_checkpointed_iteration.txt") << "9\n";
  EXPECT_THROW(open(dir_), InputError);
}

TEST_F(CheckpointTest, ModelMismatchNamesTensorAndShapes) {
  save(1, 1);
  LoadRequest req;
  req.dir = dir_;
  req.model = {{"A", {6, 10}}, {"B", {3, 4, 6}}};
  try {
    CheckpointReader::open(*comm_, req);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'B' has global shape [3, 4, 5] in the checkpoint and [3, 4, 6] in the model"),
              std::string::npos)
        << e.what();
  }
  req.model = {{"A", {6, 10}}};
  EXPECT_THROW(CheckpointReader::open(*comm_, req), InputError);  // B: not in the model
  req.model = {{"A", {6, 10}}, {"B", {3, 4, 5}}, {"C", {2}}};
  EXPECT_THROW(CheckpointReader::open(*comm_, req), InputError);  // C: not in the checkpoint
  req.model = {{"A", {6, 10}}, {"B", {3, 4, 5}}};
  EXPECT_TRUE(CheckpointReader::open(*comm_, req));
  // optional tensors (FP8's delayed-scaling state): absent from either side is fine, a shape is still checked
  req.optional = [](const std::string& name) { return name == "B" || name == "C"; };
  req.model = {{"A", {6, 10}}, {"C", {2}}};  // B only in the checkpoint, C only in the model
  EXPECT_TRUE(CheckpointReader::open(*comm_, req));
  req.model = {{"A", {6, 10}}, {"B", {3, 4, 6}}};
  EXPECT_THROW(CheckpointReader::open(*comm_, req), InputError);
  req.model = {{"A", {6, 10}}};
  req.optional = [](const std::string& name) { return name == "C"; };
  EXPECT_THROW(CheckpointReader::open(*comm_, req), InputError);  // B is not optional
}

TEST_F(CheckpointTest, KeepLastAndReplacingAnIteration) {
  for (int i = 1; i <= 4; ++i) save(i, i, 2);
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.is_directory()) dirs.push_back(e.path().filename().string());
  std::sort(dirs.begin(), dirs.end());
  EXPECT_EQ(dirs, (std::vector<std::string>{"iter_0000003", "iter_0000004"}));
  save(3, 7, 2);  // an earlier iteration saved again (a resumed run): it is the newest now
  auto r = open(dir_);
  EXPECT_EQ(r->iteration(), 3);
  expect_loaded(*r, 7);
  EXPECT_TRUE(fs::exists(dir_ + "/iter_0000004"));  // keep_last never deletes what it just wrote
}

// The one box walk (core/sharded_tensor.h) against per-element index arithmetic: every element of
// the box visited once, in row-major order, at the right flat offsets in both tensors; whole inner
// dimensions merged into longer runs.
TEST(ForEachBoxRow, VisitsTheBoxInBothTensors) {
  struct Case {
    std::vector<int64_t> size, a_shape, a_at, b_shape, b_at;
    size_t runs;
  };
  const std::vector<Case> cases = {
      {{2, 3, 4}, {2, 3, 4}, {}, {2, 3, 4}, {}, 1},                  // everything whole: one run
      {{2, 3, 4}, {5, 3, 4}, {1, 0, 0}, {2, 6, 4}, {0, 2, 0}, 2},    // dims 1.. whole in a only up to dim 2
      {{3, 2}, {4, 5}, {1, 2}, {3, 2}, {}, 3},                       // a sub-box: one run per row
      {{1, 1, 7}, {2, 3, 9}, {1, 2, 1}, {7, 1, 1}, {0, 0, 0}, 1},
      {{}, {}, {}, {}, {}, 1},                                        // a scalar
      {{2, 0}, {2, 3}, {}, {2, 3}, {}, 0},                            // empty
  };
  for (const Case& c : cases) {
    std::vector<std::pair<int64_t, int64_t>> got, want;
    size_t runs = 0;
    for_each_box_row(c.size, c.a_shape, c.a_at, c.b_shape, c.b_at, [&](int64_t a, int64_t b, int64_t n) {
      ++runs;
      for (int64_t i = 0; i < n; ++i) got.emplace_back(a + i, b + i);
    });
    const size_t nd = c.size.size();
    for (int64_t e = 0; e < volume(c.size); ++e) {
      int64_t rem = e, a = 0, b = 0, as = 1, bs = 1;
      for (size_t d = nd; d-- > 0;) {
        const int64_t i = rem % c.size[d];
        rem /= c.size[d];
        a += ((c.a_at.empty() ? 0 : c.a_at[d]) + i) * as;
        b += ((c.b_at.empty() ? 0 : c.b_at[d]) + i) * bs;
        as *= c.a_shape[d];
        bs *= c.b_shape[d];
      }
      want.emplace_back(a, b);
    }
    EXPECT_EQ(got, want) << shape_string(c.size);
    EXPECT_EQ(runs, c.runs) << shape_string(c.size);
  }
}

TEST(FlatRangeBoxes, TileExactlyTheRangeInOrder) {
  const std::vector<int64_t> shape = {3, 4, 5};
  const int64_t n = volume(shape);
  for (int64_t a = 0; a <= n; ++a)
    for (int64_t b = a; b <= n; ++b) {
      const auto boxes = flat_range_boxes(shape, a, b);
      EXPECT_LE(boxes.size(), 5u);
      std::vector<int64_t> covered;  // flat indices of the boxes, box by box in row-major order
      for (const auto& [off, size] : boxes)
        for (int64_t i = 0; i < size[0]; ++i)
          for (int64_t j = 0; j < size[1]; ++j)
            for (int64_t k = 0; k < size[2]; ++k) covered.push_back(((off[0] + i) * 4 + off[1] + j) * 5 + off[2] + k);
      std::vector<int64_t> want;
      for (int64_t e = a; e < b; ++e) want.push_back(e);
      ASSERT_EQ(covered, want) << "[" << a << ", " << b << ")";
    }
}

// The distributed optimizer's save: each rank writes flat blocks of its local tensors (the padding
// rows left out), several boxes of one tensor per file under their own keys; any box layout loads it.
TEST_F(CheckpointTest, FlatBlocksOfLocalTensorsLoadAsBoxes) {
  const int version = 3;
  Shard a0("A", {6, 10}, {0, 0}, {3, 10}, {4, 10}, 1, version), a1("A", {6, 10}, {3, 0}, {3, 10}, {3, 10}, 1, version);
  Shard b("B", {3, 4, 5}, {0, 0, 0}, {3, 4, 5}, {3, 5, 6}, 2, version);  // padded in two dimensions
  {
    CheckpointWriter w(*comm_, dir_, 5);
    // three "DP ranks": blocks of the local flat ranges at odd boundaries; rank 2 holds two blocks of a0
    const std::vector<std::vector<std::pair<int64_t, int64_t>>> a0_blocks = {{{0, 7}}, {{7, 23}}, {{23, 25}, {31, 40}}};
    const std::vector<std::vector<std::pair<int64_t, int64_t>>> a1_blocks = {{{0, 13}}, {{13, 14}}, {{14, 30}}};
    const std::vector<std::vector<std::pair<int64_t, int64_t>>> b_blocks = {{{0, 33}}, {{33, 61}}, {{61, 90}}};
    for (int r = 0; r < 3; ++r) {
      std::vector<CkptTensor> ts;
      for (const CkptTensor& t : flat_range_parts(a0.t, a0_blocks[size_t(r)])) ts.push_back(t);
      for (const CkptTensor& t : flat_range_parts(a1.t, a1_blocks[size_t(r)])) ts.push_back(t);
      for (const CkptTensor& t : flat_range_parts(b.t, b_blocks[size_t(r)])) ts.push_back(t);
      w.write_file(optim_shard_name(0, 0, r), ts);
    }
    // a0's flat [25, 31) is not saved by anyone above: rank 1 writes it under its own file
    w.write_file(model_shard_name(0, 0, 1), flat_range_parts(a0.t, {{25, 31}}));
    w.commit({{"consumed_samples", 0}}, 0);
  }
  const std::string meta = checkpoint_detail::read_text(dir_ + "/iter_0000005/meta.json");
  EXPECT_NE(meta.find("\"key\":\"A#2\""), std::string::npos);
  auto r = open(dir_);
  ASSERT_TRUE(r);
  expect_loaded(*r, version);
}

TEST_F(CheckpointTest, UnwritableSaveDirectoryIsAnInputError) {
  fs::create_directories(dir_);
  std::ofstream(dir_ + "/file") << "x";
  try {
    check_save_dir(dir_ + "/file/ckpt");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(dir_ + "/file/ckpt"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CheckpointWriter(*comm_, dir_ + "/file/ckpt", 1), InputError);
}

}  // namespace
}  // namespace tpt
