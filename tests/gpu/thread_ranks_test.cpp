// The 3D GPU path on one GPU: the real trainer in TP 2 x PP 2 x DP 2 with 8 threads as the ranks
// (parallel/thread_comm.h), each with its own CUDA stream and CudaOps on GPU 0 and device groups
// that carry device buffers -- the TP sums in their 16-bit wire format, the packed pipeline
// messages, the DP buckets started from the backward hooks, the embedding group -- against the
// one-rank GPU run and the one-rank CPU run.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/common/thread_ranks.h"

namespace tpt {
namespace {

class GpuThreadRanks : public ::testing::TestWithParam<const char*> {};

// fp32: 1e-4 relative (summation orders of GPU and CPU, as GpuModel.Fp32TrainingMatchesCpu);
// bf16: 2e-2 (the mixed-precision tolerance of the precision tests). "+distopt_sp": with the
// distributed optimizer (reduce-scatter, parameter all-gather overlapped with the next forward)
// and sequence parallelism.
TEST_P(GpuThreadRanks, TP2xPP2xDP2OnOneGpuMatchesOneRank) {
  const std::string param = GetParam();
  const std::string precision = param.substr(0, param.find('+'));
  const bool distopt_sp = param.find("+distopt_sp") != std::string::npos;
  const std::string dir = ::testing::TempDir() + "/gpu_thread_ranks_" + precision + (distopt_sp ? "_distopt_sp" : "");
  const std::string data = test::write_random_dataset(dir, 101);
  Config one = test::thread_test_config(dir, data, precision, 1, 1, 1, "cuda");
  one.training.global_batch_size = 16;  // the 3D run's global batch (8 per DP rank)
  const test::StepLog gpu_one = test::train_one_rank(one);
  one.training.device = Device::Cpu;
  const test::StepLog cpu_one = test::train_one_rank(one);
  Config cfg = test::thread_test_config(dir, data, precision, 2, 2, 2, "cuda");
  if (distopt_sp) {
    cfg.parallel.distributed_optimizer = cfg.parallel.sequence_parallel = cfg.parallel.overlap_param_gather = true;
    cfg.parallel.ddp_bucket_size = 1;
  }
  const std::vector<test::StepLog> logs = test::train_thread_ranks(cfg, 0);
  const double tol = precision == "fp32" ? 1e-4 : 2e-2;
  for (size_t r = 0; r < logs.size(); ++r)
    for (size_t k = 0; k < gpu_one.loss.size(); ++k) {
      EXPECT_NEAR(logs[r].loss[k], gpu_one.loss[k], tol * std::abs(gpu_one.loss[k]))
          << "rank " << r << " iteration " << k + 1 << " vs one GPU rank";
      EXPECT_NEAR(logs[r].loss[k], cpu_one.loss[k], tol * std::abs(cpu_one.loss[k]))
          << "rank " << r << " iteration " << k + 1 << " vs one CPU rank";
      EXPECT_NEAR(logs[r].grad_norm[k], cpu_one.grad_norm[k], 10 * tol * cpu_one.grad_norm[k])
          << "rank " << r << " iteration " << k + 1 << " gradient norm vs one CPU rank";
      EXPECT_EQ(logs[r].loss[k], logs[0].loss[k]) << "every rank reports the same loss";
    }
  // no device allocation or free in iterations 2.. (every buffer sized at start-up or in iteration 1)
  for (size_t r = 0; r < logs.size(); ++r)
    EXPECT_EQ(logs[r].allocator_calls.back(), logs[r].allocator_calls.front()) << "rank " << r;
  EXPECT_EQ(gpu_one.allocator_calls.back(), gpu_one.allocator_calls.front()) << "one GPU rank";
}

// The DP buckets on one GPU: started from the backward hooks on the compute stream, never written
// inside their reduction window (the device groups read a bucket at finish, in stream order).
TEST(GpuThreadRanksRace, DpBucketsAreNotWrittenWhileTheirSumRuns) {
  const std::string dir = ::testing::TempDir() + "/gpu_thread_ranks_race";
  const std::string data = test::write_random_dataset(dir, 101);
  const Config cfg = test::thread_test_config(dir, data, "bf16", 1, 1, 2, "cuda");
  int race[2] = {0, 0};
  test::train_thread_ranks(cfg, 0, race);
  EXPECT_GE(race[0], 2 * 4 * 2) << "buckets checked";
  EXPECT_EQ(race[1], 0) << "buckets written during their sum";
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuThreadRanks, ::testing::Values("fp32", "bf16", "bf16+distopt_sp"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = c == '+' ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace tpt
