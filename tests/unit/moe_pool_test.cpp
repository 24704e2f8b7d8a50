// The MoE layers' pool of kept rows (model/moe_pool.h) on the CPU backend: blocks taken and given back
// in random order never overlap and stay inside the pool's regions; first fit reuses the lowest hole,
// given-back neighbours merge (the whole pool is one block again), and a block that fits nowhere grows
// the pool by one allocation -- checked against an interval model kept here, byte by byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/ops.h"
#include "model/moe_pool.h"

namespace tpt {
namespace {

TEST(MoERowPool, FirstFitMergesAndGrows) {
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  const int64_t before = ops->allocator_calls();
  MoERowPool pool(*ops, 4 * 256);
  char* a = pool.take(256, "a");
  char* b = pool.take(256, "b");
  char* c = pool.take(256, "c");
  EXPECT_EQ(b, a + 256);
  EXPECT_EQ(c, a + 512);
  pool.give(b);
  EXPECT_EQ(pool.take(256, "b2"), a + 256);  // the lowest hole
  pool.give(a + 256);
  const int64_t calls = ops->allocator_calls();
  char* d = pool.take(512, "d");  // holes of 256 at 256 and at 768: fits in neither
  EXPECT_EQ(ops->allocator_calls(), calls + 1);
  EXPECT_EQ(pool.capacity(), 4 * 256 + 4 * 512);  // grown by a region of four such blocks
  pool.give(a);                               // merges with the hole after it: 512 at the start
  EXPECT_EQ(pool.take(512, "e"), a);
  EXPECT_EQ(pool.in_use(), 512 + 256 + 512);
  EXPECT_EQ(pool.peak(), 512 + 256 + 512);
  pool.give(a), pool.give(c), pool.give(d);
  EXPECT_EQ(pool.in_use(), 0);
  EXPECT_EQ(pool.take(4 * 256, "all"), a);  // everything merged back into one block
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
      char* p = pool.take(bytes, "random");
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

}  // namespace
}  // namespace tpt
