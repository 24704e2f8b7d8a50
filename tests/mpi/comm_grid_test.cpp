// The process grid and its communicators on 2 or 4 MPI ranks: every TP x PP x DP layout the world
// allows, coordinates by rank = tp + TP*(dp + DP*pp), each group's size, rank and members, and every
// collective of every group against results computed here by hand; with CP > 1 the CP ring and the
// DP x CP group of every layout, by rank = tp + TP*(cp + CP*(dp + DP*pp)); with EP > 1 or ETP 1 the
// expert grid's groups of every layout, by tp + TP*(cp + CP*dp) = etp + ETP*(ep + EP*edp) per stage.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "parallel/runtime.h"

namespace tpt {
namespace {

struct Layout {
  int tp, pp, dp;
};

std::string name_of(const Layout& l) {
  return "TP" + std::to_string(l.tp) + " PP" + std::to_string(l.pp) + " DP" + std::to_string(l.dp);
}

// Every (tp, pp, dp) whose product is the world size.
std::vector<Layout> layouts(int world) {
  std::vector<Layout> out;
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; pp <= world; ++pp)
      if (world % (tp * pp) == 0) out.push_back({tp, pp, world / (tp * pp)});
  return out;
}

// World ranks of a group, in the group's rank order, from the contract's formula.
struct Members {
  std::vector<int> tp, pp, dp, mp, embedding, world;
};

Members members_of(const Layout& l, int t, int p, int d) {
  Members m;
  for (int i = 0; i < l.tp; ++i) m.tp.push_back(Grid::rank_of(i, d, p, l.tp, l.dp));
  for (int i = 0; i < l.pp; ++i) m.pp.push_back(Grid::rank_of(t, d, i, l.tp, l.dp));
  for (int i = 0; i < l.dp; ++i) m.dp.push_back(Grid::rank_of(t, i, p, l.tp, l.dp));
  for (int j = 0; j < l.pp; ++j)
    for (int i = 0; i < l.tp; ++i) m.mp.push_back(Grid::rank_of(i, d, j, l.tp, l.dp));
  if (l.pp > 1 && (p == 0 || p == l.pp - 1))
    m.embedding = {Grid::rank_of(t, d, 0, l.tp, l.dp), Grid::rank_of(t, d, l.pp - 1, l.tp, l.dp)};
  for (int r = 0; r < l.tp * l.pp * l.dp; ++r) m.world.push_back(r);
  return m;
}

// Integer-valued floats: every sum below is exact, whatever the reduction order.
float val(int world_rank, int64_t i) { return float(100 * world_rank + i + 1); }
float val_max(int world_rank, int64_t i) { return float((world_rank * 7 + i * 3) % 11) - 5.0f; }
// Exact in double, not in float: a reduction done in float would lose the low bits.
double dval(int world_rank, int64_t i) { return 1099511627776.0 + 3.0 * world_rank + double(i); }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check_collectives(Comm& c, const std::vector<int>& members, int me, const std::string& what,
                       bool time_barrier) {
  SCOPED_TRACE(what);
  const int size = int(members.size());
  ASSERT_EQ(c.size(), size);
  const int rank = int(std::find(members.begin(), members.end(), me) - members.begin());
  ASSERT_LT(rank, size) << "this rank is not a member";
  ASSERT_EQ(c.rank(), rank);

  // all_gather of the world ranks: the members, in group order
  {
    const float mine = float(me);
    std::vector<float> all(size_t(size), -1.0f);
    c.all_gather(all.data(), &mine, 1);
    for (int k = 0; k < size; ++k) EXPECT_EQ(all[size_t(k)], float(members[size_t(k)])) << "member " << k;
  }
  const int64_t n = 5;
  // all_reduce sum / max, float
  {
    std::vector<float> s(n), mx(n);
    for (int64_t i = 0; i < n; ++i) s[size_t(i)] = val(me, i), mx[size_t(i)] = val_max(me, i);
    c.all_reduce(s.data(), n, ReduceOp::Sum);
    c.all_reduce(mx.data(), n, ReduceOp::Max);
    for (int64_t i = 0; i < n; ++i) {
      float ws = 0, wm = -1e30f;
      for (int m : members) ws += val(m, i), wm = std::max(wm, val_max(m, i));
      EXPECT_EQ(s[size_t(i)], ws) << "float sum, element " << i;
      EXPECT_EQ(mx[size_t(i)], wm) << "float max, element " << i;
    }
  }
  // all_reduce sum / max, double
  {
    std::vector<double> s(n), mx(n);
    for (int64_t i = 0; i < n; ++i) s[size_t(i)] = dval(me, i), mx[size_t(i)] = -dval(me, i);
    c.all_reduce(s.data(), n, ReduceOp::Sum);
    c.all_reduce(mx.data(), n, ReduceOp::Max);
    for (int64_t i = 0; i < n; ++i) {
      double ws = 0, wm = -1e300;
      for (int m : members) ws += dval(m, i), wm = std::max(wm, -dval(m, i));
      EXPECT_EQ(s[size_t(i)], ws) << "double sum, element " << i;
      EXPECT_EQ(mx[size_t(i)], wm) << "double max, element " << i;
    }
  }
  // all_gather of 3 floats each
  {
    const int64_t k = 3;
    std::vector<float> in(k), out(size_t(k * size), -1.0f);
    for (int64_t i = 0; i < k; ++i) in[size_t(i)] = val(me, i);
    c.all_gather(out.data(), in.data(), k);
    for (int r = 0; r < size; ++r)
      for (int64_t i = 0; i < k; ++i)
        EXPECT_EQ(out[size_t(r * k + i)], val(members[size_t(r)], i)) << "all_gather block " << r;
  }
  // reduce_scatter: in (size * 3), block `rank` of the sum
  {
    const int64_t k = 3;
    std::vector<float> in(size_t(k * size)), out(size_t(k), -1.0f);
    for (int64_t j = 0; j < k * size; ++j) in[size_t(j)] = val(me, j);
    c.reduce_scatter(out.data(), in.data(), k);
    for (int64_t i = 0; i < k; ++i) {
      float w = 0;
      for (int m : members) w += val(m, rank * k + i);
      EXPECT_EQ(out[size_t(i)], w) << "reduce_scatter element " << i;
    }
  }
  // broadcast from every root
  for (int root = 0; root < size; ++root) {
    std::vector<float> b(n);
    for (int64_t i = 0; i < n; ++i) b[size_t(i)] = rank == root ? val(me, i) : -7.0f;
    c.broadcast(b.data(), n, root);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(b[size_t(i)], val(members[size_t(root)], i)) << "broadcast root " << root;
  }
  // send_recv around a ring: send to the next, receive from the previous
  {
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    std::vector<float> out(n), in(n, -1.0f);
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = val(me, i);
    c.send_recv(out.data(), n, next, in.data(), n, prev);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(in[size_t(i)], val(members[size_t(prev)], i)) << "ring";
  }
  // pipeline-style: one-sided at the ends, and message lengths that differ per rank
  {
    const int64_t send_n = rank + 1 < size ? 2 + rank : 0;
    const int64_t recv_n = rank > 0 ? 2 + (rank - 1) : 0;
    std::vector<float> out(size_t(std::max<int64_t>(send_n, 1))), in(size_t(std::max<int64_t>(recv_n, 1)), -1.0f);
    for (int64_t i = 0; i < send_n; ++i) out[size_t(i)] = val(me, i);
    c.send_recv(out.data(), send_n, rank + 1 < size ? rank + 1 : 0, in.data(), recv_n, rank > 0 ? rank - 1 : 0);
    for (int64_t i = 0; i < recv_n; ++i) EXPECT_EQ(in[size_t(i)], val(members[size_t(rank - 1)], i)) << "chain";
  }
  // barrier: nobody leaves before the last one (group rank 0, after a sleep) has entered
  c.barrier();
  if (time_barrier && size > 1) {
    double entered = 0;
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      entered = now_s();
    }
    c.barrier();
    const double left = now_s();
    c.all_reduce(&entered, 1, ReduceOp::Max);
    EXPECT_GE(left, entered) << "a rank left the barrier before group rank 0 entered it";
  }
}

TEST(MpiGrid, CoordinatesGroupsAndCollectivesOfEveryLayout) {
  const int world = runtime_world_size();
  const int me = runtime_world_rank();
  ASSERT_GE(world, 2) << "run under mpirun -np 2 or 4";
  const std::vector<Layout> all = layouts(world);
  EXPECT_EQ(all.size(), world == 4 ? 6u : (world == 2 ? 3u : all.size()));
  for (const Layout& l : all) {
    SCOPED_TRACE(name_of(l));
    Grid g = make_grid(l.tp, l.pp, l.dp);
    EXPECT_EQ(g.world_size, world);
    EXPECT_EQ(g.world_rank, me);
    EXPECT_EQ(g.tp, l.tp);
    EXPECT_EQ(g.pp, l.pp);
    EXPECT_EQ(g.dp, l.dp);
    // rank = tp + TP * (dp + DP * pp)
    EXPECT_EQ(me, g.tp_rank + l.tp * (g.dp_rank + l.dp * g.pp_rank));
    EXPECT_EQ(Grid::rank_of(g.tp_rank, g.dp_rank, g.pp_rank, l.tp, l.dp), me);
    EXPECT_GE(g.tp_rank, 0);
    EXPECT_LT(g.tp_rank, l.tp);
    EXPECT_GE(g.dp_rank, 0);
    EXPECT_LT(g.dp_rank, l.dp);
    EXPECT_GE(g.pp_rank, 0);
    EXPECT_LT(g.pp_rank, l.pp);
    EXPECT_EQ(g.first_stage(), g.pp_rank == 0);
    EXPECT_EQ(g.last_stage(), g.pp_rank == l.pp - 1);
    // one host: every rank is local
    EXPECT_EQ(g.local_size, world);
    EXPECT_EQ(g.local_rank, me);

    const Members m = members_of(l, g.tp_rank, g.pp_rank, g.dp_rank);
    ASSERT_TRUE(g.world && g.tp_group && g.pp_group && g.dp_group && g.mp_group);
    const bool check_time = l.tp == world || l.pp == world;  // the barrier timing on a few groups
    check_collectives(*g.world, m.world, me, "world", check_time);
    check_collectives(*g.tp_group, m.tp, me, "tp group", l.tp > 1);
    check_collectives(*g.pp_group, m.pp, me, "pp group", l.pp > 1);
    check_collectives(*g.dp_group, m.dp, me, "dp group", false);
    check_collectives(*g.mp_group, m.mp, me, "mp group", false);
    if (m.embedding.empty()) {
      EXPECT_EQ(g.embedding_group, nullptr) << "embedding group on a middle stage or with PP = 1";
    } else {
      ASSERT_NE(g.embedding_group, nullptr);
      check_collectives(*g.embedding_group, m.embedding, me, "embedding group", false);
    }

    // the printed table has one line per rank with that rank's coordinates
    const std::string table = g.table();
    for (int r = 0; r < world; ++r) {
      char line[64];
      std::snprintf(line, sizeof(line), "  %4d  %2d  %2d  %2d  ", r, r % l.tp, r / (l.tp * l.dp), (r / l.tp) % l.dp);
      EXPECT_NE(table.find(line), std::string::npos) << "no line for rank " << r << " in\n" << table;
    }
  }
}

// With context parallelism: every (tp, cp > 1, pp, dp) layout of the world; the CP ring (same tp,
// dp, pp; by cp rank) and the weights' replica group DP x CP (same tp, pp; by cp + CP * dp) gather
// their members' world ranks in the order of rank = tp + TP * (cp + CP * (dp + DP * pp)).
TEST(MpiGrid, ContextParallelGroupsOfEveryLayout) {
  const int world = runtime_world_size();
  for (int cp = 2; cp <= world; cp *= 2)
    for (const Layout& l : layouts(world / cp)) {
      SCOPED_TRACE(name_of(l) + " CP" + std::to_string(cp));
      Grid g = make_grid(l.tp, l.pp, l.dp, cp);
      auto rank_of = [&](int t, int c, int d, int p) { return t + l.tp * (c + cp * (d + l.dp * p)); };
      EXPECT_EQ(g.world_rank, rank_of(g.tp_rank, g.cp_rank, g.dp_rank, g.pp_rank));
      ASSERT_TRUE(g.cp_group && g.dp_cp_group);
      std::vector<int> want_cp, want_dp_cp;
      for (int c = 0; c < cp; ++c) want_cp.push_back(rank_of(g.tp_rank, c, g.dp_rank, g.pp_rank));
      for (int d = 0; d < l.dp; ++d)
        for (int c = 0; c < cp; ++c) want_dp_cp.push_back(rank_of(g.tp_rank, c, d, g.pp_rank));
      const std::pair<Comm*, std::vector<int>> groups[] = {{g.cp_group.get(), want_cp},
                                                            {g.dp_cp_group.get(), want_dp_cp}};
      for (const auto& [comm, want] : groups) {
        const int32_t me = g.world_rank;
        std::vector<int32_t> all(want.size(), -1);
        ASSERT_EQ(comm->size(), int(want.size()));
        comm->all_gather(all.data(), &me, 1, DType::I32);
        EXPECT_EQ(std::vector<int>(all.begin(), all.end()), want);
      }
      check_collectives(*g.cp_group, want_cp, g.world_rank, "cp group", false);
    }
}

// The expert grid folded into every (tp, cp, pp, dp) layout of the world, for every EP > 1 and ETP
// in {1, TP} that fits a stage (and ETP 1 with EP 1): its coordinates, and the EP, EDP and ETP groups
// (or the dense groups their accessors fall back on) gathering their members' world ranks in order.
TEST(MpiGrid, ExpertGroupsOfEveryLayout) {
  const int world = runtime_world_size();
  int checked = 0;
  for (int cp = 1; cp <= world; cp *= 2)
    for (const Layout& l : layouts(world / cp)) {
      const int stage = l.tp * cp * l.dp;
      for (int etp : l.tp > 1 ? std::vector<int>{1, l.tp} : std::vector<int>{1})
        for (int ep = 1; ep <= stage; ep *= 2) {
          if (stage % (etp * ep) != 0 || (ep == 1 && etp == l.tp)) continue;  // no fit, or the dense grid
          SCOPED_TRACE(name_of(l) + " CP" + std::to_string(cp) + " EP" + std::to_string(ep) + " ETP" +
                       std::to_string(etp));
          Grid g = make_grid(GridShape{l.tp, cp, l.pp, l.dp, ep, etp});
          const int edp = stage / (etp * ep), me = g.world_rank, in_stage = me % stage;
          // the stage's ranks in expert order: etp fastest, then ep, then edp
          auto rank_of = [&](int t, int e, int d) { return g.pp_rank * stage + t + etp * (e + ep * d); };
          EXPECT_EQ(me, rank_of(g.etp_rank, g.ep_rank, g.edp_rank));
          EXPECT_EQ(in_stage, g.etp_rank + etp * (g.ep_rank + ep * g.edp_rank));
          EXPECT_EQ(std::vector<int>({g.ep, g.etp, g.edp}), std::vector<int>({ep, etp, edp}));
          std::vector<int> want_ep, want_edp, want_etp;
          for (int e = 0; e < ep; ++e) want_ep.push_back(rank_of(g.etp_rank, e, g.edp_rank));
          for (int d = 0; d < edp; ++d) want_edp.push_back(rank_of(g.etp_rank, g.ep_rank, d));
          for (int t = 0; t < etp; ++t) want_etp.push_back(rank_of(t, g.ep_rank, g.edp_rank));
          EXPECT_EQ(g.ep_group != nullptr, ep > 1);
          EXPECT_NE(g.edp_group, nullptr);
          EXPECT_EQ(g.etp_group != nullptr, etp != l.tp);
          std::vector<std::pair<Comm*, std::vector<int>>> groups = {{&g.device_edp(), want_edp},
                                                                     {&g.device_etp(), want_etp}};
          if (ep > 1) groups.push_back({&g.device_ep(), want_ep});
          for (const auto& [comm, want] : groups) {
            const int32_t mine = me;
            std::vector<int32_t> all(want.size(), -1);
            ASSERT_EQ(comm->size(), int(want.size()));
            comm->all_gather(all.data(), &mine, 1, DType::I32);
            EXPECT_EQ(std::vector<int>(all.begin(), all.end()), want);
          }
          if (ep > 1) check_collectives(g.device_ep(), want_ep, me, "ep group", false);
          // the table's expert columns: rank, tp, [cp,] pp, dp, then ep, edp
          const std::string table = g.table();
          EXPECT_NE(table.find("expert grid: ETP " + std::to_string(etp) + " x EP " + std::to_string(ep)), std::string::npos)
              << table;
          ++checked;
        }
    }
  EXPECT_GE(checked, world == 4 ? 8 : 2);
}

// All groups of one grid used in an interleaved order (as the trainer does): nothing mixes up
// messages between communicators.
TEST(MpiGrid, GroupsDoNotInterfere) {
  const int world = runtime_world_size();
  const int me = runtime_world_rank();
  const int tp = world >= 4 ? 2 : 1, pp = 2, dp = world / (tp * pp);
  Grid g = make_grid(tp, pp, dp);
  const Members m = members_of({tp, pp, dp}, g.tp_rank, g.pp_rank, g.dp_rank);
  for (int round = 0; round < 3; ++round) {
    std::vector<float> a(4, float(me + round)), b(4, float(10 * me + round));
    g.tp_group->all_reduce(a.data(), 4, ReduceOp::Sum);
    g.pp_group->all_reduce(b.data(), 4, ReduceOp::Sum);
    float wa = 0, wb = 0;
    for (int r : m.tp) wa += float(r + round);
    for (int r : m.pp) wb += float(10 * r + round);
    EXPECT_EQ(a[0], wa);
    EXPECT_EQ(b[3], wb);
    const int stage = g.pp_rank, next = (stage + 1) % pp, prev = (stage + pp - 1) % pp;
    std::vector<float> out(3, float(me * 3 + round)), in(3, -1.0f);
    g.pp_group->send_recv(out.data(), 3, next, in.data(), 3, prev);
    EXPECT_EQ(in[2], float(m.pp[size_t(prev)] * 3 + round));
  }
}

// The non-blocking collectives of the DP buckets (the distributed optimizer's gradient
// reduce-scatter and parameter all-gather), in place, interleaved with blocking traffic on
// another group; wait(ticket) completes that one and every earlier one.
TEST(MpiGrid, StartedReduceScattersAndAllGathersInPlace) {
  const int world = runtime_world_size();
  Grid g = make_grid(1, 1, world);
  Comm& dp = *g.dp_group;
  const int r = dp.rank(), n = dp.size();
  const int64_t k = 5;  // elements per rank's block
  std::vector<float> grads(size_t(n * k)), params(size_t(n * k), -1.0f);
  for (int64_t i = 0; i < n * k; ++i) grads[size_t(i)] = float(100 * (r + 1) + i);
  for (int64_t i = 0; i < k; ++i) params[size_t(r * k + i)] = float(1000 * r + i);
  std::vector<float> extra(3, float(r));
  const int64_t t0 = dp.start_reduce_scatter(grads.data() + r * k, grads.data(), k);
  const int64_t t1 = dp.start_all_gather(params.data(), params.data() + r * k, k);
  g.world->all_reduce(extra.data(), 3, ReduceOp::Sum);  // other traffic meanwhile
  dp.wait(t0);
  for (int64_t i = 0; i < k; ++i) {
    float want = 0;
    for (int q = 0; q < n; ++q) want += float(100 * (q + 1) + r * k + i);
    EXPECT_EQ(grads[size_t(r * k + i)], want) << i;
  }
  dp.wait(t1);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < k; ++i) EXPECT_EQ(params[size_t(q * k + i)], float(1000 * q + i));
  EXPECT_EQ(extra[0], float(n * (n - 1) / 2));
  // wait_all after several: all complete
  std::vector<float> a(size_t(n) * 2, 1.0f), b(size_t(n) * 2, 0.0f);
  dp.start_all_reduce(a.data(), 2 * n);
  for (int64_t i = 0; i < 2; ++i) b[size_t(r * 2 + i)] = float(r);
  dp.start_all_gather(b.data(), b.data() + r * 2, 2);
  dp.wait_all();
  EXPECT_EQ(a[0], float(n));
  EXPECT_EQ(b[size_t(2 * (n - 1))], float(n - 1));
}

// The CP ring's started messages (Comm::start_exchange): a block sent round the ring while another
// tag's blocking messages and a started all-reduce run on the same group; each wait completes its
// ticket's messages, in start order with the collective.
TEST(MpiGrid, StartedMessagesRoundARingWithBlockingOnesBetween) {
  const int world = runtime_world_size();
  Grid g = make_grid(1, 1, world);
  Comm& c = *g.world;
  const int r = c.rank(), n = c.size(), next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<float> block(4), arrived(4, -1.0f), grad(2, float(r)), grad_in(2, -1.0f), sum(3, 1.0f);
  for (int i = 0; i < 4; ++i) block[size_t(i)] = float(10 * r + i);
  const int64_t t0 =
      c.start_exchange({{true, block.data(), 4, next, 0}, {false, arrived.data(), 4, prev, 0}});
  const int64_t t1 = c.start_all_reduce(sum.data(), 3);
  c.exchange({{true, grad.data(), 2, next, 1}, {false, grad_in.data(), 2, prev, 1}});  // meanwhile
  EXPECT_EQ(grad_in[1], float(prev));
  c.wait(t0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(arrived[size_t(i)], float(10 * prev + i)) << i;
  c.wait(t1);
  EXPECT_EQ(sum[2], float(n));
  // a started exchange of nothing, and wait_all with several in flight
  c.wait(c.start_exchange({}));
  std::vector<float> back(4, -1.0f);
  c.start_exchange({{true, arrived.data(), 4, prev, 0}, {false, back.data(), 4, next, 0}});
  c.start_all_reduce(sum.data(), 3);
  c.wait_all();
  EXPECT_EQ(back, block);
  EXPECT_EQ(sum[0], float(n * n));
}

}  // namespace
}  // namespace tpt
