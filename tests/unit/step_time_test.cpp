// The step-time model's compiled schedule timing (plan/step_time.h) against the schedule
// simulator's time_pipeline (parallel/schedule.h), the independent reference: the same makespan and
// busy time per stage for every schedule kind, grid and random per-stage costs; and the model's
// hardware presets.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "plan/step_time.h"

namespace tpt {
namespace {

void expect_same(ScheduleKind kind, int P, int M, int v, std::mt19937& rng) {
  if (!check_schedule(kind, P, M, v).empty()) return;
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < P; ++s) lists.push_back(make_schedule(kind, P, s, M, v));
  ASSERT_EQ(simulate(lists), "");
  const CompiledSchedule compiled(lists);
  std::uniform_real_distribution<double> cost(0.1, 3.0);
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<double> f, b, w;
    for (int s = 0; s < P; ++s) {
      f.push_back(cost(rng));
      b.push_back(cost(rng));
      w.push_back(cost(rng));
    }
    const double p2p = trial == 0 ? 0.0 : cost(rng) / 4;
    const PipelineTiming want = time_pipeline(lists, f, b, w, p2p), got = compiled.time(f, b, w, p2p);
    const std::string where = "kind " + std::to_string(int(kind)) + " P=" + std::to_string(P) + " M=" +
                              std::to_string(M) + " v=" + std::to_string(v) + " trial " + std::to_string(trial);
    EXPECT_NEAR(got.makespan, want.makespan, 1e-9 * want.makespan) << where;
    ASSERT_EQ(got.busy.size(), want.busy.size()) << where;
    for (size_t s = 0; s < want.busy.size(); ++s) EXPECT_NEAR(got.busy[s], want.busy[s], 1e-9 * want.busy[s]) << where;
  }
}

TEST(StepTime, CompiledScheduleTimesAsTheSimulator) {
  std::mt19937 rng(7);
  for (int P = 1; P <= 5; ++P)
    for (int M = 1; M <= 10; ++M) {
      expect_same(ScheduleKind::OneFOneB, P, M, 1, rng);
      expect_same(ScheduleKind::GPipe, P, M, 1, rng);
      expect_same(ScheduleKind::ZeroBubbleH1, P, M, 1, rng);
      for (int v = 2; v <= 3; ++v) expect_same(ScheduleKind::Interleaved1F1B, P, M, v, rng);
    }
}

// Past ScheduleCache::bound_for the cache extrapolates the makespan from fewer micro-batches: the same
// makespan and busy times as the simulator on the whole schedule, for every kind, unequal stage costs
// and pipeline messages.
TEST(StepTime, ScheduleCacheTimesManyMicrobatchesAsTheSimulator) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> cost(0.1, 3.0);
  ScheduleCache cache;
  for (PipelineSchedule schedule : {PipelineSchedule::OneFOneB, PipelineSchedule::ZeroBubbleH1, PipelineSchedule::GPipe})
    for (int P : {2, 3, 5, 8})
      for (int v : {1, 2, 4}) {
        if (v > 1 && schedule != PipelineSchedule::OneFOneB) continue;
        const int bound = ScheduleCache::bound_for(P, v);
        for (int M : {bound + 3 * P, 2 * bound + P}) {
          Config c;
          c.parallel.pipeline_model_parallel_size = P;
          c.parallel.virtual_pipeline_model_parallel_size = v;
          c.parallel.pipeline_schedule = schedule;
          c.parallel.data_parallel_size = 1;
          c.training.micro_batch_size = 1;
          c.training.global_batch_size = M;
          const ScheduleKind kind = schedule_kind(schedule, v);
          if (!check_schedule(kind, P, M, v).empty()) continue;
          std::vector<std::vector<Action>> lists;
          for (int s = 0; s < P; ++s) lists.push_back(make_schedule(kind, P, s, M, v));
          std::vector<double> f, b, w;
          for (int s = 0; s < P; ++s) {
            f.push_back(cost(rng));
            b.push_back(cost(rng));
            w.push_back(cost(rng));
          }
          const double p2p = cost(rng) / 4;
          const PipelineTiming want = time_pipeline(lists, f, b, w, p2p), got = cache.time(c, f, b, w, p2p);
          const std::string where = "kind " + std::to_string(int(kind)) + " P=" + std::to_string(P) + " M=" +
                                    std::to_string(M) + " v=" + std::to_string(v);
          EXPECT_NEAR(got.makespan, want.makespan, 1e-9 * want.makespan) << where;
          ASSERT_EQ(got.busy.size(), want.busy.size()) << where;
          for (size_t s = 0; s < want.busy.size(); ++s) EXPECT_NEAR(got.busy[s], want.busy[s], 1e-9 * want.busy[s]) << where;
        }
      }
}

TEST(StepTime, HardwarePresets) {
  EXPECT_EQ(hardware_preset("h100").peak_tflops, 989);
  EXPECT_EQ(hardware_preset("h200").memory_gib, 141);
  EXPECT_GT(hardware_preset("h200").hbm_gbps, hardware_preset("h100").hbm_gbps);
  EXPECT_EQ(hardware_preset("a100").peak_tflops, 312);
  EXPECT_THROW(hardware_preset("v100"), InputError);
}

}  // namespace
}  // namespace tpt
