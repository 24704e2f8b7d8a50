// GradSync (parallel/grad_sync.h) with a recording DP group: which ranges are summed, when, and the
// 1/DP scaling, against hand-computed buckets.
#include <gtest/gtest.h>

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
  void all_reduce(float* buf, int64_t n, ReduceOp) override {
    log.push_back("all_reduce " + range(buf, n));
    for (int64_t i = 0; i < n; ++i) buf[i] *= float(size_);
  }
  void all_reduce(double*, int64_t, ReduceOp) override {}
  void all_gather(float*, const float*, int64_t) override {}
  void reduce_scatter(float*, const float*, int64_t) override {}
  void broadcast(float*, int64_t, int) override {}
  void send_recv(const float*, int64_t, int, float*, int64_t, int) override {}
  void barrier() override {}
  void start_all_reduce(float* buf, int64_t n) override {
    log.push_back("start " + range(buf, n));
    pending.push_back({buf, n});
  }
  void finish_all_reduces() override {
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
  GradSync sync(*ops, g.data(), 100, kLayers, &dp, &emb, GradRange{0, 20}, true, 30);
  EXPECT_TRUE(sync.overlapping());
  EXPECT_EQ(sync.num_buckets(), 2);
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
  GradSync sync(*ops, g.data(), 100, kLayers, &dp, nullptr, GradRange{}, false, 1);
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
  GradSync per_layer(*ops, g.data(), 100, kLayers, &dp, nullptr, GradRange{}, true, 1);
  EXPECT_EQ(per_layer.num_buckets(), 4);
  per_layer.layer_done(3);
  EXPECT_EQ(dp.log, std::vector<std::string>{"start [72,90)"});
  RecordingComm one(1);
  GradSync alone(*ops, g.data(), 100, kLayers, &one, nullptr, GradRange{}, true, 1);
  EXPECT_FALSE(alone.overlapping());  // DP 1: nothing to sum
  alone.finish();
  EXPECT_TRUE(one.log.empty());
}

}  // namespace
}  // namespace tpt
