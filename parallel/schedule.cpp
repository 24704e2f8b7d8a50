#include "parallel/schedule.h"

#include <algorithm>
#include <deque>
#include <set>

#include "core/error.h"

namespace tpt {

std::string Action::str() const {
  switch (kind) {
    case Kind::Forward: return "F" + std::to_string(mb);
    case Kind::Backward: return "B" + std::to_string(mb);
    case Kind::Comm: break;
  }
  std::string s = "comm{";
  if (send_fwd >= 0) s += " send_fwd " + std::to_string(send_fwd);
  if (recv_fwd >= 0) s += " recv_fwd " + std::to_string(recv_fwd);
  if (send_bwd >= 0) s += " send_bwd " + std::to_string(send_bwd);
  if (recv_bwd >= 0) s += " recv_bwd " + std::to_string(recv_bwd);
  return s + " }";
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "gpipe") return ScheduleKind::GPipe;
  input_error("parallel.pipeline_schedule: unknown schedule '" + name + "' (allowed: 1f1b, gpipe)");
}

namespace {

struct Builder {
  int stages, stage;
  std::vector<Action> out;
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
  void compute(Action::Kind k, int mb) {
    Action a;
    a.kind = k;
    a.mb = mb;
    out.push_back(a);
  }
  // A comm action with the parts that have a peer on this stage; dropped if none has.
  void comm(int send_fwd, int recv_fwd, int send_bwd, int recv_bwd) {
    Action a;
    a.send_fwd = last() ? -1 : send_fwd;
    a.recv_bwd = last() ? -1 : recv_bwd;
    a.recv_fwd = first() ? -1 : recv_fwd;
    a.send_bwd = first() ? -1 : send_bwd;
    if (a.send_fwd >= 0 || a.recv_fwd >= 0 || a.send_bwd >= 0 || a.recv_bwd >= 0) out.push_back(a);
  }
};

}  // namespace

std::vector<Action> make_schedule(ScheduleKind kind, int stages, int stage, int M) {
  TPT_CHECK(stages >= 1 && stage >= 0 && stage < stages && M >= 1);
  Builder b{stages, stage, {}};
  using K = Action::Kind;
  if (kind == ScheduleKind::GPipe || kind == ScheduleKind::ForwardOnly) {
    for (int i = 0; i < M; ++i) {
      b.comm(-1, i, -1, -1);
      b.compute(K::Forward, i);
      b.comm(i, -1, -1, -1);
    }
    if (kind == ScheduleKind::ForwardOnly) return b.out;
    for (int i = 0; i < M; ++i) {
      b.comm(-1, -1, -1, i);
      b.compute(K::Backward, i);
      b.comm(-1, -1, i, -1);
    }
    return b.out;
  }
  const int warmup = std::min(stages - stage - 1, M);
  const int steady = M - warmup;
  for (int i = 0; i < warmup; ++i) {
    b.comm(-1, i, -1, -1);
    b.compute(K::Forward, i);
    b.comm(i, -1, -1, -1);
  }
  if (steady > 0) b.comm(-1, warmup, -1, -1);
  for (int i = 0; i < steady; ++i) {
    const int f = warmup + i;
    b.compute(K::Forward, f);
    b.comm(f, -1, -1, i);  // send_forward_recv_backward (peer: next stage)
    b.compute(K::Backward, i);
    if (i == steady - 1) b.comm(-1, -1, i, -1);
    else b.comm(-1, f + 1, i, -1);  // send_backward_recv_forward (peer: previous stage)
  }
  for (int i = steady; i < M; ++i) {
    b.comm(-1, -1, -1, i);
    b.compute(K::Backward, i);
    b.comm(-1, -1, i, -1);
  }
  return b.out;
}

int max_in_flight(const std::vector<Action>& actions) {
  int now = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.kind == Action::Kind::Forward) peak = std::max(peak, ++now);
    if (a.kind == Action::Kind::Backward) --now;
  }
  return std::max(peak, 1);
}

std::string simulate(const std::vector<std::vector<Action>>& lists, bool with_backward) {
  const int P = int(lists.size());
  // In-flight messages per directed stream: activations s -> s+1, gradients s+1 -> s.
  std::vector<std::deque<int>> act_posted(P), grad_posted(P);  // indexed by receiving stage
  std::vector<size_t> pc(size_t(P), 0);
  std::vector<std::set<int>> fwd_done(P), bwd_done(P), act_have(P), grad_have(P);
  // Each stage's posted-but-incomplete comm action: its sends are visible to peers.
  std::vector<bool> posted(size_t(P), false);
  auto err = [](int s, const Action& a, const std::string& what) {
    return "stage " + std::to_string(s) + " at " + a.str() + ": " + what;
  };
  for (;;) {
    bool progress = false, all_done = true;
    for (int s = 0; s < P; ++s) {
      const auto& L = lists[size_t(s)];
      while (pc[size_t(s)] < L.size()) {
        const Action& a = L[pc[size_t(s)]];
        if (a.kind == Action::Kind::Forward) {
          if (fwd_done[s].count(a.mb)) return err(s, a, "second forward of the micro-batch");
          if (s > 0 && !act_have[s].count(a.mb)) return err(s, a, "forward before its activation arrived");
          fwd_done[s].insert(a.mb);
        } else if (a.kind == Action::Kind::Backward) {
          if (!fwd_done[s].count(a.mb)) return err(s, a, "backward before forward");
          if (bwd_done[s].count(a.mb)) return err(s, a, "second backward of the micro-batch");
          if (s < P - 1 && !grad_have[s].count(a.mb)) return err(s, a, "backward before its gradient arrived");
          bwd_done[s].insert(a.mb);
        } else {
          if (!posted[size_t(s)]) {  // post the sends
            if (a.send_fwd >= 0) {
              if (s == P - 1) return err(s, a, "send to a stage that does not exist");
              if (!fwd_done[s].count(a.send_fwd)) return err(s, a, "sends an activation not yet computed");
              act_posted[size_t(s + 1)].push_back(a.send_fwd);
            }
            if (a.send_bwd >= 0) {
              if (s == 0) return err(s, a, "send to a stage that does not exist");
              if (!bwd_done[s].count(a.send_bwd)) return err(s, a, "sends a gradient not yet computed");
              grad_posted[size_t(s - 1)].push_back(a.send_bwd);
            }
            posted[size_t(s)] = true;
            progress = true;
          }
          // Receives complete when the matching send is posted (in stream order).
          bool ready = true;
          if (a.recv_fwd >= 0 && (act_posted[size_t(s)].empty())) ready = false;
          if (a.recv_bwd >= 0 && (grad_posted[size_t(s)].empty())) ready = false;
          // Sends complete when the peer has posted the matching receive (rendezvous).
          auto peer_posted_recv = [&](int peer, bool fwd, int mb) {
            if (peer < 0 || peer >= P || !posted[size_t(peer)]) return false;
            const Action& pa = lists[size_t(peer)][pc[size_t(peer)]];
            return fwd ? pa.recv_fwd == mb : pa.recv_bwd == mb;
          };
          bool sends_done = true;
          if (a.send_fwd >= 0 && !peer_posted_recv(s + 1, true, a.send_fwd) &&
              std::find(act_posted[size_t(s + 1)].begin(), act_posted[size_t(s + 1)].end(), a.send_fwd) !=
                  act_posted[size_t(s + 1)].end())
            sends_done = false;
          if (a.send_bwd >= 0 && !peer_posted_recv(s - 1, false, a.send_bwd) &&
              std::find(grad_posted[size_t(s - 1)].begin(), grad_posted[size_t(s - 1)].end(), a.send_bwd) !=
                  grad_posted[size_t(s - 1)].end())
            sends_done = false;
          if (!ready || !sends_done) break;
          if (a.recv_fwd >= 0) {
            int got = act_posted[size_t(s)].front();
            act_posted[size_t(s)].pop_front();
            if (got != a.recv_fwd)
              return err(s, a, "received the activation of micro-batch " + std::to_string(got));
            act_have[s].insert(got);
          }
          if (a.recv_bwd >= 0) {
            int got = grad_posted[size_t(s)].front();
            grad_posted[size_t(s)].pop_front();
            if (got != a.recv_bwd)
              return err(s, a, "received the gradient of micro-batch " + std::to_string(got));
            grad_have[s].insert(got);
          }
          posted[size_t(s)] = false;
        }
        ++pc[size_t(s)];
        progress = true;
      }
      if (pc[size_t(s)] < L.size()) all_done = false;
    }
    if (all_done) break;
    if (!progress) {
      std::string where;
      for (int s = 0; s < P; ++s)
        if (pc[size_t(s)] < lists[size_t(s)].size())
          where += " stage " + std::to_string(s) + " waits at " + lists[size_t(s)][pc[size_t(s)]].str() + ";";
      return "deadlock:" + where;
    }
  }
  for (int s = 0; s < P; ++s) {
    if (!act_posted[size_t(s)].empty() || !grad_posted[size_t(s)].empty())
      return "stage " + std::to_string(s) + ": messages sent but never received";
    if (with_backward && fwd_done[s].size() != bwd_done[s].size())
      return "stage " + std::to_string(s) + ": forwards without backwards";
  }
  return "";
}

}  // namespace tpt
