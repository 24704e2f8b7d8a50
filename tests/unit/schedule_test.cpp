// Pipeline schedules: every (PP, M) pair simulates without deadlock, pairs every message, and
// 1F1B keeps at most min(PP - stage, M) micro-batches in flight; broken lists are caught.
#include <gtest/gtest.h>

#include <map>

#include "parallel/schedule.h"

namespace tpt {
namespace {

std::vector<std::vector<Action>> all_stages(ScheduleKind k, int P, int M) {
  std::vector<std::vector<Action>> v;
  for (int s = 0; s < P; ++s) v.push_back(make_schedule(k, P, s, M));
  return v;
}

int count(const std::vector<Action>& L, Action::Kind k) {
  int n = 0;
  for (const auto& a : L) n += a.kind == k;
  return n;
}

TEST(Schedule, OneFOneBAllPairsSimulate) {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 12; ++M) {
      auto lists = all_stages(ScheduleKind::OneFOneB, P, M);
      EXPECT_EQ(simulate(lists), "") << "P=" << P << " M=" << M;
      for (int s = 0; s < P; ++s) {
        EXPECT_EQ(count(lists[size_t(s)], Action::Kind::Forward), M);
        EXPECT_EQ(count(lists[size_t(s)], Action::Kind::Backward), M);
        EXPECT_LE(max_in_flight(lists[size_t(s)]), std::min(P - s, M)) << "P=" << P << " M=" << M << " s=" << s;
        EXPECT_EQ(max_in_flight(lists[size_t(s)]), std::min(P - s, M));
      }
    }
}

// The planner's memory counts in-flight micro-batches on a schedule of in_flight_equivalent_microbatches:
// every stage's counts (all chunks, per chunk, awaiting B) equal those of the whole schedule, for
// every kind, above the bound too (GPipe, which holds all M, is never shortened).
TEST(Schedule, InFlightEquivalentMicrobatchesHoldTheSameCounts) {
  const std::vector<std::pair<ScheduleKind, int>> kinds = {{ScheduleKind::OneFOneB, 1}, {ScheduleKind::ZeroBubbleH1, 1},
      {ScheduleKind::GPipe, 1}, {ScheduleKind::Interleaved1F1B, 2}, {ScheduleKind::Interleaved1F1B, 3},
      {ScheduleKind::Interleaved1F1B, 4}};
  for (const auto& [kind, v] : kinds)
    for (int P = 1; P <= 8; ++P)
      for (int M = 1; M <= 3 * (v + 1) * P + 2; ++M) {
        if (!check_schedule(kind, P, M, v).empty()) continue;
        const int E = in_flight_equivalent_microbatches(kind, P, M, v);
        EXPECT_LE(E, M);
        if (kind == ScheduleKind::GPipe) {
          EXPECT_EQ(E, M);
        }
        if (E == M) continue;
        ASSERT_EQ(check_schedule(kind, P, E, v), "");
        for (int s = 0; s < P; ++s) {
          const std::vector<Action> whole = make_schedule(kind, P, s, M, v), shorter = make_schedule(kind, P, s, E, v);
          const std::string where = "kind " + std::to_string(int(kind)) + " v " + std::to_string(v) + " P " +
                                    std::to_string(P) + " M " + std::to_string(M) + " stage " + std::to_string(s);
          EXPECT_EQ(max_in_flight(shorter), max_in_flight(whole)) << where;
          EXPECT_EQ(max_in_flight_per_chunk(shorter), max_in_flight_per_chunk(whole)) << where;
          EXPECT_EQ(max_awaiting_backward(shorter), max_awaiting_backward(whole)) << where;
          auto same = [&](const ReceiveBuffers& a, const ReceiveBuffers& b) {
            EXPECT_EQ(a.activations, b.activations) << where;
            EXPECT_EQ(a.gradients, b.gradients) << where;
          };
          same(receive_buffers(shorter, v), receive_buffers(whole, v));
          same(receive_buffers(make_schedule(ScheduleKind::ForwardOnly, P, s, E, v), v),
               receive_buffers(make_schedule(ScheduleKind::ForwardOnly, P, s, M, v), v));
          EXPECT_EQ(pool_slots(shorter, v, E).slots, pool_slots(whole, v, M).slots) << where;
          EXPECT_EQ(pool_slots(make_schedule(ScheduleKind::ForwardOnly, P, s, E, v), v, E).slots,
                    pool_slots(make_schedule(ScheduleKind::ForwardOnly, P, s, M, v), v, M).slots)
              << where;
        }
      }
}

// pool_slots (the interleaved chunks' shared activation slots): replaying a list, no slot is taken by a
// Forward while another micro-batch of any chunk still holds it (until its backward's end; without
// backward until the Comm that sends it); with backward as many slots as max_in_flight -- fewer than
// the chunks' own peaks added up, which is what the pool saves (Megatron's allocator sees the same
// peak: its interleaved warm-up, (P - s - 1) * 2 + (v - 1) * P, plus one).
TEST(Schedule, PooledSlotsNeverCollideAndNumberThePeak) {
  bool saves = false;
  for (const ScheduleKind kind : {ScheduleKind::Interleaved1F1B, ScheduleKind::ForwardOnly, ScheduleKind::OneFOneB,
                                  ScheduleKind::ZeroBubbleH1})
    for (int v : {1, 2, 3})
      for (int P : {2, 3, 4})
        for (int M : {P, 2 * P, 5 * P}) {
          if ((kind == ScheduleKind::OneFOneB || kind == ScheduleKind::ZeroBubbleH1) && v > 1) continue;
          if (!check_schedule(kind, P, M, v).empty()) continue;
          for (int s = 0; s < P; ++s) {
            const std::vector<Action> L = make_schedule(kind, P, s, M, v);
            const SlotPool pool = pool_slots(L, v, M);
            const bool backward = kind != ScheduleKind::ForwardOnly;
            const Action::Kind end = kind == ScheduleKind::ZeroBubbleH1 ? Action::Kind::BackwardWeight : Action::Kind::Backward;
            const std::string where = "kind " + std::to_string(int(kind)) + " v " + std::to_string(v) + " P " +
                                      std::to_string(P) + " M " + std::to_string(M) + " stage " + std::to_string(s);
            std::vector<int> holder(size_t(pool.slots), -1);  // which (mb, chunk) holds each slot
            for (const Action& a : L) {
              if (a.kind == Action::Kind::Forward) {
                const int slot = pool.slot[size_t(a.chunk)][size_t(a.mb)];
                ASSERT_TRUE(slot >= 0 && slot < pool.slots) << where;
                EXPECT_EQ(holder[size_t(slot)], -1) << where << ": F" << a.mb << "c" << a.chunk;
                const bool last_virtual = s == P - 1 && a.chunk == v - 1;
                holder[size_t(slot)] = backward || !last_virtual ? a.chunk * M + a.mb : -1;
              } else if (backward && a.kind == end) {
                holder[size_t(pool.slot[size_t(a.chunk)][size_t(a.mb)])] = -1;
              } else if (!backward && a.kind == Action::Kind::Comm && a.send_fwd >= 0) {
                holder[size_t(pool.slot[size_t(a.send_fwd_chunk)][size_t(a.send_fwd)])] = -1;
              }
            }
            if (backward) {
              EXPECT_EQ(pool.slots, max_in_flight(L)) << where;
              int sum = 0;
              for (int n : max_in_flight_per_chunk(L)) sum += n;
              saves = saves || sum > pool.slots;
              if (kind == ScheduleKind::Interleaved1F1B && v > 1 && M >= (v + 1) * P) {
                EXPECT_EQ(pool.slots, std::min(M * v, (P - s - 1) * 2 + (v - 1) * P + 1)) << where;
              }
            }
          }
        }
  EXPECT_TRUE(saves);
}

// receive_buffers: with its count R of buffers per chunk and stream, micro-batch mb's message in buffer
// mb mod R never lands on one still waiting for its Forward / Backward; with R - 1 one does. (Every
// schedule here posts a receive just before the pass that reads it: R is 0 or 1.)
TEST(Schedule, ReceiveBuffersAreTheFewestThatNeverCollide) {
  // whether receiving into buffers mb mod R of each chunk ever overwrites an unconsumed message
  auto collides = [](const std::vector<Action>& l, int v, bool forward, const std::vector<int>& R) {
    std::vector<std::map<int, int>> held(static_cast<size_t>(v));  // chunk: buffer -> micro-batch waiting in it
    for (const Action& a : l) {
      const int mb = forward ? a.recv_fwd : a.recv_bwd, c = forward ? a.recv_fwd_chunk : a.recv_bwd_chunk;
      if (a.kind == Action::Kind::Comm && mb >= 0) {
        if (R[size_t(c)] <= 0) return true;
        if (!held[size_t(c)].emplace(mb % R[size_t(c)], mb).second) return true;
      }
      if (a.kind == (forward ? Action::Kind::Forward : Action::Kind::Backward) && a.chunk >= 0)
        for (auto it = held[size_t(a.chunk)].begin(); it != held[size_t(a.chunk)].end(); ++it)
          if (it->second == a.mb) {
            held[size_t(a.chunk)].erase(it);
            break;
          }
    }
    return false;
  };
  const std::vector<std::pair<ScheduleKind, int>> kinds = {{ScheduleKind::OneFOneB, 1}, {ScheduleKind::ZeroBubbleH1, 1},
      {ScheduleKind::GPipe, 1}, {ScheduleKind::Interleaved1F1B, 2}, {ScheduleKind::Interleaved1F1B, 3},
      {ScheduleKind::ForwardOnly, 1}, {ScheduleKind::ForwardOnly, 2}};
  for (const auto& [kind, v] : kinds)
    for (int P = 2; P <= 6; ++P)
      for (int M = 1; M <= 3 * (v + 1) * P; ++M) {
        if (!check_schedule(kind, P, M, v).empty()) continue;
        for (int s = 0; s < P; ++s) {
          const std::vector<Action> l = make_schedule(kind, P, s, M, v);
          const ReceiveBuffers r = receive_buffers(l, v);
          const std::string where = "kind " + std::to_string(int(kind)) + " v " + std::to_string(v) + " P " +
                                    std::to_string(P) + " M " + std::to_string(M) + " stage " + std::to_string(s);
          for (bool fwd : {true, false}) {
            const std::vector<int>& R = fwd ? r.activations : r.gradients;
            EXPECT_FALSE(collides(l, v, fwd, R)) << where;
            for (size_t c = 0; c < size_t(v); ++c) {
              if (R[c] == 0) continue;
              std::vector<int> fewer = R;
              fewer[c] -= 1;
              EXPECT_TRUE(collides(l, v, fwd, fewer)) << where << " chunk " << c;
            }
          }
          if (s == 0) {  // stage 0's first chunk: the embeddings
            EXPECT_EQ(r.activations[0], 0) << where;
          }
        }
      }
}

TEST(Schedule, GPipeAndForwardOnlySimulate) {
  for (int P = 1; P <= 6; ++P)
    for (int M = 1; M <= 9; ++M) {
      auto lists = all_stages(ScheduleKind::GPipe, P, M);
      EXPECT_EQ(simulate(lists), "") << "P=" << P << " M=" << M;
      for (int s = 0; s < P; ++s) EXPECT_EQ(max_in_flight(lists[size_t(s)]), M);
      EXPECT_EQ(simulate(all_stages(ScheduleKind::ForwardOnly, P, M), false), "");
    }
}

TEST(Schedule, OneFOneBWarmupMatchesMegatron) {
  // stage 0 of 4 with 8 micro-batches: 3 warmup forwards, then F3 B0 F4 B1 ...
  auto L = make_schedule(ScheduleKind::OneFOneB, 4, 0, 8);
  std::string seq;
  for (const auto& a : L)
    if (a.kind != Action::Kind::Comm) seq += a.str() + " ";
  EXPECT_EQ(seq, "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 ");
  auto last = make_schedule(ScheduleKind::OneFOneB, 4, 3, 3);
  seq.clear();
  for (const auto& a : last)
    if (a.kind != Action::Kind::Comm) seq += a.str() + " ";
  EXPECT_EQ(seq, "F0 B0 F1 B1 F2 B2 ");
}

TEST(Schedule, SimulatorCatchesDeadlock) {
  // Stage 1 waits for a gradient before it ever sends its activation onwards: stage 0's first
  // comm is a receive of a gradient that nobody sends yet -> deadlock.
  auto lists = all_stages(ScheduleKind::OneFOneB, 2, 2);
  std::swap(lists[0][0], lists[0][1]);  // stage 0: comm before F0 -> sends F0 before computing it
  EXPECT_NE(simulate(lists), "");
  lists = all_stages(ScheduleKind::GPipe, 3, 2);
  // Reverse stage 2's list: it wants to send gradients before receiving anything.
  std::reverse(lists[2].begin(), lists[2].end());
  EXPECT_NE(simulate(lists), "");
}

TEST(Schedule, SimulatorReportsTrueDeadlock) {
  // Both stages first wait for a message the other sends only later.
  Action r0, r1, f0, b0, s0, s1;
  r0.recv_bwd = 0;           // stage 0 waits for the gradient of micro-batch 0
  r1.recv_fwd = 0;           // stage 1 waits for the activation of micro-batch 0
  f0.kind = Action::Kind::Forward, f0.mb = 0;
  b0.kind = Action::Kind::Backward, b0.mb = 0;
  s0.send_fwd = 0;
  s1.send_bwd = 0;
  std::vector<std::vector<Action>> lists = {{r0, f0, s0, b0}, {r1, f0, b0, s1}};
  std::string why = simulate(lists);
  EXPECT_NE(why.find("deadlock"), std::string::npos) << why;
}

TEST(Schedule, SimulatorCatchesMismatchedMicrobatches) {
  auto lists = all_stages(ScheduleKind::GPipe, 2, 2);
  for (auto& a : lists[1])
    if (a.recv_fwd == 0) a.recv_fwd = 1;
    else if (a.recv_fwd == 1) a.recv_fwd = 0;
  EXPECT_NE(simulate(lists), "");
}

TEST(Schedule, SimulatorCatchesMissingBackward) {
  auto lists = all_stages(ScheduleKind::GPipe, 1, 3);
  lists[0].pop_back();
  EXPECT_NE(simulate(lists), "");
}

}  // namespace
}  // namespace tpt
