// Threads as ranks (parallel/thread_comm.h): the collectives against their definitions, the groups
// against make_grid's rank formula, a failing rank ending the run, and the real trainer in TP 2 x
// PP 2 x DP 2 on 8 threads against the one-rank run (the same check tests/cli/layouts.sh makes with
// mpirun; the GPU tests run it on one GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "tests/common/thread_ranks.h"

namespace tpt {
namespace {

TEST(ThreadRanks, CollectivesMatchTheirDefinitions) {
  run_thread_ranks(2, 1, 2, false, [](Grid& g) {
    Comm& c = *g.world;
    const int r = c.rank(), n = c.size();
    ASSERT_EQ(n, 4);
    const int k = 7;
    auto mine = [&](int q, int i) { return float(q + 1) * float(i) - float(q); };
    std::vector<float> x(k);
    for (int i = 0; i < k; ++i) x[size_t(i)] = mine(r, i);
    std::vector<float> sum = x, mx = x;
    c.all_reduce(sum.data(), k, ReduceOp::Sum);
    c.all_reduce(mx.data(), k, ReduceOp::Max);
    for (int i = 0; i < k; ++i) {
      float s = 0, m = -INFINITY;
      for (int q = 0; q < n; ++q) s += mine(q, i), m = std::max(m, mine(q, i));
      EXPECT_EQ(sum[size_t(i)], s);
      EXPECT_EQ(mx[size_t(i)], m);
    }
    double d = 0.5 * r;
    c.all_reduce(&d, 1, ReduceOp::Sum);
    EXPECT_EQ(d, 3.0);
    std::vector<float> all(size_t(n * k));
    c.all_gather(all.data(), x.data(), k);
    for (int q = 0; q < n; ++q) EXPECT_EQ(all[size_t(q * k + 3)], mine(q, 3));
    std::vector<float> part(k);  // block r of the gathered rows (the same on every rank), summed
    c.reduce_scatter(part.data(), all.data(), k);
    for (int i = 0; i < k; ++i) EXPECT_EQ(part[size_t(i)], float(n) * all[size_t(r * k + i)]);
    std::vector<float> b = x;
    c.broadcast(b.data(), k, 2);
    EXPECT_EQ(b[4], mine(2, 4));
    // a ring: send to the next rank, receive from the previous one, twice (messages stay in order)
    for (int round = 0; round < 2; ++round) {
      float out = float(10 * round + r), in = -1;
      c.send_recv(&out, 1, (r + 1) % n, &in, 1, (r + n - 1) % n);
      EXPECT_EQ(in, float(10 * round + (r + n - 1) % n));
    }
    c.barrier();
  });
}

TEST(ThreadRanks, GroupsFollowTheGridsRankFormula) {
  std::atomic<int> checked{0};
  run_thread_ranks(2, 3, 2, false, [&](Grid& g) {
    EXPECT_EQ(g.world_rank, Grid::rank_of(g.tp_rank, g.dp_rank, g.pp_rank, 2, 2));
    EXPECT_EQ(g.world->rank(), g.world_rank);
    EXPECT_EQ(g.tp_group->size(), 2);
    EXPECT_EQ(g.tp_group->rank(), g.tp_rank);
    EXPECT_EQ(g.pp_group->size(), 3);
    EXPECT_EQ(g.pp_group->rank(), g.pp_rank);
    EXPECT_EQ(g.dp_group->size(), 2);
    EXPECT_EQ(g.dp_group->rank(), g.dp_rank);
    EXPECT_EQ(g.mp_group->size(), 6);
    EXPECT_EQ(g.mp_group->rank(), g.pp_rank * 2 + g.tp_rank);
    EXPECT_EQ(g.embedding_group != nullptr, g.first_stage() || g.last_stage());
    // each group's members: the sum of their world ranks, against the formula
    double ranks = g.world_rank;
    g.tp_group->all_reduce(&ranks, 1, ReduceOp::Sum);
    double want = 0;
    for (int t = 0; t < 2; ++t) want += Grid::rank_of(t, g.dp_rank, g.pp_rank, 2, 2);
    EXPECT_EQ(ranks, want);
    ranks = g.world_rank;
    g.pp_group->all_reduce(&ranks, 1, ReduceOp::Sum);
    want = 0;
    for (int p = 0; p < 3; ++p) want += Grid::rank_of(g.tp_rank, g.dp_rank, p, 2, 2);
    EXPECT_EQ(ranks, want);
    if (g.embedding_group) {
      ranks = g.world_rank;
      g.embedding_group->all_reduce(&ranks, 1, ReduceOp::Sum);
      EXPECT_EQ(ranks, Grid::rank_of(g.tp_rank, g.dp_rank, 0, 2, 2) + Grid::rank_of(g.tp_rank, g.dp_rank, 2, 2, 2));
    }
    ++checked;
  });
  EXPECT_EQ(checked.load(), 12);
}

TEST(ThreadRanks, AFailingRankEndsEveryRankPromptly) {
  const auto start = std::chrono::steady_clock::now();
  try {
    run_thread_ranks(2, 2, 1, false, [](Grid& g) {
      g.world->barrier();
      if (g.world_rank == 3) internal_error("injected failure");
      float x = 0;
      if (g.world_rank == 2) g.world->send_recv(nullptr, 0, 0, &x, 1, 3);  // a message rank 3 never sends
      else g.world->barrier();  // rank 3 never comes
    });
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3: injected failure"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

class ThreadRanksTrainer : public ::testing::TestWithParam<const char*> {};

// The 3D layout's losses and gradient norms, on every rank, against the one-rank run: fp32 within
// 1e-5 relative (summation order only, as tests/cli/layouts.sh); bf16 within 2e-2 (the roundings
// of a 16-bit activation differ with its TP shard; as tests/cli/precision.sh).
TEST_P(ThreadRanksTrainer, TP2xPP2xDP2OnThreadsMatchesOneRank) {
  const std::string precision = GetParam();
  const std::string dir = ::testing::TempDir() + "/thread_ranks_" + precision;
  const std::string data = test::write_random_dataset(dir, 101);
  // the same global batch: 8 per DP rank in the 3D run, 16 in all
  Config one_cfg = test::thread_test_config(dir, data, precision, 1, 1, 1, "cpu");
  Config cfg = test::thread_test_config(dir, data, precision, 2, 2, 2, "cpu");
  ASSERT_EQ(cfg.training.global_batch_size, 16);
  one_cfg.training.global_batch_size = 16;
  const test::StepLog ref = test::train_one_rank(one_cfg);
  const std::vector<test::StepLog> logs = test::train_thread_ranks(cfg);
  const double tol = precision == "fp32" ? 1e-5 : 2e-2;
  ASSERT_EQ(ref.loss.size(), 4u);
  for (size_t r = 0; r < logs.size(); ++r)
    for (size_t k = 0; k < ref.loss.size(); ++k) {
      EXPECT_NEAR(logs[r].loss[k], ref.loss[k], tol * std::abs(ref.loss[k])) << "rank " << r << " iteration " << k + 1;
      EXPECT_NEAR(logs[r].grad_norm[k], ref.grad_norm[k], 10 * tol * ref.grad_norm[k])
          << "rank " << r << " iteration " << k + 1;
      EXPECT_EQ(logs[r].loss[k], logs[0].loss[k]) << "every rank reports the same loss";
    }
  EXPECT_LT(ref.loss.back(), ref.loss.front()) << "it learns";
}

// The distributed optimizer (deferred reduce-scatters and parameter all-gathers on the thread
// groups, overlapped) and sequence parallelism on threads: the one-rank run's losses within 1e-5.
TEST(ThreadRanks, DistributedOptimizerAndSequenceParallelMatchOneRank) {
  const std::string dir = ::testing::TempDir() + "/thread_ranks_distopt_sp";
  const std::string data = test::write_random_dataset(dir, 101);
  Config one_cfg = test::thread_test_config(dir, data, "fp32", 1, 1, 1, "cpu");
  Config cfg = test::thread_test_config(dir, data, "fp32", 2, 2, 2, "cpu");
  one_cfg.training.global_batch_size = cfg.training.global_batch_size;
  cfg.parallel.distributed_optimizer = cfg.parallel.sequence_parallel = true;
  cfg.parallel.overlap_grad_reduce = cfg.parallel.overlap_param_gather = true;
  cfg.parallel.ddp_bucket_size = 1;
  const test::StepLog ref = test::train_one_rank(one_cfg);
  const std::vector<test::StepLog> logs = test::train_thread_ranks(cfg);
  for (size_t r = 0; r < logs.size(); ++r)
    for (size_t k = 0; k < ref.loss.size(); ++k) {
      EXPECT_NEAR(logs[r].loss[k], ref.loss[k], 1e-5 * std::abs(ref.loss[k])) << "rank " << r << " iteration " << k + 1;
      EXPECT_NEAR(logs[r].grad_norm[k], ref.grad_norm[k], 1e-4 * ref.grad_norm[k]) << "rank " << r << " iteration " << k + 1;
    }
  // no allocation or free after iteration 1 (the GPU test checks the same of the CUDA backend's buffers)
  for (size_t r = 0; r < logs.size(); ++r)
    EXPECT_EQ(logs[r].allocator_calls.back(), logs[r].allocator_calls.front()) << "rank " << r;
}

// The DP buckets, started from the backward hooks while backward goes on, are never written inside
// their reduction window (the thread groups read a bucket at finish, as late as an asynchronous sum
// may): each bucket's sum equals the sum of its snapshots at start.
TEST(ThreadRanks, DpBucketsAreNotWrittenWhileTheirSumRuns) {
  const std::string dir = ::testing::TempDir() + "/thread_ranks_race";
  const std::string data = test::write_random_dataset(dir, 101);
  Config cfg = test::thread_test_config(dir, data, "fp32", 1, 1, 2, "cpu");
  int race[2] = {0, 0};
  test::train_thread_ranks(cfg, -1, race);
  EXPECT_GE(race[0], 2 * 4 * 2) << "buckets checked (2 ranks x 4 iterations x >= 2 buckets)";
  EXPECT_EQ(race[1], 0) << "buckets written during their sum";
  // the same with the distributed optimizer: the buckets are reduce-scattered
  cfg.parallel.distributed_optimizer = true;
  int race_do[2] = {0, 0};
  test::train_thread_ranks(cfg, -1, race_do);
  EXPECT_GE(race_do[0], 2 * 4 * 2) << "reduce-scattered buckets checked";
  EXPECT_EQ(race_do[1], 0) << "buckets written during their reduce-scatter";
}

// The checker itself: a bucket written between start and finish is caught.
TEST(ThreadRanks, TheRaceCheckerCatchesAWriteInsideTheWindow) {
  int raced = 0;
  std::mutex m;
  run_thread_ranks(1, 1, 2, false, [&](Grid& g) {
    test::BucketRaceChecker c(*g.dp_group, *g.dp_group, [](float* h, const float* b, int64_t n) { std::copy_n(b, n, h); });
    std::vector<float> a(10, 1.0f), b(10, 2.0f);
    c.start_all_reduce(a.data(), 10);
    c.start_all_reduce(b.data(), 10);
    if (g.dp_rank == 1) b[3] = 5.0f;  // inside b's window
    c.wait_all();
    EXPECT_EQ(a[0], 2.0f);
    EXPECT_EQ(c.buckets, 2);
    std::lock_guard<std::mutex> lock(m);
    raced += c.raced;
  });
  EXPECT_EQ(raced, 2) << "both ranks see b's sum differ from its snapshots'";
}

INSTANTIATE_TEST_SUITE_P(Precisions, ThreadRanksTrainer, ::testing::Values("fp32", "bf16"));

}  // namespace
}  // namespace tpt
