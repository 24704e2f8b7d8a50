// The grid's groups (parallel/grid.h grid_group_splits, which make_grid, setup_cuda_devices and
// threads as ranks all use) for several TP x CP x PP x DP grids against the groups derived here
// from the rank formula of docs/ARCHITECTURE.md "Process grid", rank = tp + TP*(cp + CP*(dp +
// DP*pp)), and the expert grid's groups (EP, EDP, ETP) against the folding of docs/MOE.md, within a
// stage tp + TP*(cp + CP*dp) = etp + ETP*(ep + EP*edp) -- where a group is not made, the dense
// group its accessor falls back on has the expert group's members; a CP 2 grid and two expert grids
// on thread ranks, whose groups gather their members' world ranks in that order.
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
  // the expert coordinates of a rank, by search: (etp, ep, edp, p), the stage's ranks in the order
  // etp fastest, then ep, then edp
  std::vector<int> expert_coords(int r) const {
    const int etp = s.etp > 0 ? s.etp : s.tp, stage = s.tp * s.cp * s.dp;
    const int edp = stage / (etp * s.ep);
    for (int p = 0, at = 0; p < s.pp; ++p)
      for (int d = 0; d < edp; ++d)
        for (int e = 0; e < s.ep; ++e)
          for (int t = 0; t < etp; ++t, ++at)
            if (at == r) return {t, e, d, p};
    return {};
  }
};

// The expert groups of world rank r by name (its members' world ranks in group order): every rank
// with the same stage and the same other two expert coordinates, ordered by the group's own.
std::map<std::string, std::vector<int>> expected_expert_groups(const Formula& f, int r) {
  const std::vector<int> x = f.expert_coords(r);
  std::map<std::string, std::vector<int>> m;
  for (int axis = 0; axis < 3; ++axis) {
    std::vector<std::pair<int, int>> members;  // (coordinate on the axis, world rank)
    for (int q = 0; q < f.s.world(); ++q) {
      const std::vector<int> y = f.expert_coords(q);
      bool same = y[3] == x[3];
      for (int a = 0; a < 3; ++a) same = same && (a == axis || y[size_t(a)] == x[size_t(a)]);
      if (same) members.push_back({y[size_t(axis)], q});
    }
    std::sort(members.begin(), members.end());
    const char* name = axis == 0 ? "etp" : axis == 1 ? "ep" : "edp";
    for (const auto& [key, q] : members) m[name].push_back(q);
  }
  return m;
}

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
      {"ep", &Grid::ep_group, &Grid::ep_device},
      {"edp", &Grid::edp_group, &Grid::edp_device},
      {"etp", &Grid::etp_group, &Grid::etp_device},
  };
  for (const auto& [name, host, device] : kinds)
    if (s.host == host) return {name, device};
  return {"?", nullptr};
}

TEST(GridGroups, EveryGroupOfSeveralGridsFollowsTheRankFormula) {
  const std::vector<GridShape> shapes = {{1, 1, 1, 1}, {2, 1, 1, 1}, {1, 2, 1, 1}, {2, 2, 1, 1}, {1, 2, 2, 2},
                                         {2, 2, 2, 2}, {3, 2, 1, 2}, {2, 1, 3, 2}, {1, 4, 1, 1}, {2, 3, 2, 1},
                                         {4, 1, 2, 1}, {1, 1, 4, 3},
                                         // expert grids: {tp, cp, pp, dp, ep, etp (0 = tp)}
                                         {2, 1, 1, 4, 4, 0}, {2, 1, 1, 4, 4, 1}, {2, 1, 1, 4, 2, 1}, {2, 1, 1, 2, 1, 1},
                                         {1, 1, 2, 4, 2, 0}, {2, 2, 2, 2, 4, 0}, {2, 2, 1, 2, 8, 1}, {4, 1, 1, 2, 2, 2},
                                         {3, 2, 1, 2, 2, 0}, {1, 2, 3, 2, 4, 1}};
  for (const GridShape& s : shapes) {
    const Formula f{s};
    const int world = s.world();
    SCOPED_TRACE("TP " + std::to_string(s.tp) + " CP " + std::to_string(s.cp) + " PP " + std::to_string(s.pp) +
                 " DP " + std::to_string(s.dp) + " EP " + std::to_string(s.ep) + " ETP " + std::to_string(s.etp));
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
      EXPECT_EQ(std::vector<int>({c.etp, c.ep, c.edp, c.pp}), f.expert_coords(r)) << "expert coordinates of " << r;
      std::map<std::string, std::vector<int>> want = expected_groups(f, r);
      // the expert groups made (EP > 1: ep; EP > 1 or ETP != TP: edp; ETP != TP: etp), and where
      // one is not, the dense group its accessor falls back on has its members
      const std::map<std::string, std::vector<int>> expert = expected_expert_groups(f, r);
      const bool etp_is_tp = s.etp == 0 || s.etp == s.tp;
      if (s.ep > 1) want["ep"] = expert.at("ep");
      else EXPECT_EQ(expert.at("ep"), std::vector<int>{r});
      if (s.ep > 1 || !etp_is_tp) want["edp"] = expert.at("edp");
      else EXPECT_EQ(expert.at("edp"), want.at(s.cp > 1 ? "dp_cp" : "dp"));
      if (!etp_is_tp) want["etp"] = expert.at("etp");
      else EXPECT_EQ(expert.at("etp"), want.at("tp"));
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

// TP 2 x DP 4 with EP 4, written out by hand: with ETP = TP each TP rank's experts spread over the
// four DP ranks (ep = dp, EDP 1); with ETP 1 the stage's eight ranks are EP 4 x EDP 2 (ep = rank % 4,
// edp = rank / 4), each expert group of four consecutive ranks.
TEST(GridGroups, ExpertGroupsOfTp2Dp4Ep4) {
  auto members = [](const GridShape& s, int rank, std::unique_ptr<Comm> Grid::*host) {
    std::vector<std::vector<GroupSplit>> all;
    for (int r = 0; r < s.world(); ++r) all.push_back(grid_group_splits(s, r));
    std::vector<int> out;
    const GroupSplit* mine = nullptr;
    for (const GroupSplit& g : all[size_t(rank)])
      if (g.host == host) mine = &g;
    if (!mine) return std::vector<int>{-1};  // not made
    std::vector<std::pair<int, int>> m;
    for (int r = 0; r < s.world(); ++r)
      for (const GroupSplit& g : all[size_t(r)])
        if (g.host == host && g.color == mine->color) m.push_back({g.key, r});
    std::sort(m.begin(), m.end());
    for (const auto& [key, r] : m) out.push_back(r);
    return out;
  };
  const GridShape folded_tp{2, 1, 1, 4, 4, 0}, whole{2, 1, 1, 4, 4, 1};
  using V = std::vector<int>;
  EXPECT_EQ(members(folded_tp, 0, &Grid::ep_group), V({0, 2, 4, 6}));
  EXPECT_EQ(members(folded_tp, 5, &Grid::ep_group), V({1, 3, 5, 7}));
  EXPECT_EQ(members(folded_tp, 5, &Grid::edp_group), V({5}));
  EXPECT_EQ(members(folded_tp, 5, &Grid::etp_group), V({-1}));  // the TP group
  EXPECT_EQ(members(whole, 0, &Grid::ep_group), V({0, 1, 2, 3}));
  EXPECT_EQ(members(whole, 5, &Grid::ep_group), V({4, 5, 6, 7}));
  EXPECT_EQ(members(whole, 0, &Grid::edp_group), V({0, 4}));
  EXPECT_EQ(members(whole, 6, &Grid::edp_group), V({2, 6}));
  EXPECT_EQ(members(whole, 6, &Grid::etp_group), V({6}));
  EXPECT_EQ(members(GridShape{2, 1, 1, 4}, 0, &Grid::edp_group), V({-1}));  // dense: the DP group
  Grid g;
  place_in_grid(g, whole, 6);
  EXPECT_EQ(std::vector<int>({g.ep, g.etp, g.edp, g.ep_rank, g.etp_rank, g.edp_rank}), V({4, 1, 2, 2, 0, 1}));
  place_in_grid(g, folded_tp, 5);
  EXPECT_EQ(std::vector<int>({g.ep, g.etp, g.edp, g.ep_rank, g.etp_rank, g.edp_rank}), V({4, 2, 1, 2, 1, 0}));
}

// The start-up table: the expert grid's line and ep, edp columns only when it is folded.
TEST(GridGroups, TableShowsTheExpertGrid) {
  Grid g;
  place_in_grid(g, GridShape{2, 1, 1, 4, 4, 1}, 0);
  std::string t = g.table();
  EXPECT_NE(t.find("expert grid: ETP 1 x EP 4 x EDP 2 x PP 1"), std::string::npos) << t;
  EXPECT_NE(t.find("  rank  tp  pp  dp  ep  edp  host\n"), std::string::npos) << t;
  EXPECT_NE(t.find("\n     6   0   0   3   2    1  "), std::string::npos) << t;  // rank 6: tp 0, dp 3, ep 2, edp 1
  place_in_grid(g, GridShape{2, 1, 1, 4}, 0);
  t = g.table();
  EXPECT_EQ(t.find("expert"), std::string::npos) << t;
  EXPECT_NE(t.find("  rank  tp  pp  dp  host\n"), std::string::npos) << t;
  EXPECT_NE(t.find("\n     6   0   0   3  "), std::string::npos) << t;
}

// Two expert grids on 8 threads, TP 2 x CP 2 x DP 2 with EP 2 (ETP = TP) and TP 2 x DP 4 with EP 2,
// ETP 1: each expert group gathers its members' world ranks (int32) in its order; the accessors
// fall back on the dense groups where no group is made.
TEST(GridGroups, ThreadRanksRunExpertGroups) {
  for (const GridShape& s : {GridShape{2, 2, 1, 2, 2, 0}, GridShape{2, 1, 1, 4, 2, 1}}) {
    const Formula f{s};
    std::atomic<int> checked{0};
    run_thread_ranks(s, false, [&](Grid& g) {
      const std::vector<int> x = f.expert_coords(g.world_rank);
      EXPECT_EQ(std::vector<int>({g.etp_rank, g.ep_rank, g.edp_rank}), std::vector<int>(x.begin(), x.begin() + 3));
      ASSERT_TRUE(g.ep_group && g.edp_group);
      EXPECT_EQ(g.etp_group != nullptr, s.etp == 1);
      EXPECT_EQ(&g.device_ep(), g.ep_group.get());
      EXPECT_EQ(&g.device_edp(), g.edp_group.get());
      EXPECT_EQ(&g.device_etp(), s.etp == 1 ? g.etp_group.get() : g.tp_group.get());
      const auto want = expected_expert_groups(f, g.world_rank);
      const std::vector<std::pair<std::string, Comm*>> groups = {
          {"ep", &g.device_ep()}, {"edp", &g.device_edp()}, {"etp", &g.device_etp()}};
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
}

}  // namespace
}  // namespace tpt
