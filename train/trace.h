// logging.trace_file: a Chrome / Perfetto trace (JSON "traceEvents") of every rank's pipeline
// schedule -- one row per rank, one box per forward, backward (zb-h1: B), weight-gradient (zb-h1's
// W, category "weight") and communication action, named by Action::str ("F3", "B3c1": micro-batch 3
// of model chunk 1). Each
// rank writes its own events to <trace_file>.rank<R>; rank 0 merges them into <trace_file> at the
// end (ranks share the file system, as for checkpoints). A part or the trace that cannot be written
// is one warning and no file (train/aux_output.h): the run goes on.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/schedule.h"

namespace tpt {

class TraceRecorder {
 public:
  TraceRecorder(std::string path, int rank, int tp_rank, int pp_rank, int dp_rank);
  bool enabled() const { return !path_.empty(); }
  void record(int64_t iteration, const Action& a, double t0_us, double t1_us);
  // A span outside the schedule: category "allreduce" (gradient reduction), "optimizer", or "op"
  // (logging.profile_ops: one Ops call or collective, on a track of its own).
  void record_span(int64_t iteration, const std::string& name, const std::string& cat, double t0_us, double t1_us);
  // Writes this rank's part; rank 0 waits for `barrier` then merges all parts into the trace file.
  void write_part() const;
  // False (after a warning) when a part is missing or the trace cannot be written.
  static bool merge(const std::string& path, int world_size);

 private:
  struct Event {
    int64_t iteration;
    Action action;
    double t0, t1;
    std::string name, cat;  // set for spans outside the schedule
  };
  std::string path_;
  int rank_, tp_rank_, pp_rank_, dp_rank_;
  std::vector<Event> events_;
  static constexpr size_t kMaxEvents = 200000;
};

}  // namespace tpt
