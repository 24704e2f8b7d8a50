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
  const int stage = pp.rank();
  for (const Action& a : actions) {
    double t0 = schedule_clock_us();
    // one model chunk per rank (interleaved schedules are data only so far: parallel/schedule.h)
    TPT_CHECK(a.chunk == 0 && a.send_fwd_chunk == 0 && a.recv_fwd_chunk == 0 && a.send_bwd_chunk == 0 &&
              a.recv_bwd_chunk == 0);
    switch (a.kind) {
      case Action::Kind::Forward: hooks.forward(a.mb); break;
      case Action::Kind::Backward: hooks.backward(a.mb); break;
      case Action::Kind::BackwardWeight:  // ZB-H1's deferred weight gradients: not in the executor yet
        internal_error("execute_schedule: a split backward (zb-h1) is not executable in this version");
      case Action::Kind::Comm: {
        // Each comm action talks to one neighbour per direction: next (send_fwd / recv_bwd) or
        // previous (recv_fwd / send_bwd). The builder never mixes a send to one with a receive from
        // the other except as these pairs.
        const float* send = nullptr;
        float* recv = nullptr;
        int send_peer = -1, recv_peer = -1;
        if (a.send_fwd >= 0) send = hooks.activation_out(a.send_fwd), send_peer = stage + 1;
        if (a.send_bwd >= 0) send = hooks.grad_out(a.send_bwd), send_peer = stage - 1;
        if (a.recv_fwd >= 0) recv = hooks.activation_in(a.recv_fwd), recv_peer = stage - 1;
        if (a.recv_bwd >= 0) recv = hooks.grad_in(a.recv_bwd), recv_peer = stage + 1;
        TPT_CHECK(!(a.send_fwd >= 0 && a.send_bwd >= 0) && !(a.recv_fwd >= 0 && a.recv_bwd >= 0));
        pp.send_recv(send, send ? n : 0, send_peer, recv, recv ? n : 0, recv_peer);
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
