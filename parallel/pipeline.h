// Runs one stage's schedule (parallel/schedule.h): compute actions call back into the model,
// comm actions exchange activations and gradients with the neighbouring stages over the PP group
// (whose rank i is stage i), each exchange as one non-blocking send/recv pair.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/comm.h"
#include "parallel/schedule.h"

namespace tpt {

struct StageHooks {
  std::function<void(int mb)> forward;
  std::function<void(int mb)> backward;
  std::function<const float*(int mb)> activation_out;  // valid after forward(mb)
  std::function<float*(int mb)> activation_in;         // where to receive mb's input activation
  std::function<const float*(int mb)> grad_out;        // valid right after backward(mb)
  std::function<float*(int mb)> grad_in;               // where to receive mb's output gradient
  std::function<void(const Action&, double t0_us, double t1_us)> on_action;  // optional: tracing
};

// Microseconds on the clock the schedule's trace spans use (a process-wide epoch).
double schedule_clock_us();

// message_floats: 4-byte words of one activation (= one gradient) message: B * S * C values of the
// compute dtype (words_of in core/ops.h; the hooks return the stored tensors as float pointers).
void execute_schedule(const std::vector<Action>& actions, Comm& pp, int64_t message_floats,
                      const StageHooks& hooks);

}  // namespace tpt
