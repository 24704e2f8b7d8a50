#include "parallel/pipeline.h"

#include <chrono>

#include "core/error.h"

namespace tpt {

double schedule_clock_us() {
  using clock = std::chrono::steady_clock;
  static const auto epoch = clock::now();
  return std::chrono::duration<double, std::micro>(clock::now() - epoch).count();
}

void execute_schedule(const std::vector<Action>& actions, Comm& pp, int64_t n, const StageHooks& hooks) {
  const int stage = pp.rank(), P = pp.size();
  const int next = (stage + 1) % P, prev = (stage + P - 1) % P;  // a ring: interleaving crosses the seam
  constexpr int kActivation = 0, kGradient = 1;
  std::vector<Comm::Message> messages;
  for (const Action& a : actions) {
    double t0 = schedule_clock_us();
    switch (a.kind) {
      case Action::Kind::Forward: hooks.forward(a.mb, a.chunk); break;
      case Action::Kind::Backward: hooks.backward(a.mb, a.chunk); break;
      case Action::Kind::BackwardWeight: hooks.backward_weight(a.mb, a.chunk); break;
      case Action::Kind::Comm: {
        messages.clear();
        if (a.send_fwd >= 0)
          messages.push_back({true, const_cast<float*>(hooks.activation_out(a.send_fwd, a.send_fwd_chunk)), n, next, kActivation});
        if (a.send_bwd >= 0)
          messages.push_back({true, const_cast<float*>(hooks.grad_out(a.send_bwd, a.send_bwd_chunk)), n, prev, kGradient});
        if (a.recv_fwd >= 0) messages.push_back({false, hooks.activation_in(a.recv_fwd, a.recv_fwd_chunk), n, prev, kActivation});
        if (a.recv_bwd >= 0) messages.push_back({false, hooks.grad_in(a.recv_bwd, a.recv_bwd_chunk), n, next, kGradient});
        pp.exchange(messages);
        break;
      }
    }
    if (hooks.on_action) {
      double t1 = schedule_clock_us();
      hooks.on_action(a, t0, t1);
    }
  }
}

}  // namespace tpt
