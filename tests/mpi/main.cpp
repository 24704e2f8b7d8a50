// Entry point of the multi-rank test binary (run under mpirun by ctest): MPI start-up and shutdown
// around GoogleTest. Only rank 0 prints GoogleTest's output; another rank prints just its own
// failed assertions, prefixed with its rank. After each test the ranks agree on the outcome, so
// rank 0 reports a test that failed elsewhere, and every rank exits with the same status.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "parallel/runtime.h"

namespace {

// On ranks other than 0: failed assertions only, one line each.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
    std::fflush(stderr);
  }

 private:
  int rank_;
};

// On every rank: after each test, the ranks on which it failed (rank 0 prints them).
class RankAgreement : public ::testing::EmptyTestEventListener {
 public:
  explicit RankAgreement(tpt::Comm& world) : world_(world) {}
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const int n = world_.size();
    std::vector<double> failed(size_t(n), 0.0);
    failed[size_t(world_.rank())] = info.result()->Failed() ? 1.0 : 0.0;
    world_.all_reduce(failed.data(), n, tpt::ReduceOp::Sum);
    std::string who;
    for (int r = 0; r < n; ++r)
      if (failed[size_t(r)] != 0.0) who += " " + std::to_string(r);
    if (!who.empty()) {
      any_failed_ = true;
      if (world_.rank() == 0)
        std::printf("[rank 0] %s.%s failed on rank(s):%s\n", info.test_suite_name(), info.name(), who.c_str());
    }
  }
  bool any_failed() const { return any_failed_; }

 private:
  tpt::Comm& world_;
  bool any_failed_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  tpt::runtime_init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = tpt::runtime_world_rank();
  int status = 0;
  {
    const int world = tpt::runtime_world_size();
    tpt::Grid grid = tpt::make_grid(world, 1, 1);  // its world communicator, for the agreement
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (rank != 0) {
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(rank));
    }
    auto* agreement = new RankAgreement(*grid.world);  // owned by the listener list
    listeners.Append(agreement);
    status = RUN_ALL_TESTS();
    if (agreement->any_failed()) status = 1;
    delete listeners.Release(agreement);
  }
  tpt::runtime_finalize();
  return status;
}
