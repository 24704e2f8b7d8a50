// Entry point of the GPU tests (ctest label `gpu`). With no GPU visible -- CI, a laptop: no device
// or no NVIDIA driver at all (cuda_device_count) -- it prints one line and exits with kSkipped,
// which ctest reports as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt); any other CUDA error
// fails (exit 1). Under mpirun (the GpuNccl tests) every rank needs its own GPU; with fewer
// GPUs than ranks on the host every rank skips the same way (mpirun passes the code on).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <exception>

#include "core/cuda/cuda_ops.h"
#include "parallel/runtime.h"

// The exit status of a run that skipped every test (automake's convention).
constexpr int kSkipped = 77;

// Under mpirun, a failed assertion on one rank would leave the others waiting in their next
// collective until ctest's timeout: the first failure prints itself with its rank and aborts the
// job, so every rank ends at once (exit 1).
class AbortJobOnFailure : public ::testing::EmptyTestEventListener {
 public:
  explicit AbortJobOnFailure(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: failure, aborting the job:\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    tpt::runtime_abort(1);
  }

 private:
  int rank_;
};

int main(int argc, char** argv) {
  tpt::runtime_init(&argc, &argv);
  const int rank = tpt::runtime_world_rank(), world = tpt::runtime_world_size();
  // only "no GPU" skips; any other CUDA error (a driver too old, a device unavailable) fails the run
  int gpus = 0;
  try {
    gpus = tpt::cuda_device_count();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: GPU tests cannot start: %s\n", rank, e.what());
    tpt::runtime_finalize();
    return 1;
  }
  bool list_only = false;  // --gtest_list_tests works without a GPU
  for (int i = 1; i < argc; ++i) list_only |= std::strcmp(argv[i], "--gtest_list_tests") == 0;
  int status = 0;
  if (list_only) {
    ::testing::InitGoogleTest(&argc, argv);
    status = RUN_ALL_TESTS();
  } else if (gpus == 0) {
    if (rank == 0) std::printf("no GPU visible: skipping GPU tests\n");
    status = kSkipped;
  } else if (world > gpus) {
    if (rank == 0) std::printf("%d ranks but %d GPUs visible: skipping GPU tests\n", world, gpus);
    status = kSkipped;
  } else {
    ::testing::InitGoogleTest(&argc, argv);
    if (world > 1) ::testing::UnitTest::GetInstance()->listeners().Append(new AbortJobOnFailure(rank));
    if (rank == 0) std::printf("GPU 0: %s\n", tpt::cuda_device_name(0).c_str());
    status = RUN_ALL_TESTS();
  }
  tpt::runtime_finalize();
  return status;
}
