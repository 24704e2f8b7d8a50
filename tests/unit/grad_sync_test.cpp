// GradSync (parallel/grad_sync.h) with a recording DP group: which ranges are summed, when, and the
// 1/DP scaling, against hand-computed buckets; a second replica group's buckets and blocks, aligned
// from its own span's start, on its own communicator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "parallel/grad_sync.h"

namespace tpt {
namespace {

// A DP group of `size` ranks whose peers all hold the same gradients: a sum multiplies by size.
class RecordingComm final : public Comm {
 public:
  explicit RecordingComm(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  void do_all_reduce(void* b, int64_t n, DType t, ReduceOp) override {
    if (t != DType::F32) return;
    float* buf = static_cast<float*>(b);
    log.push_back("all_reduce " + range(buf, n));
    for (int64_t i = 0; i < n; ++i) buf[i] *= float(size_);
  }
  void do_all_gather(void*, const void*, int64_t, DType) override {}
  void do_reduce_scatter(void*, const void*, int64_t, DType) override {}
  void do_broadcast(void*, int64_t, DType, int) override {}
  void do_all_to_all_v(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&, DType) override {}
  void exchange(const std::vector<Message>&) override {}
  void barrier() override {}
  int64_t do_start_all_reduce(void* b, int64_t n, DType) override {
    float* buf = static_cast<float*>(b);
    log.push_back("start " + range(buf, n));
    pending.push_back({buf, n});
    return int64_t(pending.size());
  }
  void wait_all() override {
    log.push_back("finish");
    for (auto [buf, n] : pending)
      for (int64_t i = 0; i < n; ++i) buf[i] *= float(size_);
    pending.clear();
  }
  std::string range(const float* buf, int64_t n) const {
    return "[" + std::to_string(buf - base) + "," + std::to_string(buf - base + n) + ")";
  }

  const float* base = nullptr;
  std::vector<std::string> log;
  std::vector<std::pair<float*, int64_t>> pending;

 private:
  int size_;
};

// 100 floats: embeddings [0, 20), layers [20, 35) [36, 50) [50, 70) [72, 90), final LayerNorm [90, 100)
const std::vector<GradRange> kLayers = {{20, 15}, {36, 14}, {50, 20}, {72, 18}};

TEST(GradSync, BucketsStartAsBackwardFinishesTheirLayers) {
  std::vector<float> g(100, 1.0f);
  auto ops = make_cpu_ops(1);
  RecordingComm dp(4), emb(2);
  dp.base = emb.base = g.data();
  // buckets of >= 30 elements, last layers first: layers 3+2 (38), layers 1+0 (29, the rest)
  GradSync sync(*ops, g.data(), 100, kLayers, &dp, &emb, GradRange{0, 20}, {.overlap = true, .bucket_size = 30});
  EXPECT_TRUE(sync.overlapping());
  EXPECT_EQ(sync.num_buckets(), 4);  // two of layers, the two ranges around them
  sync.layer_done(3);
  EXPECT_TRUE(dp.log.empty());  // layer 2 still missing
  sync.layer_done(2);
  ASSERT_EQ(dp.log.size(), 1u);
  EXPECT_EQ(dp.log[0], "start [50,90)");  // from layer 2's start to layer 3's end (padding included)
  sync.layer_done(1);
  sync.layer_done(0);
  ASSERT_EQ(dp.log.size(), 2u);
  EXPECT_EQ(dp.log[1], "start [20,50)");
  sync.finish();
  const std::vector<std::string> want = {"start [50,90)", "start [20,50)", "start [0,20)", "start [90,100)", "finish"};
  EXPECT_EQ(dp.log, want);
  ASSERT_EQ(emb.log.size(), 1u);
  EXPECT_EQ(emb.log[0], "all_reduce [0,20)");
  // every element summed over 4 ranks once and divided by 4; the word embedding then summed over 2
  for (int i = 0; i < 100; ++i) EXPECT_EQ(g[size_t(i)], i < 20 ? 2.0f : 1.0f) << i;
  // the next iteration starts over
  dp.log.clear();
  sync.layer_done(3);
  sync.layer_done(2);
  EXPECT_EQ(dp.log, std::vector<std::string>{"start [50,90)"});
}

TEST(GradSync, WithoutOverlapOneAllReduceAfterBackward) {
  std::vector<float> g(100, 3.0f);
  auto ops = make_cpu_ops(1);
  RecordingComm dp(2);
  dp.base = g.data();
  GradSync sync(*ops, g.data(), 100, kLayers, &dp, nullptr, GradRange{}, {.overlap = false, .bucket_size = 1});
  EXPECT_FALSE(sync.overlapping());
  for (int l = 3; l >= 0; --l) sync.layer_done(l);
  EXPECT_TRUE(dp.log.empty());
  sync.finish();
  EXPECT_EQ(dp.log, std::vector<std::string>{"all_reduce [0,100)"});
  for (float x : g) EXPECT_EQ(x, 3.0f);
}

TEST(GradSync, OneLayerPerBucketAndNoDpGroup) {
  std::vector<float> g(100, 1.0f);
  auto ops = make_cpu_ops(1);
  RecordingComm dp(2);
  dp.base = g.data();
  GradSync per_layer(*ops, g.data(), 100, kLayers, &dp, nullptr, GradRange{}, {.overlap = true, .bucket_size = 1});
  EXPECT_EQ(per_layer.num_buckets(), 6);
  per_layer.layer_done(3);
  EXPECT_EQ(dp.log, std::vector<std::string>{"start [72,90)"});
  RecordingComm one(1);
  GradSync alone(*ops, g.data(), 100, kLayers, &one, nullptr, GradRange{}, {.overlap = true, .bucket_size = 1});
  EXPECT_FALSE(alone.overlapping());  // DP 1: nothing to sum
  alone.finish();
  EXPECT_TRUE(one.log.empty());
}

// The distributed optimizer's side, with a recording DP group of two ranks (this one rank 1) whose
// peers hold the same values, and an embedding group writing to the same log.
class LoggingComm final : public Comm {
 public:
  LoggingComm(int rank, int size, std::vector<std::string>& log, const float* base, std::string name)
      : rank_(rank), size_(size), log_(log), base_(base), name_(std::move(name)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void do_all_reduce(void* b, int64_t n, DType t, ReduceOp) override {
    if (t != DType::F32) return;
    float* buf = static_cast<float*>(b);
    log_.push_back(name_ + " all_reduce " + range(buf, n));
    for (int64_t i = 0; i < n; ++i) buf[i] *= float(size_);
  }
  void do_all_gather(void*, const void*, int64_t, DType) override {}
  void do_reduce_scatter(void*, const void*, int64_t, DType) override {}
  void do_broadcast(void*, int64_t, DType, int) override {}
  void do_all_to_all_v(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&, DType) override {}
  void exchange(const std::vector<Message>&) override {}
  void barrier() override {}
  int64_t do_start_reduce_scatter(void* o, const void* i, int64_t n, DType) override {
    float* out = static_cast<float*>(o);
    const float* in = static_cast<const float*>(i);
    log_.push_back(name_ + " reduce_scatter " + range(out, n) + " of " + range(in, n * size_));
    for (int64_t i = 0; i < n; ++i) out[i] = in[int64_t(rank_) * n + i] * float(size_);  // in place
    return ticket_++;
  }
  int64_t do_start_all_gather(void* o, const void* i, int64_t n, DType) override {
    float* out = static_cast<float*>(o);
    EXPECT_EQ(static_cast<const float*>(i), out + int64_t(rank_) * n);  // in place
    log_.push_back(name_ + " all_gather words " + std::to_string(out - base_) + "+" + std::to_string(n * size_) +
                   " ticket " + std::to_string(ticket_));
    return ticket_++;
  }
  void wait(int64_t ticket) override { log_.push_back(name_ + " wait " + std::to_string(ticket)); }
  void wait_all() override { log_.push_back(name_ + " wait_all"); }
  std::string range(const float* buf, int64_t n) const {
    return "[" + std::to_string(buf - base_) + "," + std::to_string(buf - base_ + n) + ")";
  }

 private:
  int rank_, size_;
  std::vector<std::string>& log_;
  const float* base_;
  std::string name_;
  int64_t ticket_ = 0;
};

TEST(GradSync, DistributedOptimizerReduceScattersAlignedBuckets) {
  // layout of 1000 elements padded to 1024 (a multiple of 64 x DP 2): word embedding [0, 100),
  // layers [200, 300) [300, 520) [520, 900), final LayerNorm [900, 1000)
  EXPECT_EQ(GradSync::buffer_size(1000, 2, true), 1024);
  EXPECT_EQ(GradSync::buffer_size(1000, 2, false), 1000);
  EXPECT_EQ(GradSync::buffer_size(1000, 1, true), 1000);
  std::vector<float> g(1024);
  for (size_t i = 0; i < g.size(); ++i) g[i] = float(i);
  std::vector<std::string> log;
  LoggingComm dp(1, 2, log, g.data(), "dp"), emb(0, 2, log, g.data(), "emb");
  auto ops = make_cpu_ops(1);
  GradSync sync(*ops, g.data(), 1024, {{200, 100}, {300, 220}, {520, 380}}, &dp, &emb, GradRange{0, 100},
                {.overlap = true, .bucket_size = 1, .distributed_optimizer = true});
  EXPECT_TRUE(sync.distributed());
  // bucket boundaries at multiples of 128: starts rounded up (256, 384, 640), the top layer's end
  // down (896); this rank (1) owns the upper half of each
  const std::vector<std::pair<int64_t, int64_t>> want_owned = {{128, 128}, {320, 64}, {512, 128}, {768, 128}, {960, 64}};
  ASSERT_EQ(sync.owned().size(), want_owned.size());
  int64_t local = 0;
  for (size_t i = 0; i < want_owned.size(); ++i) {
    EXPECT_EQ(sync.owned()[i].offset, want_owned[i].first) << i;
    EXPECT_EQ(sync.owned()[i].n, want_owned[i].second) << i;
    EXPECT_EQ(sync.owned()[i].local, local) << i;
    local += want_owned[i].second;
  }
  EXPECT_EQ(sync.owned_size(), 512);
  sync.layer_done(2);
  sync.layer_done(1);
  sync.layer_done(0);
  sync.finish();
  const std::vector<std::string> want = {
      "dp reduce_scatter [768,896) of [640,896)",   // layer 2, as backward finishes it
      "dp reduce_scatter [512,640) of [384,640)",   // layer 1 (and layer 2's first 120 elements)
      "dp reduce_scatter [320,384) of [256,384)",   // layer 0's last 44 elements, layer 1's first 84
      "emb all_reduce [0,100)",                     // the tied embedding before its bucket
      "dp reduce_scatter [128,256) of [0,256)",     // embeddings and layer 0's first 56 elements
      "dp reduce_scatter [960,1024) of [896,1024)", // layer 2's last 4, the final LayerNorm, padding
      "dp wait_all"};
  EXPECT_EQ(log, want);
  // owned elements: summed over 2 ranks, divided by 2 (the embedding's sum doubled [0, 100): not owned)
  for (const ShardRange& r : sync.owned())
    for (int64_t i = r.offset; i < r.offset + r.n; ++i) EXPECT_EQ(g[size_t(i)], float(i)) << i;
  EXPECT_EQ(g[50], 100.0f);  // summed over the embedding group

  // 16-bit parameters: all-gathered as 4-byte words, blocking without overlap_param_gather
  log.clear();
  std::vector<uint16_t> p16(1024);
  sync.start_param_gather(Buf(p16.data(), DType::BF16));
  ASSERT_EQ(log.size(), 6u);
  EXPECT_EQ(log.back(), "dp wait_all");
}

TEST(GradSync, OverlappedParameterGatherWaitsPerLayer) {
  std::vector<float> g(1024, 1.0f), p(1024, 1.0f);
  std::vector<std::string> log;
  LoggingComm dp(0, 2, log, p.data(), "dp");
  auto ops = make_cpu_ops(1);
  GradSync sync(*ops, g.data(), 1024, {{200, 100}, {300, 220}, {520, 380}}, &dp, nullptr, GradRange{},
                {.overlap = true, .bucket_size = 1, .distributed_optimizer = true, .overlap_param_gather = true});
  sync.start_param_gather(Buf(p.data()));
  const std::vector<std::string> starts = {
      "dp all_gather words 0+256 ticket 0", "dp all_gather words 256+128 ticket 1",
      "dp all_gather words 384+256 ticket 2", "dp all_gather words 640+256 ticket 3",
      "dp all_gather words 896+128 ticket 4"};
  EXPECT_EQ(log, starts);
  log.clear();
  sync.wait_params(-1);  // the embeddings: [0, 200) lies in the first bucket
  sync.wait_params(0);   // layer 0 [200, 300): up to the bucket starting at 256
  sync.wait_params(1);   // layer 1 [300, 520): up to the bucket starting at 384
  sync.wait_params(3);   // everything
  sync.wait_params(0);   // nothing left
  const std::vector<std::string> waits = {"dp wait 0", "dp wait 1", "dp wait 2", "dp wait_all"};
  EXPECT_EQ(log, waits);
}

// FP8 parameters (GradGroup::fp8): the dense 16-bit span [0, 512) and the FP8 parameters' [512, 1024) over
// the same "dp" (this rank 1 of 2): start_param_gather gathers the first only (4-byte words of 16-bit
// values), start_code_gather the second, from the codes' buffer (element 512 at its byte 0) a byte per
// element: words of 4 codes, its buckets' blocks at [0, 256) and [256, 512) of the codes.
TEST(GradSync, Fp8ParametersGatheredAsCodes) {
  std::vector<float> g(1024, 1.0f), codes(128, 0.0f);  // (codes: 512 bytes)
  std::vector<uint16_t> p16(512);
  std::vector<std::string> log;
  // (each comm logs its gathers' word offsets from the buffer they write: the 16-bit copy, the codes)
  LoggingComm dp(1, 2, log, reinterpret_cast<const float*>(p16.data()), "dp"), codes_dp(1, 2, log, codes.data(), "codes");
  auto ops = make_cpu_ops(1);
  std::vector<GradGroup> groups = {{&dp, 0.5f, {0, 512}, {{128, 200}, {328, 184}}},
                                   {&dp, 0.5f, {512, 512}, {{512, 256}, {768, 256}}, true}};
  GradSync sync(*ops, g.data(), groups, nullptr, GradRange{},
                {.overlap = true, .bucket_size = 1, .distributed_optimizer = true});
  EXPECT_EQ(sync.code_span().offset, 512);
  EXPECT_EQ(sync.code_span().n, 512);
  sync.start_param_gather(Buf(p16.data(), DType::BF16));
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), "dp wait_all");
  for (size_t i = 0; i + 1 < log.size(); ++i) {  // "dp all_gather words A+B ticket T", inside [0, 256) words
    long a = -1, b = -1;
    ASSERT_EQ(std::sscanf(log[i].c_str(), "dp all_gather words %ld+%ld", &a, &b), 2) << log[i];
    EXPECT_LE(a + b, 256) << log[i] << ": only the 16-bit span's 512 values";
  }
  log.clear();
  GradSync codes_sync(*ops, g.data(), {{&codes_dp, 0.5f, {0, 512}, {{128, 200}, {328, 184}}},
                                       {&codes_dp, 0.5f, {512, 512}, {{512, 256}, {768, 256}}, true}},
                      nullptr, GradRange{}, {.overlap = true, .bucket_size = 1, .distributed_optimizer = true});
  codes_sync.start_code_gather(reinterpret_cast<uint8_t*>(codes.data()));
  const std::vector<std::string> want = {"codes all_gather words 0+64 ticket 0", "codes all_gather words 64+64 ticket 1",
                                         "codes wait_all"};
  EXPECT_EQ(log, want);
}

// Two replica groups (parallel/grad_sync.h GradGroup): the dense one [0, 512) over "dp" (this rank
// 1 of 2) and a second one [576, 1088) over "ep" (rank 0 of 2), each with its own buckets whose
// boundaries are multiples of 64 x 2 from its own span's start (576 is not a multiple of 128).
TEST(GradSync, SecondGroupBucketsFromItsOwnSpanOnItsOwnComm) {
  std::vector<float> g(1088, 1.0f);
  std::vector<std::string> log;
  LoggingComm dp(1, 2, log, g.data(), "dp"), ep(0, 2, log, g.data(), "ep"), emb(0, 2, log, g.data(), "emb");
  auto ops = make_cpu_ops(1);
  std::vector<GradGroup> groups = {{&dp, 0.5f, {0, 512}, {{128, 172}, {300, 200}}},
                                   {&ep, 0.25f, {576, 512}, {{600, 200}, {800, 250}}}};
  GradSync sync(*ops, g.data(), groups, &emb, GradRange{0, 100},
                {.overlap = true, .bucket_size = 1, .distributed_optimizer = true});
  EXPECT_EQ(sync.num_buckets(), 3 + 4);
  // dense: [128, 384) for layer 0 (layer 1's top [384, 500) is below the aligned end), [0, 128) and
  // [384, 512) at finish; second group: [832, 960) layer 1, [704, 832) layer 0, [576, 704) and
  // [960, 1088) at finish. Rank 1 owns the upper half of each dense bucket, rank 0 the lower half
  // of each of the second group's.
  const std::vector<std::pair<int64_t, int64_t>> want_owned = {{64, 64},  {256, 128}, {448, 64}, {576, 64},
                                                               {704, 64}, {832, 64},  {960, 64}};
  ASSERT_EQ(sync.owned().size(), want_owned.size());
  for (size_t i = 0; i < want_owned.size(); ++i) {
    EXPECT_EQ(sync.owned()[i].offset, want_owned[i].first) << i;
    EXPECT_EQ(sync.owned()[i].n, want_owned[i].second) << i;
  }
  EXPECT_EQ(sync.owned_size(), 512);
  ASSERT_EQ(sync.unique_ranges().size(), want_owned.size());  // every replica answers for its blocks
  sync.layer_done(1);
  sync.layer_done(0);
  sync.finish();
  const std::vector<std::string> want = {
      "ep reduce_scatter [832,896) of [832,960)",  // layer 1: only the second group has a bucket for it
      "dp reduce_scatter [256,384) of [128,384)",  // layer 0, dense
      "ep reduce_scatter [704,768) of [704,832)",  // layer 0, second group
      "emb all_reduce [0,100)",                    // the tied embedding before its (dense) bucket
      "dp reduce_scatter [64,128) of [0,128)",
      "dp reduce_scatter [448,512) of [384,512)",
      "ep reduce_scatter [576,640) of [576,704)",
      "ep reduce_scatter [960,1024) of [960,1088)",
      "dp wait_all",
      "ep wait_all"};
  EXPECT_EQ(log, want);
  // each group's owned blocks: summed over its 2 ranks, times its scale
  for (const ShardRange& r : sync.owned())
    for (int64_t i = r.offset; i < r.offset + r.n; ++i)  // (the embedding [0, 100) also doubled)
      EXPECT_EQ(g[size_t(i)], i < 100 ? 2.0f : i < 512 ? 1.0f : 0.5f) << i;

  // the parameter all-gather: group by group, each bucket in forward order on its group's comm
  log.clear();
  sync.start_param_gather(Buf(g.data()));  // (any buffer of the layout: the log's offsets are g's)
  ASSERT_EQ(log.size(), 3u + 4u + 2u);
  EXPECT_EQ(log[3], "ep all_gather words 576+128 ticket 4");  // the second group's first, after dense's three
  EXPECT_EQ(log[7], "dp wait_all");
  EXPECT_EQ(log[8], "ep wait_all");
}

}  // namespace
}  // namespace tpt
