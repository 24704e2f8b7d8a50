// The MoE layers' pool of kept rows (model/moe_pool.h) on the CPU backend: blocks taken and given back
// in random order never overlap and stay inside the pool's regions; first fit reuses the lowest hole,
// given-back neighbours merge (the whole pool is one block again), and a block that fits nowhere grows
// the pool by one allocation -- checked against an interval model kept here, byte by byte. And the
// default's footing (model.moe_kept_rows_factor 1.25): under 1F1B and interleaved 1F1B's order on the
// busiest stage, loads that vary by layer (a rank hot in one layer, cold in the next) and micro-batch,
// a pool of 1.25 x their mean never grows: the sum in flight stays near the mean and first fit leaves
// little unused between the blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/ops.h"
#include "model/moe_pool.h"
#include "parallel/schedule.h"

namespace tpt {
namespace {

TEST(MoERowPool, FirstFitMergesAndGrows) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  const int64_t before = ops->allocator_calls();
  MoERowPool pool(*ops, 4 * 256);
  char* a = pool.take(256, 0, 1);
  char* b = pool.take(256, 0, 1);
  char* c = pool.take(256, 0, 1);
  EXPECT_EQ(b, a + 256);
  EXPECT_EQ(c, a + 512);
  pool.give(b);
  EXPECT_EQ(pool.take(256, 0, 1), a + 256);  // the lowest hole
  pool.give(a + 256);
  const int64_t calls = ops->allocator_calls();
  char* d = pool.take(512, 0, 1);  // holes of 256 at 256 and at 768: fits in neither
  EXPECT_EQ(ops->allocator_calls(), calls + 1);
  EXPECT_EQ(pool.capacity(), 4 * 256 + 4 * 512);  // grown by a region of four such blocks
  pool.give(a);                               // merges with the hole after it: 512 at the start
  EXPECT_EQ(pool.take(512, 0, 1), a);
  EXPECT_EQ(pool.in_use(), 512 + 256 + 512);
  EXPECT_EQ(pool.peak(), 512 + 256 + 512);
  pool.give(a), pool.give(c), pool.give(d);
  EXPECT_EQ(pool.in_use(), 0);
  EXPECT_EQ(pool.take(4 * 256, 0, 1), a);  // everything merged back into one block
  EXPECT_GT(ops->allocator_calls(), before);
}

TEST(MoERowPool, RandomTakesAndGivesNeverOverlap) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  MoERowPool pool(*ops, 512 * 256);  // room for the ~48 blocks of 1..12 x 256 bytes live at once
  std::mt19937 rng(7);
  std::map<char*, int64_t> live;  // block -> bytes
  for (int step = 0; step < 4000; ++step) {
    if (live.size() < 32 || (live.size() < 64 && rng() % 2 == 0)) {
      const int64_t bytes = 256 * int64_t(1 + rng() % 12);
      char* p = pool.take(bytes, 0, 1);
      // no live block overlaps [p, p + bytes)
      auto next = live.lower_bound(p);
      if (next != live.end()) {
        ASSERT_LE(p + bytes, next->first) << "step " << step;
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, p) << "step " << step;
      }
      live.emplace(p, bytes);
    } else {
      auto it = live.begin();
      std::advance(it, int64_t(rng() % live.size()));
      pool.give(it->first);
      live.erase(it);
    }
    int64_t used = 0;
    for (const auto& [p, n] : live) used += n;
    ASSERT_EQ(pool.in_use(), used);
    ASSERT_LE(used, pool.capacity());
  }
  for (const auto& [p, n] : live) pool.give(p);
  EXPECT_EQ(pool.in_use(), 0);
  EXPECT_GE(pool.peak(), 32 * 256);
}

TEST(MoERowPool, TheSchedulesOrderFitsAQuarterAboveTheMean) {
  const int P = 8, M = 64;
  for (int v : {1, 4}) {
    const int layers = 12 / v;  // the stage's 12 MoE layers over its chunks
    const std::vector<Action> list = make_schedule(v > 1 ? ScheduleKind::Interleaved1F1B : ScheduleKind::OneFOneB, P, 0, M, v);
    const int slots = v > 1 ? pool_slots(list, v, M).slots : max_in_flight(list);
    const int64_t mean = 64;  // 256-byte units of a layer's balanced rows
    std::mt19937 rng(11);
    std::normal_distribution<double> layer_load(1.0, 0.15), noise(0.0, 0.05);
    std::vector<double> load(size_t(v * layers));  // each layer's lasting load on this rank
    for (double& l : load) l = std::max(0.3, layer_load(rng));
    std::unique_ptr<Ops> ops = make_cpu_ops(1);
    MoERowPool pool(*ops, int64_t(slots) * layers * int64_t(std::ceil(1.25 * double(mean))) * 256);
    const int64_t planned = pool.capacity();
    std::map<std::pair<int, int>, std::vector<char*>> held;  // (mb, chunk) -> its layers' blocks
    for (const Action& a : list) {
      if (a.kind == Action::Kind::Forward) {
        std::vector<char*>& b = held[{a.mb, a.chunk}];
        for (int l = 0; l < layers; ++l) {
          const double f = std::max(0.0, load[size_t(a.chunk * layers + l)] + noise(rng));
          b.push_back(pool.take(256 * std::max<int64_t>(1, int64_t(std::llround(f * double(mean)))), l, 1));
        }
      } else if (a.kind == Action::Kind::Backward) {
        std::vector<char*>& b = held.at({a.mb, a.chunk});
        for (auto it = b.rbegin(); it != b.rend(); ++it) pool.give(*it);
        held.erase({a.mb, a.chunk});
      }
    }
    EXPECT_TRUE(held.empty());
    EXPECT_EQ(pool.capacity(), planned) << "v " << v << ": the pool grew (peak " << pool.peak() << " of " << planned << ")";
    std::printf("v %d: %d slots x %d layers, peak %.1f%% of the pool\n", v, slots, layers,
                100.0 * double(pool.peak()) / double(planned));
  }
}

}  // namespace
}  // namespace tpt
