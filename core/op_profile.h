// The op profile (logging.profile_ops): every Ops call, and every call of the device
// communicators, timed by kind on the backend's own clock (CUDA events on a GPU, the wall clock on
// the CPU), summed over the training iterations, and printed as a table: op, calls and ms per
// iteration, share, achieved TFLOP/s or GB/s. The same spans go to the Perfetto trace. This is how
// anyone with one GPU and no Nsight finds the next bottleneck.
//
// OpProfile holds the totals; make_profiled_ops wraps a backend so that the model, the optimizer
// and the gradient sync are timed without knowing it (parallel/profiled_comm.h does the same for a
// communicator).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/ops.h"

namespace tpt {

class OpProfile {
 public:
  // backend: whose marks time the spans. host_clock_us: the clock of the trace (the schedule's),
  // on which each iteration's spans are placed from the host time of its first mark.
  OpProfile(Ops& backend, std::function<double()> host_clock_us);

  // A span of the backend's work: begin() before issuing it, end() after (with the span's name,
  // its floating-point operations and the bytes it moves, for the rates).
  int64_t begin();
  void end(int64_t begin_mark, std::string_view name, double flops, double bytes);

  // After an iteration: waits for the backend, resolves the spans issued since the last flush,
  // adds them to the totals if `count` (training iterations after the first; not evaluation) and
  // returns them on the host clock for the trace.
  struct Timed {
    std::string name;
    double t0_us, t1_us;
  };
  std::vector<Timed> flush(bool count);
  // Marks the end of a counted iteration that took `wall_ms` (host time, start to end).
  void count_iteration(double wall_ms);

  // The table, per counted iteration, rows in descending time.
  std::string table() const;
  int64_t iterations() const { return iterations_; }

 private:
  struct Pending {
    std::string name;
    int64_t m0, m1;
    double flops, bytes;
  };
  struct Total {
    std::string name;
    int64_t calls = 0;
    double ms = 0, flops = 0, bytes = 0;
  };
  Ops& backend_;
  std::function<double()> host_clock_us_;
  std::vector<Pending> pending_;
  double anchor_us_ = 0;  // host time of mark 0 of the pending spans
  std::vector<Total> totals_;
  int64_t iterations_ = 0;
  double wall_ms_ = 0;
};

// Names a GEMM by its (input, output) widths, e.g. "mlp.fc1" (model/gpt.h's linear_name).
using LinearNamer = std::function<std::string(int64_t in, int64_t out)>;

// `inner` with every call timed into `profile` (inner must outlive the wrapper).
std::unique_ptr<Ops> make_profiled_ops(Ops& inner, OpProfile& profile, LinearNamer linear_name);

}  // namespace tpt
