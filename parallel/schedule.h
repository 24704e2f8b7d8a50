// Pipeline schedules as data (docs/ARCHITECTURE.md "Pipeline parallelism (PP)"): a pure function gives each stage its
// list of actions; a simulator runs every stage's list together and checks it; the same lists
// drive training (parallel/pipeline.h), tracing and the planner.
//
// 1F1B (Megatron's PipeDream-Flush): stage s of P runs warmup = min(P - s - 1, M) forwards, then
// alternates one forward and one backward, then drains the remaining backwards; it holds at most
// min(P - s, M) micro-batches' activations. GPipe: all M forwards, then all M backwards.
// M < P is allowed: the schedules stay correct, with a larger bubble.
#pragma once
#include <string>
#include <vector>

namespace tpt {

struct Action {
  enum class Kind { Forward, Backward, Comm };
  Kind kind = Kind::Comm;
  int mb = -1;  // Forward/Backward: the micro-batch
  // Comm: one exchange, posted together and completed together (at most one peer per direction).
  int send_fwd = -1;  // send the activation of micro-batch n to the next stage
  int recv_fwd = -1;  // receive the activation of micro-batch n from the previous stage
  int send_bwd = -1;  // send the input gradient of micro-batch n to the previous stage
  int recv_bwd = -1;  // receive the output gradient of micro-batch n from the next stage
  std::string str() const;
};

enum class ScheduleKind { OneFOneB, GPipe, ForwardOnly };
ScheduleKind parse_schedule(const std::string& name);  // "1f1b" | "gpipe"

// The actions of stage `stage` of `stages` for `microbatches` micro-batches.
std::vector<Action> make_schedule(ScheduleKind kind, int stages, int stage, int microbatches);

// How many micro-batches a stage holds between forward and backward at most (activation slots).
int max_in_flight(const std::vector<Action>& actions);

// Runs all stages' lists together under rendezvous semantics (a Comm action completes only when
// every message in it has its matching counterpart posted). Checks: sends and receives pair up in
// order with the same micro-batch; nothing deadlocks; each micro-batch's forward precedes its
// backward, every forward/backward runs exactly once, a non-first stage receives an activation
// before its forward and a non-last stage receives a gradient before its backward; data is sent
// only after it was computed. Returns an empty string if all holds, else what went wrong.
std::string simulate(const std::vector<std::vector<Action>>& stages, bool with_backward = true);

}  // namespace tpt
