// The grid's groups (parallel/grid.h grid_group_splits, which make_grid, setup_cuda_devices and
// threads as ranks all use) for several TP x CP x PP x DP grids against the groups derived here
// from the rank formula of docs/ARCHITECTURE.md "Process grid", rank = tp + TP*(cp + CP*(dp +
// DP*pp)); and a CP 2 grid on thread ranks, whose CP ring and DP x CP group gather their members'
// world ranks in that order.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "parallel/thread_comm.h"

namespace tpt {
namespace {

// The contract's formula, written out here independently of parallel/grid.cpp.
struct Formula {
  GridShape s;
  int rank(int t, int c, int d, int p) const { return t + s.tp * (c + s.cp * (d + s.dp * p)); }
  // the coordinates of a rank, by search: (t, c, d, p)
  std::vector<int> coords(int r) const {
    for (int p = 0; p < s.pp; ++p)
      for (int d = 0; d < s.dp; ++d)
        for (int c = 0; c < s.cp; ++c)
          for (int t = 0; t < s.tp; ++t)
            if (rank(t, c, d, p) == r) return {t, c, d, p};
    return {};
  }
};

// Each group of world rank r by name, its members' world ranks in group order.
std::map<std::string, std::vector<int>> expected_groups(const Formula& f, int r) {
  const GridShape& s = f.s;
  const std::vector<int> x = f.coords(r);
  const int t = x[0], c = x[1], d = x[2], p = x[3];
  std::map<std::string, std::vector<int>> m;
  for (int i = 0; i < s.world(); ++i) m["world"].push_back(i);
  for (int i = 0; i < s.tp; ++i) m["tp"].push_back(f.rank(i, c, d, p));
  for (int i = 0; i < s.pp; ++i) m["pp"].push_back(f.rank(t, c, d, i));
  for (int i = 0; i < s.dp; ++i) m["dp"].push_back(f.rank(t, c, i, p));
  for (int j = 0; j < s.pp; ++j)
    for (int i = 0; i < s.tp; ++i) m["mp"].push_back(f.rank(i, c, d, j));
  if (s.pp > 1 && (p == 0 || p == s.pp - 1)) m["embedding"] = {f.rank(t, c, d, 0), f.rank(t, c, d, s.pp - 1)};
  if (s.cp > 1) {
    for (int i = 0; i < s.cp; ++i) m["cp"].push_back(f.rank(t, i, d, p));
    for (int j = 0; j < s.dp; ++j)
      for (int i = 0; i < s.cp; ++i) m["dp_cp"].push_back(f.rank(t, i, j, p));
  }
  return m;
}

// The name and device twin of a split's group.
std::pair<std::string, std::unique_ptr<Comm> Grid::*> kind_of(const GroupSplit& s) {
  const std::vector<std::tuple<std::string, std::unique_ptr<Comm> Grid::*, std::unique_ptr<Comm> Grid::*>> kinds = {
      {"world", &Grid::world, nullptr},
      {"tp", &Grid::tp_group, &Grid::tp_device},
      {"pp", &Grid::pp_group, &Grid::pp_device},
      {"dp", &Grid::dp_group, &Grid::dp_device},
      {"mp", &Grid::mp_group, nullptr},
      {"embedding", &Grid::embedding_group, &Grid::embedding_device},
      {"cp", &Grid::cp_group, &Grid::cp_device},
      {"dp_cp", &Grid::dp_cp_group, &Grid::dp_cp_device},
  };
  for (const auto& [name, host, device] : kinds)
    if (s.host == host) return {name, device};
  return {"?", nullptr};
}

TEST(GridGroups, EveryGroupOfSeveralGridsFollowsTheRankFormula) {
  const std::vector<GridShape> shapes = {{1, 1, 1, 1}, {2, 1, 1, 1}, {1, 2, 1, 1}, {2, 2, 1, 1}, {1, 2, 2, 2},
                                         {2, 2, 2, 2}, {3, 2, 1, 2}, {2, 1, 3, 2}, {1, 4, 1, 1}, {2, 3, 2, 1},
                                         {4, 1, 2, 1}, {1, 1, 4, 3}};
  for (const GridShape& s : shapes) {
    const Formula f{s};
    const int world = s.world();
    SCOPED_TRACE("TP " + std::to_string(s.tp) + " CP " + std::to_string(s.cp) + " PP " + std::to_string(s.pp) +
                 " DP " + std::to_string(s.dp));
    // MPI_Comm_split's result: per kind and color, the ranks ordered by (key, world rank)
    std::vector<std::vector<GroupSplit>> splits;
    for (int r = 0; r < world; ++r) splits.push_back(grid_group_splits(s, r));
    const size_t kinds = splits[0].size();
    std::map<std::pair<std::string, int>, std::vector<std::pair<int, int>>> groups;
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(splits[size_t(r)].size(), kinds) << "rank " << r << ": another number of groups";
      for (size_t k = 0; k < kinds; ++k) {
        const GroupSplit& g = splits[size_t(r)][k];
        EXPECT_EQ(g.host, splits[0][k].host) << "rank " << r << ": the groups in another order";
        if (g.color >= 0) groups[{kind_of(g).first, g.color}].push_back({g.key, r});
      }
    }
    for (auto& [kind, members] : groups) std::sort(members.begin(), members.end());
    for (int r = 0; r < world; ++r) {
      const std::vector<int> x = f.coords(r);
      const GridCoords c = grid_coords(s, r);
      EXPECT_EQ(std::vector<int>({c.tp, c.cp, c.dp, c.pp}), x) << "coordinates of rank " << r;
      const auto want = expected_groups(f, r);
      std::map<std::string, std::vector<int>> got;
      for (const GroupSplit& g : splits[size_t(r)]) {
        const auto [name, device] = kind_of(g);
        EXPECT_EQ(g.device, device) << name << ": the device twin";
        if (g.color < 0) continue;
        for (const auto& [key, member] : groups[{name, g.color}]) got[name].push_back(member);
      }
      EXPECT_EQ(got, want) << "rank " << r;
    }
  }
}

// TP 2 x CP 2 x DP 2 on 8 threads: each group gathers its members' world ranks (int32) in its order.
TEST(GridGroups, ThreadRanksRunContextParallelGroups) {
  const GridShape s{2, 2, 1, 2};
  const Formula f{s};
  std::atomic<int> checked{0};
  run_thread_ranks(s, false, [&](Grid& g) {
    EXPECT_EQ(g.cp, 2);
    EXPECT_EQ(g.world_rank, f.rank(g.tp_rank, g.cp_rank, g.dp_rank, g.pp_rank));
    ASSERT_TRUE(g.cp_group && g.dp_cp_group);
    EXPECT_EQ(g.cp_group->rank(), g.cp_rank);
    EXPECT_EQ(g.dp_cp_group->rank(), g.dp_cp_rank());
    EXPECT_EQ(&g.dp_cp(), g.dp_cp_group.get());
    EXPECT_EQ(g.tp_device, nullptr);  // host groups only
    const auto want = expected_groups(f, g.world_rank);
    const std::vector<std::pair<std::string, Comm*>> groups = {
        {"tp", g.tp_group.get()}, {"dp", g.dp_group.get()}, {"mp", g.mp_group.get()},
        {"cp", g.cp_group.get()}, {"dp_cp", g.dp_cp_group.get()}};
    for (const auto& [name, comm] : groups) {
      const int32_t me = g.world_rank;
      std::vector<int32_t> all(size_t(comm->size()), -1);
      comm->all_gather(all.data(), &me, 1, DType::I32);
      EXPECT_EQ(std::vector<int>(all.begin(), all.end()), want.at(name)) << name << ", rank " << g.world_rank;
    }
    ++checked;
  });
  EXPECT_EQ(checked.load(), 8);
}

}  // namespace
}  // namespace tpt
