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

// What the executor calls: compute on micro-batch mb of the rank's model chunk (0 with one chunk per
// rank), and the message buffers, as 4-byte words.
struct StageHooks {
  std::function<void(int mb, int chunk)> forward;
  std::function<void(int mb, int chunk)> backward;         // full backward, or ZB-H1's B
  std::function<void(int mb, int chunk)> backward_weight;  // ZB-H1's W (lists with BackwardWeight)
  std::function<const float*(int mb, int chunk)> activation_out;  // valid after forward(mb, chunk)
  std::function<float*(int mb, int chunk)> activation_in;         // where to receive the chunk's input activation
  std::function<const float*(int mb, int chunk)> grad_out;        // valid after backward(mb, chunk) until the next backward of the chunk
  std::function<float*(int mb, int chunk)> grad_in;               // where to receive the chunk's output gradient
  std::function<void(const Action&, double t0_us, double t1_us)> on_action;  // optional: tracing
};

// Microseconds on the clock the schedule's trace spans use (a process-wide epoch).
double schedule_clock_us();

// message_floats: 4-byte words of one activation (= one gradient) message: B * S * C values of the
// compute dtype (words_of in core/ops.h; the hooks return the stored tensors as float pointers).
// A Comm action's messages go out as one exchange: activations with tag 0, gradients with tag 1, in
// the order send_fwd, send_bwd, recv_fwd, recv_bwd (with 2 stages both streams join the same two
// ranks; NCCL pairs them by that order).
void execute_schedule(const std::vector<Action>& actions, Comm& pp, int64_t message_floats,
                      const StageHooks& hooks);

}  // namespace tpt
