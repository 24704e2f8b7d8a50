#include "parallel/schedule.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "core/error.h"

namespace tpt {

namespace {

std::string with_chunk(int mb, int chunk) {
  return std::to_string(mb) + (chunk != 0 ? "c" + std::to_string(chunk) : "");
}

}  // namespace

std::string Action::str() const {
  switch (kind) {
    case Kind::Forward: return "F" + with_chunk(mb, chunk);
    case Kind::Backward: return "B" + with_chunk(mb, chunk);
    case Kind::BackwardWeight: return "W" + with_chunk(mb, chunk);
    case Kind::Comm: break;
  }
  std::string s = "comm{";
  if (send_fwd >= 0) s += " send_fwd " + with_chunk(send_fwd, send_fwd_chunk);
  if (recv_fwd >= 0) s += " recv_fwd " + with_chunk(recv_fwd, recv_fwd_chunk);
  if (send_bwd >= 0) s += " send_bwd " + with_chunk(send_bwd, send_bwd_chunk);
  if (recv_bwd >= 0) s += " recv_bwd " + with_chunk(recv_bwd, recv_bwd_chunk);
  return s + " }";
}

int in_flight_equivalent_microbatches(ScheduleKind kind, int stages, int microbatches, int chunks) {
  const int bound = (std::max(chunks, 1) + 1) * stages;
  return kind == ScheduleKind::GPipe || microbatches <= bound ? microbatches : bound;
}

ScheduleKind schedule_kind(PipelineSchedule schedule, int chunks) {
  switch (schedule) {
    case PipelineSchedule::OneFOneB: return chunks > 1 ? ScheduleKind::Interleaved1F1B : ScheduleKind::OneFOneB;
    case PipelineSchedule::GPipe: return ScheduleKind::GPipe;
    case PipelineSchedule::ZeroBubbleH1: return ScheduleKind::ZeroBubbleH1;
  }
  internal_error("schedule_kind: unknown schedule");
}

std::string check_schedule(ScheduleKind kind, int P, int M, int v) {
  const std::string vs = std::to_string(v), Ps = std::to_string(P), Ms = std::to_string(M);
  if (P < 1) return "parallel.pipeline_model_parallel_size must be at least 1 (got " + Ps + ")";
  if (M < 1) return "the number of micro-batches per DP rank must be at least 1 (got " + Ms + ")";
  if (v < 1) return "parallel.virtual_pipeline_model_parallel_size must be at least 1 (got " + vs + ")";
  if (v == 1) return "";
  if (kind != ScheduleKind::Interleaved1F1B && kind != ScheduleKind::ForwardOnly)
    return "parallel.virtual_pipeline_model_parallel_size " + vs +
           " (model chunks per rank) needs the interleaved 1f1b schedule (parallel.pipeline_schedule: 1f1b)";
  if (P == 1)
    return "parallel.virtual_pipeline_model_parallel_size " + vs +
           " needs parallel.pipeline_model_parallel_size > 1 (got 1)";
  if (M % P != 0)
    return "the interleaved schedule (parallel.virtual_pipeline_model_parallel_size " + vs +
           ") needs the number of micro-batches per DP rank (global_batch_size / (micro_batch_size x "
           "data_parallel_size) = " + Ms + ") to be a multiple of parallel.pipeline_model_parallel_size (" + Ps +
           ")";
  return "";
}

namespace {

using K = Action::Kind;

// One message of a Comm action: micro-batch and local chunk; mb < 0: none.
struct Msg {
  int mb = -1, chunk = 0;
};

struct Builder {
  int stages, stage, chunks;
  std::vector<Action> out;
  // virtual stage c * P + s is the first / last of the virtual pipeline
  bool first(int chunk) const { return stage == 0 && chunk == 0; }
  bool last(int chunk) const { return stage == stages - 1 && chunk == chunks - 1; }
  void compute(K k, int mb, int chunk = 0) {
    Action a;
    a.kind = k;
    a.mb = mb;
    a.chunk = chunk;
    out.push_back(a);
  }
  // A comm action with the messages that have a peer; dropped if none has.
  void comm(Msg send_fwd, Msg recv_fwd, Msg send_bwd, Msg recv_bwd) {
    Action a;
    if (send_fwd.mb >= 0 && !last(send_fwd.chunk)) a.send_fwd = send_fwd.mb, a.send_fwd_chunk = send_fwd.chunk;
    if (recv_bwd.mb >= 0 && !last(recv_bwd.chunk)) a.recv_bwd = recv_bwd.mb, a.recv_bwd_chunk = recv_bwd.chunk;
    if (recv_fwd.mb >= 0 && !first(recv_fwd.chunk)) a.recv_fwd = recv_fwd.mb, a.recv_fwd_chunk = recv_fwd.chunk;
    if (send_bwd.mb >= 0 && !first(send_bwd.chunk)) a.send_bwd = send_bwd.mb, a.send_bwd_chunk = send_bwd.chunk;
    if (a.send_fwd >= 0 || a.recv_fwd >= 0 || a.send_bwd >= 0 || a.recv_bwd >= 0) out.push_back(a);
  }
  // The v = 1 shorthands of the 1F1B / GPipe lists (chunk 0).
  void comm(int send_fwd, int recv_fwd, int send_bwd, int recv_bwd) {
    comm(Msg{send_fwd, 0}, Msg{recv_fwd, 0}, Msg{send_bwd, 0}, Msg{recv_bwd, 0});
  }
};

std::vector<Action> one_f_one_b(int P, int s, int M, bool zero_bubble) {
  Builder b{P, s, 1, {}};
  // ZB-H1: W's wait in a FIFO; stage s starts running one after each steady B once s have piled up.
  std::deque<int> pending_w;
  auto backward = [&](int i) {
    b.compute(K::Backward, i);
    if (zero_bubble) pending_w.push_back(i);
  };
  auto weight = [&]() {
    b.compute(K::BackwardWeight, pending_w.front());
    pending_w.pop_front();
  };
  const int warmup = std::min(P - s - 1, M);
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
    backward(i);
    // ZB-H1: W before the exchange that also receives the next forward's input (the previous stage
    // sends it only after that forward: W fills the wait), after the last one (a gradient alone,
    // which the previous stage already waits for).
    const bool w = zero_bubble && i >= s, w_first = i < steady - 1;
    if (w && w_first) weight();
    if (i == steady - 1) b.comm(-1, -1, i, -1);
    else b.comm(-1, f + 1, i, -1);  // send_backward_recv_forward (peer: previous stage)
    if (w && !w_first) weight();
  }
  for (int i = steady; i < M; ++i) {
    b.comm(-1, -1, -1, i);
    backward(i);
    b.comm(-1, -1, i, -1);
    if (zero_bubble) weight();
  }
  while (!pending_w.empty()) weight();
  return b.out;
}

// Python's modulo (Megatron's chunk ids of negative micro-batch ids).
int pymod(int a, int n) { return ((a % n) + n) % n; }

// Megatron-core's forward_backward_pipelining_with_interleaving (without p2p overlap), one comm
// action per p2p_communication call. Received messages go to per-chunk FIFOs there; a chunk runs its
// micro-batches in order 0, 1, ..., M - 1 both ways, so the j-th message received for a chunk is
// micro-batch j's.
std::vector<Action> interleaved(int P, int s, int M, int v, bool forward_only) {
  Builder b{P, s, v, {}};
  const int total = M * v, group = P * v;
  auto fwd_chunk = [&](int k) { return pymod(k, group) / P; };
  auto bwd_chunk = [&](int k) { return v - 1 - pymod(k, group) / P; };
  auto mb_of = [&](int k) { return (k / group) * P + k % P; };  // k >= 0
  std::vector<int> recv_fwd_count(size_t(v), 0), recv_bwd_count(size_t(v), 0);
  auto recv_fwd = [&](int chunk) {
    if (b.first(chunk)) return Msg{};
    return Msg{recv_fwd_count[size_t(chunk)]++, chunk};
  };
  auto recv_bwd = [&](int chunk) {
    if (b.last(chunk)) return Msg{};
    return Msg{recv_bwd_count[size_t(chunk)]++, chunk};
  };
  auto fwd = [&](int k) { return Msg{mb_of(k), fwd_chunk(k)}; };
  auto bwd = [&](int k) { return Msg{mb_of(k), bwd_chunk(k)}; };
  const bool first_rank = s == 0, last_rank = s == P - 1;

  int warmup = forward_only ? total : std::min((P - s - 1) * 2 + (v - 1) * P, total);
  const bool all_warmup = !forward_only && warmup == total;
  const int remaining = total - warmup;

  b.comm(Msg{}, recv_fwd(0), Msg{}, Msg{});
  for (int k = 0; k < warmup; ++k) {
    b.compute(K::Forward, mb_of(k), fwd_chunk(k));
    const int next_chunk = fwd_chunk(k + 1);
    const bool recv_prev = !(first_rank && next_chunk == 0) && k != total - 1;
    const Msg rf = recv_prev ? recv_fwd(next_chunk) : Msg{};
    if (k == warmup - 1 && !forward_only && !all_warmup)
      b.comm(fwd(k), rf, Msg{}, last_rank ? Msg{} : recv_bwd(v - 1));  // send_forward_backward_recv_forward_backward
    else
      b.comm(fwd(k), rf, Msg{}, Msg{});  // send_forward_recv_forward
  }
  for (int k = 0; k < remaining; ++k) {
    const int fk = k + warmup, bk = k;
    b.compute(K::Forward, mb_of(fk), fwd_chunk(fk));
    b.compute(K::Backward, mb_of(bk), bwd_chunk(bk));
    bool recv_prev = true, recv_next = true;
    int next_f, next_b;
    if (first_rank) {  // the first stage is ahead of the last by P - 1
      next_f = fwd_chunk(fk - (P - 1));
      if (next_f == v - 1) recv_prev = false;
      ++next_f;
    } else {
      next_f = fwd_chunk(fk + 1);
    }
    if (last_rank) {  // the last stage is ahead of the first by P - 1
      next_b = bwd_chunk(bk - (P - 1));
      if (next_b == 0) recv_next = false;
      --next_b;
    } else {
      next_b = bwd_chunk(bk + 1);
    }
    if (k == remaining - 1) recv_prev = false;
    const Msg rf = recv_prev ? recv_fwd(next_f) : Msg{};
    const Msg rb = recv_next ? recv_bwd(next_b) : Msg{};
    b.comm(fwd(fk), rf, bwd(bk), rb);  // send_forward_backward_recv_forward_backward
  }
  if (forward_only) return b.out;
  if (all_warmup) b.comm(Msg{}, Msg{}, Msg{}, recv_bwd(v - 1));
  for (int k = remaining; k < total; ++k) {
    b.compute(K::Backward, mb_of(k), bwd_chunk(k));
    const int next_b = bwd_chunk(k + 1);
    const bool recv_next = !(last_rank && next_b == v - 1) && k != total - 1;
    b.comm(Msg{}, Msg{}, bwd(k), recv_next ? recv_bwd(next_b) : Msg{});  // send_backward_recv_backward
  }
  return b.out;
}

}  // namespace

std::vector<Action> make_schedule(ScheduleKind kind, int stages, int stage, int M, int chunks) {
  const std::string why = check_schedule(kind, stages, M, chunks);
  if (!why.empty()) input_error(why);
  TPT_CHECK(stage >= 0 && stage < stages);
  if (chunks > 1) return interleaved(stages, stage, M, chunks, kind == ScheduleKind::ForwardOnly);
  if (kind == ScheduleKind::OneFOneB || kind == ScheduleKind::Interleaved1F1B)
    return one_f_one_b(stages, stage, M, false);
  if (kind == ScheduleKind::ZeroBubbleH1) return one_f_one_b(stages, stage, M, true);
  Builder b{stages, stage, 1, {}};
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

namespace {

bool splits_backward(const std::vector<Action>& actions) {
  for (const Action& a : actions)
    if (a.kind == K::BackwardWeight) return true;
  return false;
}

int compute_chunks(const std::vector<Action>& actions) {
  int v = 1;
  for (const Action& a : actions)
    if (a.kind != K::Comm) v = std::max(v, a.chunk + 1);
  return v;
}

}  // namespace

std::vector<int> max_in_flight_per_chunk(const std::vector<Action>& actions) {
  const K end = splits_backward(actions) ? K::BackwardWeight : K::Backward;
  const int v = compute_chunks(actions);
  std::vector<int> now(size_t(v), 0), peak(size_t(v), 0);
  for (const Action& a : actions) {
    if (a.kind == K::Comm || a.chunk < 0) continue;
    const size_t c = size_t(a.chunk);
    if (a.kind == K::Forward) peak[c] = std::max(peak[c], ++now[c]);
    if (a.kind == end) --now[c];
  }
  for (int& p : peak) p = std::max(p, 1);
  return peak;
}

ReceiveBuffers receive_buffers(const std::vector<Action>& actions, int chunks) {
  ReceiveBuffers r;
  r.activations.assign(size_t(chunks), 0);
  r.gradients.assign(size_t(chunks), 0);
  // per chunk the received, not yet consumed micro-batches of each stream
  std::vector<std::set<int>> act(static_cast<size_t>(chunks)), grad(static_cast<size_t>(chunks));
  auto span = [](const std::set<int>& s) { return s.empty() ? 0 : *s.rbegin() - *s.begin() + 1; };
  for (const Action& a : actions) {
    if (a.kind == K::Comm) {
      if (a.recv_fwd >= 0) act.at(size_t(a.recv_fwd_chunk)).insert(a.recv_fwd);
      if (a.recv_bwd >= 0) grad.at(size_t(a.recv_bwd_chunk)).insert(a.recv_bwd);
      for (size_t c = 0; c < size_t(chunks); ++c) {
        r.activations[c] = std::max(r.activations[c], span(act[c]));
        r.gradients[c] = std::max(r.gradients[c], span(grad[c]));
      }
    }
    if (a.kind == K::Forward) act.at(size_t(a.chunk)).erase(a.mb);
    if (a.kind == K::Backward) grad.at(size_t(a.chunk)).erase(a.mb);
  }
  return r;
}

namespace {

int peak_until(const std::vector<Action>& actions, K end) {
  int now = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.kind == K::Forward) peak = std::max(peak, ++now);
    if (a.kind == end) --now;
  }
  return std::max(peak, 1);
}

}  // namespace

int max_in_flight(const std::vector<Action>& actions) {
  return peak_until(actions, splits_backward(actions) ? K::BackwardWeight : K::Backward);
}

int max_awaiting_backward(const std::vector<Action>& actions) { return peak_until(actions, K::Backward); }

SlotPool pool_slots(const std::vector<Action>& actions, int chunks, int microbatches) {
  const bool backward = std::any_of(actions.begin(), actions.end(), [](const Action& a) { return a.kind == K::Backward; });
  const K end = splits_backward(actions) ? K::BackwardWeight : K::Backward;
  SlotPool p;
  p.slot.assign(size_t(chunks), std::vector<int>(size_t(microbatches), -1));
  // forward only: which outputs are sent (the last virtual stage's are not: free after their forward)
  std::vector<std::vector<bool>> sent(size_t(chunks), std::vector<bool>(size_t(microbatches), false));
  for (const Action& a : actions)
    if (a.kind == K::Comm && a.send_fwd >= 0) sent.at(size_t(a.send_fwd_chunk)).at(size_t(a.send_fwd)) = true;
  std::vector<bool> used;
  auto release = [&](int mb, int c) {
    const int s = p.slot.at(size_t(c)).at(size_t(mb));
    TPT_CHECK(s >= 0 && used[size_t(s)]);
    used[size_t(s)] = false;
  };
  for (const Action& a : actions) {
    if (a.kind == K::Forward) {
      const size_t s = size_t(std::find(used.begin(), used.end(), false) - used.begin());  // the lowest free
      if (s == used.size()) used.push_back(false);
      used[s] = true;
      p.slot.at(size_t(a.chunk)).at(size_t(a.mb)) = int(s);
      p.slots = std::max(p.slots, int(used.size()));
      if (!backward && !sent[size_t(a.chunk)][size_t(a.mb)]) release(a.mb, a.chunk);
    } else if (backward && a.kind == end) {
      release(a.mb, a.chunk);
    } else if (!backward && a.kind == K::Comm && a.send_fwd >= 0) {
      release(a.send_fwd, a.send_fwd_chunk);
    }
  }
  p.slots = std::max(p.slots, 1);
  return p;
}

namespace {

// Runs all lists together: the checks of simulate() and, when asked, the timing of time_pipeline().
struct Engine {
  const std::vector<std::vector<Action>>& lists;
  int P = 0, v = 1;
  bool with_backward = true;
  // timing: costs of one chunk action per stage (empty: zero)
  std::vector<double> f, b_split, b_full, w;
  double p2p = 0;
  static double at(const std::vector<double>& c, int s) { return c.empty() ? 0.0 : c[size_t(s)]; }

  struct Queued {
    int mb, chunk;
    double posted;
  };
  // In-flight messages per directed stream, indexed by the receiving stage: activations from
  // stage s - 1, gradients from s + 1 (mod P).
  std::vector<std::deque<Queued>> act_q, grad_q;
  // When the receiver posted its receive, by recv_key (NaN: not posted). Flat arrays, not maps: a
  // PP 64 x v 8 x 1024 micro-batch plan runs a million passes through them several times.
  std::vector<double> recv_posted;
  int M = 0;  // micro-batch ids are in [0, M)
  size_t recv_key(bool act, int s, int mb, int c) const {
    return ((size_t(act) * size_t(P) + size_t(s)) * size_t(v) + size_t(c)) * size_t(M) + size_t(mb);
  }
  // The micro-batches of one (stage, chunk) that did something: a flag per id.
  struct MbSet {
    std::vector<char> has;
    bool count(int mb) const { return mb >= 0 && size_t(mb) < has.size() && has[size_t(mb)]; }
    bool insert(int mb) {  // false when it was there
      if (size_t(mb) >= has.size()) has.resize(size_t(mb) + 1, 0);
      const bool fresh = !has[size_t(mb)];
      has[size_t(mb)] = 1;
      return fresh;
    }
    bool operator==(const MbSet&) const = default;
  };
  std::vector<size_t> pc;
  std::vector<bool> posted, split;
  std::vector<double> now, busy;
  // per stage and chunk: (mb) that ran forward / backward / weight, that were received
  std::vector<std::vector<MbSet>> fwd, bwd, wgt, act_have, grad_have;

  explicit Engine(const std::vector<std::vector<Action>>& l) : lists(l), P(int(l.size())) {}

  static std::string err(int s, const Action& a, const std::string& what) {
    return "stage " + std::to_string(s) + " at " + a.str() + ": " + what;
  }
  bool first(int s, int c) const { return s == 0 && c == 0; }
  bool last(int s, int c) const { return s == P - 1 && c == v - 1; }
  // Receiver (stage, chunk) of an activation sent by chunk c of stage s, of a gradient sent by it.
  std::pair<int, int> act_to(int s, int c) const { return s == P - 1 ? std::pair{0, c + 1} : std::pair{s + 1, c}; }
  std::pair<int, int> grad_to(int s, int c) const { return s == 0 ? std::pair{P - 1, c - 1} : std::pair{s - 1, c}; }

  std::string run() {
    if (P == 0) return "";
    for (const auto& L : lists)
      for (const Action& a : L) {
        for (int c : {a.chunk, a.send_fwd_chunk, a.recv_fwd_chunk, a.send_bwd_chunk, a.recv_bwd_chunk})
          if (c < 0) return "a negative chunk in " + a.str();
        if (a.kind != K::Comm) v = std::max(v, a.chunk + 1);
        if (a.send_fwd >= 0) v = std::max(v, a.send_fwd_chunk + 1);
        if (a.recv_fwd >= 0) v = std::max(v, a.recv_fwd_chunk + 1);
        if (a.send_bwd >= 0) v = std::max(v, a.send_bwd_chunk + 1);
        if (a.recv_bwd >= 0) v = std::max(v, a.recv_bwd_chunk + 1);
      }
    const size_t n = size_t(P);
    act_q.assign(n, {});
    grad_q.assign(n, {});
    pc.assign(n, 0);
    posted.assign(n, false);
    split.assign(n, false);
    now.assign(n, 0.0);
    busy.assign(n, 0.0);
    for (const auto& L : lists)
      for (const Action& a : L) M = std::max({M, a.mb + 1, a.send_fwd + 1, a.recv_fwd + 1, a.send_bwd + 1, a.recv_bwd + 1});
    for (auto* sets : {&fwd, &bwd, &wgt, &act_have, &grad_have})
      sets->assign(n, std::vector<MbSet>(size_t(v), MbSet{std::vector<char>(size_t(M), 0)}));
    recv_posted.assign(2 * n * size_t(v) * size_t(M), std::numeric_limits<double>::quiet_NaN());
    for (int s = 0; s < P; ++s) split[size_t(s)] = splits_backward(lists[size_t(s)]);

    for (;;) {
      bool progress = false, all_done = true;
      for (int s = 0; s < P; ++s) {
        const auto& L = lists[size_t(s)];
        while (pc[size_t(s)] < L.size()) {
          const Action& a = L[pc[size_t(s)]];
          std::string why;
          bool done = true;
          if (a.kind == K::Comm) why = comm(s, a, done, progress);
          else why = compute(s, a);
          if (!why.empty()) return why;
          if (!done) break;
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
    if (std::string why = finish(); !why.empty()) return why;
    return pair_order();
  }

  // NCCL has no tags: it pairs rank a's sends to rank b with b's receives from a in posting order
  // (execute_schedule posts an action's send_fwd, send_bwd, recv_fwd, recv_bwd in that order). The
  // per-stream FIFOs above do not see an order between the two streams, which share a directed rank
  // pair when P <= 2; this compares, per directed pair, the whole sequence sent with the one received.
  // Run last: a difference it reports is one that every other check let through.
  std::string pair_order() const {
    struct Posted {
      bool act;
      int mb, chunk;  // chunk on the receiver
      int stage;      // the stage that posted it, and where in its list
      size_t at;
      bool operator==(const Posted& o) const { return act == o.act && mb == o.mb && chunk == o.chunk; }
    };
    std::map<std::pair<int, int>, std::vector<Posted>> sent, received;  // (from, to) -> messages
    for (int s = 0; s < P; ++s) {
      const auto& L = lists[size_t(s)];
      const int next = (s + 1) % P, prev = (s + P - 1) % P;
      for (size_t i = 0; i < L.size(); ++i) {
        const Action& a = L[i];
        if (a.kind != K::Comm) continue;
        if (a.send_fwd >= 0) sent[{s, next}].push_back({true, a.send_fwd, act_to(s, a.send_fwd_chunk).second, s, i});
        if (a.send_bwd >= 0) sent[{s, prev}].push_back({false, a.send_bwd, grad_to(s, a.send_bwd_chunk).second, s, i});
        if (a.recv_fwd >= 0) received[{prev, s}].push_back({true, a.recv_fwd, a.recv_fwd_chunk, s, i});
        if (a.recv_bwd >= 0) received[{next, s}].push_back({false, a.recv_bwd, a.recv_bwd_chunk, s, i});
      }
    }
    auto say = [&](const std::vector<Posted>& q, size_t k, const std::string& verb) {
      if (k >= q.size()) return "nothing (" + std::to_string(q.size()) + " messages " + verb + " in all)";
      const Posted& m = q[k];
      return (m.act ? "the activation" : "the gradient") + std::string(" of micro-batch ") + std::to_string(m.mb) +
             " for chunk " + std::to_string(m.chunk) + " (its action " + std::to_string(m.at) + ", " +
             lists[size_t(m.stage)][m.at].str() + ")";
    };
    for (int from = 0; from < P; ++from)
      for (int to = 0; to < P; ++to) {
        static const std::vector<Posted> none;
        const auto si = sent.find({from, to}), ri = received.find({from, to});
        const auto& out = si == sent.end() ? none : si->second;
        const auto& in = ri == received.end() ? none : ri->second;
        for (size_t k = 0; k < std::max(out.size(), in.size()); ++k) {
          if (k < out.size() && k < in.size() && out[k] == in[k]) continue;
          const std::string f = std::to_string(from), t = std::to_string(to);
          return "stage " + f + " -> stage " + t + ": message " + std::to_string(k) +
                 " in posting order differs: stage " + f + " sends " + say(out, k, "sent") + ", stage " + t +
                 " receives " + say(in, k, "received") +
                 " (NCCL has no tags and pairs the messages of a rank pair in posting order)";
        }
      }
    return "";
  }

  std::string compute(int s, const Action& a) {
    const size_t S = size_t(s), c = size_t(a.chunk);
    if (a.mb < 0) return err(s, a, "a compute action without a micro-batch");
    double cost = 0;
    if (a.kind == K::Forward) {
      if (fwd[S][c].count(a.mb)) return err(s, a, "second forward of the micro-batch");
      if (!first(s, a.chunk) && !act_have[S][c].count(a.mb)) return err(s, a, "forward before its activation arrived");
      fwd[S][c].insert(a.mb);
      cost = at(f, s);
    } else if (a.kind == K::Backward) {
      if (!fwd[S][c].count(a.mb)) return err(s, a, "backward before forward");
      if (bwd[S][c].count(a.mb)) return err(s, a, "second backward of the micro-batch");
      if (!last(s, a.chunk) && !grad_have[S][c].count(a.mb)) return err(s, a, "backward before its gradient arrived");
      bwd[S][c].insert(a.mb);
      cost = split[S] ? at(b_split, s) : at(b_full, s);
    } else {
      if (!bwd[S][c].count(a.mb)) return err(s, a, "weight backward before backward");
      if (wgt[S][c].count(a.mb)) return err(s, a, "second weight backward of the micro-batch");
      wgt[S][c].insert(a.mb);
      cost = at(w, s);
    }
    now[S] += cost;
    busy[S] += cost;
    return "";
  }

  std::string comm(int s, const Action& a, bool& done, bool& progress) {
    const size_t S = size_t(s);
    if (!posted[S]) {  // post the sends and receives
      if (a.send_fwd >= 0) {
        if (last(s, a.send_fwd_chunk)) return err(s, a, "send to a stage that does not exist");
        if (!fwd[S][size_t(a.send_fwd_chunk)].count(a.send_fwd)) return err(s, a, "sends an activation not yet computed");
        const auto [to, tc] = act_to(s, a.send_fwd_chunk);
        act_q[size_t(to)].push_back({a.send_fwd, tc, now[S]});
      }
      if (a.send_bwd >= 0) {
        if (first(s, a.send_bwd_chunk)) return err(s, a, "send to a stage that does not exist");
        if (!bwd[S][size_t(a.send_bwd_chunk)].count(a.send_bwd)) return err(s, a, "sends a gradient not yet computed");
        const auto [to, tc] = grad_to(s, a.send_bwd_chunk);
        grad_q[size_t(to)].push_back({a.send_bwd, tc, now[S]});
      }
      if (a.recv_fwd >= 0) {
        if (first(s, a.recv_fwd_chunk)) return err(s, a, "receive from a stage that does not exist");
        recv_posted[recv_key(true, s, a.recv_fwd, a.recv_fwd_chunk)] = now[S];
      }
      if (a.recv_bwd >= 0) {
        if (last(s, a.recv_bwd_chunk)) return err(s, a, "receive from a stage that does not exist");
        recv_posted[recv_key(false, s, a.recv_bwd, a.recv_bwd_chunk)] = now[S];
      }
      posted[S] = true;
      progress = true;
    }
    // Receives complete when a send is posted on their stream (it must be theirs: checked below);
    // sends when the peer has posted the matching receive (rendezvous).
    done = false;
    if (a.recv_fwd >= 0 && act_q[S].empty()) return "";
    if (a.recv_bwd >= 0 && grad_q[S].empty()) return "";
    double end = now[S];
    if (a.send_fwd >= 0) {
      const auto [to, tc] = act_to(s, a.send_fwd_chunk);
      const double posted_at = recv_posted[recv_key(true, to, a.send_fwd, tc)];
      if (std::isnan(posted_at)) return "";
      end = std::max(end, posted_at);
    }
    if (a.send_bwd >= 0) {
      const auto [to, tc] = grad_to(s, a.send_bwd_chunk);
      const double posted_at = recv_posted[recv_key(false, to, a.send_bwd, tc)];
      if (std::isnan(posted_at)) return "";
      end = std::max(end, posted_at);
    }
    if (a.recv_fwd >= 0) {
      const Queued got = act_q[S].front();
      act_q[S].pop_front();
      if (got.mb != a.recv_fwd || got.chunk != a.recv_fwd_chunk)
        return err(s, a, "received the activation of micro-batch " + std::to_string(got.mb) + " of chunk " +
                            std::to_string(got.chunk));
      if (!act_have[S][size_t(got.chunk)].insert(got.mb)) return err(s, a, "second receive of the activation");
      end = std::max(end, got.posted);
    }
    if (a.recv_bwd >= 0) {
      const Queued got = grad_q[S].front();
      grad_q[S].pop_front();
      if (got.mb != a.recv_bwd || got.chunk != a.recv_bwd_chunk)
        return err(s, a, "received the gradient of micro-batch " + std::to_string(got.mb) + " of chunk " +
                            std::to_string(got.chunk));
      if (!grad_have[S][size_t(got.chunk)].insert(got.mb)) return err(s, a, "second receive of the gradient");
      end = std::max(end, got.posted);
    }
    const bool data = a.send_fwd >= 0 || a.send_bwd >= 0 || a.recv_fwd >= 0 || a.recv_bwd >= 0;
    now[S] = end + (data ? p2p : 0.0);
    posted[S] = false;
    done = true;
    return "";
  }

  std::string finish() const {
    for (int s = 0; s < P; ++s) {
      const size_t S = size_t(s);
      if (!act_q[S].empty() || !grad_q[S].empty())
        return "stage " + std::to_string(s) + ": messages sent but never received";
      for (int c = 0; c < v; ++c) {
        const size_t C = size_t(c);
        const std::string where = "stage " + std::to_string(s) + " chunk " + std::to_string(c) + ": ";
        if (fwd[S][C] != fwd[0][0]) return where + "forwards other micro-batches than stage 0 chunk 0";
        if (with_backward && bwd[S][C] != fwd[S][C]) return where + "forwards without backwards";
        if (with_backward && split[S] && wgt[S][C] != bwd[S][C]) return where + "backwards without weight backwards";
      }
    }
    return "";
  }
};

}  // namespace

std::string simulate(const std::vector<std::vector<Action>>& lists, bool with_backward) {
  Engine e(lists);
  e.with_backward = with_backward;
  return e.run();
}

double PipelineTiming::ideal() const {
  double m = 0;
  for (double x : busy) m = std::max(m, x);
  return m;
}

double PipelineTiming::bubble_fraction() const {
  double worst = 0;
  for (double x : busy) worst = std::max(worst, makespan > 0 ? 1.0 - x / makespan : 0.0);
  return worst;
}

double PipelineTiming::bubble_over_ideal() const {
  const double i = ideal();
  return i > 0 ? (makespan - i) / i : 0.0;
}

PipelineTiming time_pipeline(const std::vector<std::vector<Action>>& lists, const std::vector<double>& f,
                             const std::vector<double>& b, const std::vector<double>& w, double p2p) {
  const size_t P = lists.size();
  TPT_CHECK(f.size() == P && b.size() == P && w.size() == P);
  int v = 1;
  for (const auto& L : lists) v = std::max(v, compute_chunks(L));
  Engine e(lists);
  for (size_t s = 0; s < P; ++s) {
    e.f.push_back(f[s] / v);
    e.b_split.push_back(b[s] / v);
    e.b_full.push_back((b[s] + w[s]) / v);
    e.w.push_back(w[s] / v);
  }
  e.p2p = p2p;
  const std::string why = e.run();
  if (!why.empty()) internal_error("time_pipeline: the schedule does not simulate: " + why);
  PipelineTiming t;
  t.busy = e.busy;
  for (double x : e.now) t.makespan = std::max(t.makespan, x);
  return t;
}

PipelineTiming time_pipeline(const std::vector<std::vector<Action>>& lists, double f, double b, double w,
                             double p2p) {
  const size_t P = lists.size();
  return time_pipeline(lists, std::vector<double>(P, f), std::vector<double>(P, b), std::vector<double>(P, w), p2p);
}

double schedule_makespan(const std::vector<std::vector<Action>>& lists, double f, double b, double w) {
  return time_pipeline(lists, f, b, w).makespan;
}

}  // namespace tpt
