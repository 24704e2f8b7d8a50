// Interleaved 1F1B and ZB-H1 proven by the simulator (parallel/schedule.h): every (PP, M, v) of a
// grid simulates (pairing across the ring, no deadlock, F before B before W per micro-batch and
// chunk); the orders are Megatron's / the ZB-H1 paper's; the timed bubbles are the published ones;
// hand-checked lists for small cases; broken lists are caught.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "parallel/schedule.h"
#include "plan/memory.h"

namespace tpt {
namespace {

using Lists = std::vector<std::vector<Action>>;
using K = Action::Kind;

Lists all_stages(ScheduleKind k, int P, int M, int v = 1) {
  Lists out;
  for (int s = 0; s < P; ++s) out.push_back(make_schedule(k, P, s, M, v));
  return out;
}

int count(const std::vector<Action>& L, K k, int chunk = -1) {
  int n = 0;
  for (const auto& a : L) n += a.kind == k && (chunk < 0 || a.chunk == chunk);
  return n;
}

bool same(const Action& a, const Action& b) {
  return a.kind == b.kind && a.mb == b.mb && a.chunk == b.chunk && a.send_fwd == b.send_fwd &&
         a.recv_fwd == b.recv_fwd && a.send_bwd == b.send_bwd && a.recv_bwd == b.recv_bwd &&
         a.send_fwd_chunk == b.send_fwd_chunk && a.recv_fwd_chunk == b.recv_fwd_chunk &&
         a.send_bwd_chunk == b.send_bwd_chunk && a.recv_bwd_chunk == b.recv_bwd_chunk;
}

bool same(const std::vector<Action>& a, const std::vector<Action>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}

std::string seq(const std::vector<Action>& L, bool with_comm = true) {
  std::string s;
  for (const auto& a : L)
    if (with_comm || a.kind != K::Comm) s += (s.empty() ? "" : " ") + a.str();
  return s;
}

std::string where(int P, int M, int v = 1, int s = -1) {
  return "P=" + std::to_string(P) + " M=" + std::to_string(M) + " v=" + std::to_string(v) +
         (s >= 0 ? " stage " + std::to_string(s) : "");
}

TEST(ScheduleProof, EveryScheduleSimulates) {
  int interleaved_runs = 0;
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 24; ++M) {
      for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::GPipe, ScheduleKind::ZeroBubbleH1}) {
        const Lists lists = all_stages(k, P, M);
        ASSERT_EQ(simulate(lists), "") << where(P, M) << " kind " << int(k);
        for (int s = 0; s < P; ++s) {
          EXPECT_EQ(count(lists[size_t(s)], K::Forward), M);
          EXPECT_EQ(count(lists[size_t(s)], K::Backward), M);
          EXPECT_EQ(count(lists[size_t(s)], K::BackwardWeight), k == ScheduleKind::ZeroBubbleH1 ? M : 0);
        }
      }
      for (int v = 1; v <= 4; ++v) {
        if (!check_schedule(ScheduleKind::Interleaved1F1B, P, M, v).empty()) continue;
        interleaved_runs += v > 1;
        const Lists lists = all_stages(ScheduleKind::Interleaved1F1B, P, M, v);
        ASSERT_EQ(simulate(lists), "") << where(P, M, v);
        const Lists eval = all_stages(ScheduleKind::ForwardOnly, P, M, v);
        ASSERT_EQ(simulate(eval, false), "") << where(P, M, v) << " forward only";
        for (int s = 0; s < P; ++s)
          for (int c = 0; c < v; ++c) {
            EXPECT_EQ(count(lists[size_t(s)], K::Forward, c), M) << where(P, M, v, s);
            EXPECT_EQ(count(lists[size_t(s)], K::Backward, c), M) << where(P, M, v, s);
            EXPECT_EQ(count(eval[size_t(s)], K::Forward, c), M) << where(P, M, v, s);
            EXPECT_EQ(count(eval[size_t(s)], K::Backward, c), 0);
          }
      }
    }
  EXPECT_EQ(interleaved_runs, 3 * (12 + 8 + 6 + 4 + 4 + 3 + 3));  // v = 2..4, P = 2..8, M = P, 2P, ... <= 24
}

TEST(ScheduleProof, CheckScheduleNamesTheConstraint) {
  EXPECT_EQ(check_schedule(ScheduleKind::Interleaved1F1B, 4, 8, 2), "");
  EXPECT_EQ(check_schedule(ScheduleKind::Interleaved1F1B, 4, 6, 1), "");  // v = 1: plain 1F1B, any M
  const std::string m = check_schedule(ScheduleKind::Interleaved1F1B, 4, 6, 2);
  EXPECT_NE(m.find("multiple of parallel.pipeline_model_parallel_size (4)"), std::string::npos) << m;
  EXPECT_NE(m.find("micro-batches per DP rank"), std::string::npos) << m;
  EXPECT_NE(m.find("= 6"), std::string::npos) << m;
  EXPECT_THROW(make_schedule(ScheduleKind::Interleaved1F1B, 4, 0, 6, 2), InputError);
  const std::string one = check_schedule(ScheduleKind::Interleaved1F1B, 1, 4, 2);
  EXPECT_NE(one.find("pipeline_model_parallel_size > 1"), std::string::npos) << one;
  for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::GPipe, ScheduleKind::ZeroBubbleH1}) {
    EXPECT_NE(check_schedule(k, 4, 8, 2).find("virtual_pipeline_model_parallel_size"), std::string::npos);
    EXPECT_EQ(check_schedule(k, 4, 7, 1), "");
  }
  EXPECT_EQ(check_schedule(ScheduleKind::ForwardOnly, 4, 8, 2), "");
  EXPECT_NE(check_schedule(ScheduleKind::ForwardOnly, 4, 6, 2), "");
  EXPECT_NE(check_schedule(ScheduleKind::OneFOneB, 4, 0, 1), "");
  EXPECT_EQ(schedule_kind(PipelineSchedule::ZeroBubbleH1, 1), ScheduleKind::ZeroBubbleH1);
  EXPECT_EQ(schedule_kind(PipelineSchedule::OneFOneB, 1), ScheduleKind::OneFOneB);
  EXPECT_EQ(schedule_kind(PipelineSchedule::OneFOneB, 2), ScheduleKind::Interleaved1F1B);
  EXPECT_EQ(schedule_kind(PipelineSchedule::GPipe, 1), ScheduleKind::GPipe);
}

TEST(ScheduleProof, InterleavedWithOneChunkIs1F1B) {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 24; ++M)
      for (int s = 0; s < P; ++s)
        EXPECT_TRUE(same(make_schedule(ScheduleKind::Interleaved1F1B, P, s, M, 1),
                         make_schedule(ScheduleKind::OneFOneB, P, s, M)))
            << where(P, M, 1, s);
}

// The compute order against Megatron's rules, written out independently: the k-th forward is
// micro-batch (k / Pv) P + k % P of chunk (k % Pv) / P, the k-th backward the same micro-batch of
// chunk v - 1 - (k % Pv) / P; warmup = min(2 (P - s - 1) + (v - 1) P, M v) forwards, then one
// forward and one backward per step, then the remaining backwards.
TEST(ScheduleProof, InterleavedOrderIsMegatrons) {
  for (int P = 2; P <= 8; ++P)
    for (int v = 2; v <= 4; ++v)
      for (int M = P; M <= 24; M += P)
        for (int s = 0; s < P; ++s) {
          const int total = M * v, warmup = std::min(2 * (P - s - 1) + (v - 1) * P, total);
          auto F = [&](int k) {
            Action a;
            a.kind = K::Forward, a.mb = k / (P * v) * P + k % P, a.chunk = k % (P * v) / P;
            return a;
          };
          auto B = [&](int k) {
            Action a = F(k);
            a.kind = K::Backward, a.chunk = v - 1 - a.chunk;
            return a;
          };
          std::vector<Action> want;
          for (int k = 0; k < warmup; ++k) want.push_back(F(k));
          for (int k = 0; k < total - warmup; ++k) want.push_back(F(warmup + k)), want.push_back(B(k));
          for (int k = total - warmup; k < total; ++k) want.push_back(B(k));
          std::vector<Action> got;
          for (const Action& a : make_schedule(ScheduleKind::Interleaved1F1B, P, s, M, v))
            if (a.kind != K::Comm) got.push_back(a);
          EXPECT_EQ(seq(got), seq(want)) << where(P, M, v, s);
          // activation slots: warmup + 1 (the steady state's forward before its backward), per
          // chunk at most that
          const std::vector<Action> L = make_schedule(ScheduleKind::Interleaved1F1B, P, s, M, v);
          EXPECT_EQ(max_in_flight(L), std::min(warmup + 1, total)) << where(P, M, v, s);
          const std::vector<int> per = max_in_flight_per_chunk(L);
          ASSERT_EQ(int(per.size()), v);
          for (int c = 0; c < v; ++c) EXPECT_LE(per[size_t(c)], std::min(warmup + 1, M));
          EXPECT_EQ(max_awaiting_backward(L), max_in_flight(L));
        }
}

// Checked by hand against megatron-core's loop (p2p calls -> comm actions; rank 0's chunk 0 has no
// receive, rank 1's chunk 1 no send; rank 1 -> rank 0 activations cross the ring's seam into chunk 1).
TEST(ScheduleProof, InterleavedTwoStagesFourMicrobatchesTwoChunks) {
  EXPECT_EQ(seq(make_schedule(ScheduleKind::Interleaved1F1B, 2, 0, 4, 2)),
            "F0 comm{ send_fwd 0 } "
            "F1 comm{ send_fwd 1 recv_fwd 0c1 } "
            "F0c1 comm{ send_fwd 0c1 recv_fwd 1c1 } "
            "F1c1 comm{ send_fwd 1c1 recv_bwd 0c1 } "
            "F2 B0c1 comm{ send_fwd 2 send_bwd 0c1 recv_bwd 1c1 } "
            "F3 B1c1 comm{ send_fwd 3 recv_fwd 2c1 send_bwd 1c1 recv_bwd 0 } "
            "F2c1 B0 comm{ send_fwd 2c1 recv_fwd 3c1 recv_bwd 1 } "
            "F3c1 B1 comm{ send_fwd 3c1 recv_bwd 2c1 } "
            "B2c1 comm{ send_bwd 2c1 recv_bwd 3c1 } "
            "B3c1 comm{ send_bwd 3c1 recv_bwd 2 } "
            "B2 comm{ recv_bwd 3 } "
            "B3");
  EXPECT_EQ(seq(make_schedule(ScheduleKind::Interleaved1F1B, 2, 1, 4, 2)),
            "comm{ recv_fwd 0 } "
            "F0 comm{ send_fwd 0 recv_fwd 1 } "
            "F1 comm{ send_fwd 1 recv_fwd 0c1 } "
            "F0c1 B0c1 comm{ recv_fwd 1c1 send_bwd 0c1 } "
            "F1c1 B1c1 comm{ recv_fwd 2 send_bwd 1c1 recv_bwd 0 } "
            "F2 B0 comm{ send_fwd 2 recv_fwd 3 send_bwd 0 recv_bwd 1 } "
            "F3 B1 comm{ send_fwd 3 recv_fwd 2c1 send_bwd 1 } "
            "F2c1 B2c1 comm{ recv_fwd 3c1 send_bwd 2c1 } "
            "F3c1 B3c1 comm{ send_bwd 3c1 recv_bwd 2 } "
            "B2 comm{ send_bwd 2 recv_bwd 3 } "
            "B3 comm{ send_bwd 3 }");
}

// Megatron (SC21): bubble time / ideal time = (P - 1) / (v M) for the interleaved schedule, (P - 1) / M
// for 1F1B, whatever the forward and backward costs; the timed run gives exactly that.
TEST(ScheduleProof, InterleavedBubbleIsMegatrons) {
  for (int P = 2; P <= 8; ++P)
    for (int M = P; M <= 24; M += P) {
      const Lists one = all_stages(ScheduleKind::OneFOneB, P, M);
      const PipelineTiming t1 = time_pipeline(one, 1, 1, 1);
      EXPECT_DOUBLE_EQ(t1.makespan, 3.0 * (M + P - 1));
      EXPECT_NEAR(t1.bubble_over_ideal(), double(P - 1) / M, 1e-12);
      EXPECT_NEAR(t1.bubble_fraction(), double(P - 1) / (M + P - 1), 1e-12);
      for (int v = 2; v <= 4; ++v) {
        const Lists lists = all_stages(ScheduleKind::Interleaved1F1B, P, M, v);
        const PipelineTiming t = time_pipeline(lists, 1, 1, 1);
        EXPECT_NEAR(t.bubble_over_ideal(), double(P - 1) / (v * M), 1e-12) << where(P, M, v);
        EXPECT_NEAR(t.ideal(), 3.0 * M, 1e-9);
        EXPECT_LT(t.makespan, t1.makespan) << where(P, M, v);
        EXPECT_LT(t.bubble_fraction(), t1.bubble_fraction()) << where(P, M, v);
        const PipelineTiming t2 = time_pipeline(lists, 1, 2, 0);  // backward twice the forward
        EXPECT_NEAR(t2.bubble_over_ideal(), double(P - 1) / (v * M), 1e-12) << where(P, M, v);
      }
    }
}

TEST(ScheduleProof, ZeroBubbleH1IsOneFOneBWithDeferredWeights) {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 24; ++M) {
      int most_1f1b = 0;
      for (int s = 0; s < P; ++s) most_1f1b = std::max(most_1f1b, max_in_flight(make_schedule(ScheduleKind::OneFOneB, P, s, M)));
      for (int s = 0; s < P; ++s) {
        const std::vector<Action> z = make_schedule(ScheduleKind::ZeroBubbleH1, P, s, M);
        const std::vector<Action> o = make_schedule(ScheduleKind::OneFOneB, P, s, M);
        // without its W's the list is 1F1B's, comm actions included
        std::vector<Action> stripped;
        for (const Action& a : z)
          if (a.kind != K::BackwardWeight) stripped.push_back(a);
        EXPECT_TRUE(same(stripped, o)) << where(P, M, 1, s);
        // W's run in micro-batch order (1F1B's gradient accumulation order), each after its B
        int next_w = 0;
        std::vector<bool> b_done(size_t(M), false);
        for (const Action& a : z) {
          if (a.kind == K::Backward) b_done[size_t(a.mb)] = true;
          if (a.kind != K::BackwardWeight) continue;
          EXPECT_EQ(a.mb, next_w++) << where(P, M, 1, s);
          EXPECT_TRUE(b_done[size_t(a.mb)]);
        }
        EXPECT_EQ(next_w, M);
        // the in-flight bound: 1F1B's between F and B on every stage; up to W, 1F1B's largest
        // (stage 0's min(P, M)) on every stage
        EXPECT_EQ(max_awaiting_backward(z), max_in_flight(o)) << where(P, M, 1, s);
        EXPECT_EQ(max_in_flight(z), most_1f1b) << where(P, M, 1, s);
        EXPECT_EQ(max_in_flight(z), std::min(P, M)) << where(P, M, 1, s);
        EXPECT_EQ(max_in_flight_per_chunk(z), std::vector<int>{std::min(P, M)});
      }
    }
}

// Qi et al.: with F = B = W the ZB-H1 bubble is (P - 1) units against 1F1B's 3 (P - 1), a third;
// in general M (F + B + W) + (P - 1) (F + B - W) for W <= B. Never slower than 1F1B.
TEST(ScheduleProof, ZeroBubbleH1BubbleIsAThirdOf1F1Bs) {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 24; ++M) {
      const Lists z = all_stages(ScheduleKind::ZeroBubbleH1, P, M);
      const Lists o = all_stages(ScheduleKind::OneFOneB, P, M);
      const PipelineTiming tz = time_pipeline(z, 1, 1, 1), to = time_pipeline(o, 1, 1, 1);
      EXPECT_DOUBLE_EQ(tz.ideal(), 3.0 * M);
      if (M >= P) {
        EXPECT_DOUBLE_EQ(tz.makespan, 3.0 * M + P - 1) << where(P, M);
        EXPECT_NEAR(tz.bubble_over_ideal(), double(P - 1) / (3 * M), 1e-12) << where(P, M);
        EXPECT_NEAR(3 * (tz.makespan - tz.ideal()), to.makespan - to.ideal(), 1e-12) << where(P, M);
      }
      if (P > 1) {
        EXPECT_LT(tz.makespan, to.makespan) << where(P, M);
      }
      for (auto [f, b, w] : {std::tuple{1.0, 1.0, 0.5}, {1.0, 1.5, 0.5}, {1.0, 1.2, 0.8}, {1.0, 2.0, 0.01}}) {
        const double mz = schedule_makespan(z, f, b, w), mo = schedule_makespan(o, f, b, w);
        EXPECT_LE(mz, mo + 1e-9) << where(P, M) << " f=" << f << " b=" << b << " w=" << w;
        if (M >= P) {
          EXPECT_NEAR(mz, M * (f + b + w) + (P - 1) * (f + b - w), 1e-9) << where(P, M);
        }
      }
    }
}

// By hand from the H1 rules (stage s of P: 1F1B's warmup P - s - 1 forwards; steady F, B, then the
// oldest W once s are pending; cooldown B, W; the rest of the W's at the end).
TEST(ScheduleProof, ZeroBubbleH1HandWritten) {
  EXPECT_EQ(seq(make_schedule(ScheduleKind::ZeroBubbleH1, 3, 0, 4), false), "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3");
  EXPECT_EQ(seq(make_schedule(ScheduleKind::ZeroBubbleH1, 3, 1, 4), false), "F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3");
  EXPECT_EQ(seq(make_schedule(ScheduleKind::ZeroBubbleH1, 3, 2, 4), false), "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3");
  // with the exchanges: a W goes before the exchange that also receives the next input, after the
  // last gradient send
  EXPECT_EQ(seq(make_schedule(ScheduleKind::ZeroBubbleH1, 2, 0, 4)),
            "F0 comm{ send_fwd 0 } F1 comm{ send_fwd 1 recv_bwd 0 } B0 W0 F2 comm{ send_fwd 2 recv_bwd 1 } B1 W1 "
            "F3 comm{ send_fwd 3 recv_bwd 2 } B2 W2 comm{ recv_bwd 3 } B3 W3");
  EXPECT_EQ(seq(make_schedule(ScheduleKind::ZeroBubbleH1, 2, 1, 4)),
            "comm{ recv_fwd 0 } F0 B0 comm{ recv_fwd 1 send_bwd 0 } F1 B1 W0 comm{ recv_fwd 2 send_bwd 1 } "
            "F2 B2 W1 comm{ recv_fwd 3 send_bwd 2 } F3 B3 comm{ send_bwd 3 } W2 W3");
}

TEST(ScheduleProof, SimulatorCatchesBrokenSplitBackwards) {
  const Lists good = all_stages(ScheduleKind::ZeroBubbleH1, 3, 4);
  ASSERT_EQ(simulate(good), "");
  auto find = [](const std::vector<Action>& L, K k, int mb) {
    for (size_t i = 0; i < L.size(); ++i)
      if (L[i].kind == k && L[i].mb == mb) return i;
    return L.size();
  };
  Lists lists = good;  // W before its B
  std::swap(lists[2][find(lists[2], K::Backward, 2)], lists[2][find(lists[2], K::BackwardWeight, 2)]);
  EXPECT_NE(simulate(lists).find("weight backward before backward"), std::string::npos) << simulate(lists);
  lists = good;  // a W missing
  lists[1].erase(lists[1].begin() + long(find(lists[1], K::BackwardWeight, 3)));
  EXPECT_NE(simulate(lists).find("backwards without weight backwards"), std::string::npos) << simulate(lists);
  lists = good;  // a W twice
  lists[0].push_back(lists[0][find(lists[0], K::BackwardWeight, 0)]);
  EXPECT_NE(simulate(lists).find("second weight backward"), std::string::npos) << simulate(lists);
}

TEST(ScheduleProof, SimulatorCatchesBrokenRing) {
  const Lists good = all_stages(ScheduleKind::Interleaved1F1B, 2, 4, 2);
  ASSERT_EQ(simulate(good), "");
  Lists lists = good;  // stage 0 labels an activation from the seam with the wrong chunk
  for (auto& a : lists[0])
    if (a.kind == K::Comm && a.recv_fwd == 0 && a.recv_fwd_chunk == 1) a.recv_fwd_chunk = 0;
  EXPECT_NE(simulate(lists), "");
  lists = good;  // stage 1 takes chunk 1's input of micro-batch 0 for chunk 0's
  for (auto& a : lists[1])
    if (a.kind == K::Comm && a.recv_fwd == 0 && a.recv_fwd_chunk == 1) a.recv_fwd_chunk = 0;
  EXPECT_NE(simulate(lists).find("received the activation of micro-batch 0 of chunk 1"), std::string::npos) << simulate(lists);
  lists = good;  // the same for a gradient: stage 0 takes chunk 0's output gradient for chunk 1's
  for (auto& a : lists[0])
    if (a.kind == K::Comm && a.recv_bwd == 0 && a.recv_bwd_chunk == 0) a.recv_bwd_chunk = 1;
  EXPECT_NE(simulate(lists).find("received the gradient of micro-batch 0 of chunk 0"), std::string::npos) << simulate(lists);
  lists = good;  // the last virtual stage sends its output onwards
  for (auto& a : lists[1])
    if (a.kind == K::Comm && a.send_bwd == 0 && a.send_bwd_chunk == 1) a.send_fwd = 0, a.send_fwd_chunk = 1;
  EXPECT_NE(simulate(lists).find("stage that does not exist"), std::string::npos) << simulate(lists);
  lists = good;  // a chunk-1 forward before its activation crossed the seam
  {
    auto& L = lists[0];
    auto f = std::find_if(L.begin(), L.end(), [](const Action& a) { return a.kind == K::Forward && a.chunk == 1; });
    Action a = *f;
    L.erase(f);
    L.insert(L.begin(), a);
  }
  EXPECT_NE(simulate(lists).find("before its activation arrived"), std::string::npos) << simulate(lists);
  lists = good;  // the backwards of two chunks swapped on stage 1
  {
    auto& L = lists[1];
    auto b0 = std::find_if(L.begin(), L.end(), [](const Action& a) { return a.kind == K::Backward && a.chunk == 1; });
    auto b1 = std::find_if(L.begin(), L.end(), [](const Action& a) { return a.kind == K::Backward && a.chunk == 0; });
    std::swap(*b0, *b1);
  }
  EXPECT_NE(simulate(lists), "");
}

// NCCL pairs a rank's sends to a peer with the peer's receives from it in posting order, whatever the
// stream (parallel/comm.h). With P = 2 activations and gradients share each directed rank pair (the
// interleaved schedule sends both ways across the ring's seam), so simulate's per-pair order check is
// what makes these lists NCCL-safe; it runs inside simulate, so EveryScheduleSimulates covers every
// kind over its grid. Here explicitly: P = 2 interleaved with v = 2..4, M = 2..8, whose lists do post
// an activation and a gradient to the same peer in one exchange.
TEST(ScheduleProof, TwoStagesKeepPerPairOrder) {
  for (int v = 2; v <= 4; ++v)
    for (int M = 2; M <= 8; M += 2) {
      const Lists lists = all_stages(ScheduleKind::Interleaved1F1B, 2, M, v);
      EXPECT_EQ(simulate(lists), "") << where(2, M, v);
      EXPECT_EQ(simulate(all_stages(ScheduleKind::ForwardOnly, 2, M, v), false), "") << where(2, M, v);
      int shared = 0;
      for (const auto& L : lists)
        for (const Action& a : L) shared += (a.send_fwd >= 0 && a.send_bwd >= 0) || (a.recv_fwd >= 0 && a.recv_bwd >= 0);
      if (M >= 4) {  // M = 2: no steady state
        EXPECT_GT(shared, 0) << where(2, M, v);
      }
    }
  for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::GPipe, ScheduleKind::ZeroBubbleH1, ScheduleKind::ForwardOnly})
    for (int M = 1; M <= 8; ++M) EXPECT_EQ(simulate(all_stages(k, 2, M), k != ScheduleKind::ForwardOnly), "");
}

// Is the per-pair order implied by the other checks? Only for P >= 3, where a directed pair carries
// one stream. For P <= 2, take an activation x and a gradient y on the pair a -> b whose per-stream
// orders agree but whose merged orders differ. Within one action both sides post the activation
// first, so either (1) a posts x before y (same action i or i < j) and b receives y in an action k
// strictly before x's action l, or (2) a posts y in an action j strictly before x's action i and b
// receives x no later than y (l <= k). If both sides use two actions (i < j and k < l, or j < i and
// l < k) there is a cycle: a's earlier action waits under rendezvous for b to post the receive of its
// message, which comes after b's earlier action, which waits for a to post the other send, which comes
// after a's earlier action: a deadlock, caught before. What remains is (1) with x and y in one action
// on a and two actions on b, gradient first, and (2) with y before x in two actions on a and both in
// one action on b: no cycle, every old check passes, and NCCL would pair x's send with y's receive.
// Both are built below (P = 2, v = 2, M = 2), with the lists that are right and the deadlocking one.
TEST(ScheduleProof, SimulatorCatchesPerPairOrderThatOnlyNcclSees) {
  auto F = [](int mb, int c) {
    Action a;
    a.kind = K::Forward, a.mb = mb, a.chunk = c;
    return a;
  };
  auto B = [&](int mb, int c) {
    Action a = F(mb, c);
    a.kind = K::Backward;
    return a;
  };
  // comm: micro-batch and chunk of send_fwd, recv_fwd, send_bwd, recv_bwd (mb -1: none)
  auto C = [](int sf, int sfc, int rf, int rfc, int sb, int sbc, int rb, int rbc) {
    Action a;
    a.send_fwd = sf, a.send_fwd_chunk = sf >= 0 ? sfc : 0;
    a.recv_fwd = rf, a.recv_fwd_chunk = rf >= 0 ? rfc : 0;
    a.send_bwd = sb, a.send_bwd_chunk = sb >= 0 ? sbc : 0;
    a.recv_bwd = rb, a.recv_bwd_chunk = rb >= 0 ? rbc : 0;
    return a;
  };
  auto sf = [&](int mb, int c) { return C(mb, c, -1, 0, -1, 0, -1, 0); };
  auto rf = [&](int mb, int c) { return C(-1, 0, mb, c, -1, 0, -1, 0); };
  auto sb = [&](int mb, int c) { return C(-1, 0, -1, 0, mb, c, -1, 0); };
  auto rb = [&](int mb, int c) { return C(-1, 0, -1, 0, -1, 0, mb, c); };
  // Virtual stages: rank 0 chunk 0, rank 1 chunk 0, rank 0 chunk 1, rank 1 chunk 1. Rank 0 sends the
  // activation of micro-batch 1 (chunk 0 -> rank 1 chunk 0) and the gradient of micro-batch 0 (chunk 1
  // -> rank 1 chunk 0) in one exchange (index 8), rank 1 receives them in two (indices 7, 8).
  const std::vector<Action> rank0 = {
      F(0, 0), sf(0, 0), rf(0, 1), F(0, 1), sf(0, 1), rb(0, 1), B(0, 1), F(1, 0),
      C(1, 0, -1, 0, 0, 1, -1, 0),  // comm{ send_fwd 1 send_bwd 0c1 }: activation, then gradient
      rb(0, 0), B(0, 0), rf(1, 1), F(1, 1), sf(1, 1), rb(1, 1), B(1, 1), sb(1, 1), rb(1, 0), B(1, 0)};
  const std::vector<Action> rank1 = {
      rf(0, 0), F(0, 0), sf(0, 0), rf(0, 1), F(0, 1), B(0, 1), sb(0, 1),
      rb(0, 0), rf(1, 0),  // the gradient first: case (1)
      F(1, 0), B(0, 0), sb(0, 0), sf(1, 0), rf(1, 1), F(1, 1), B(1, 1), sb(1, 1), rb(1, 0), B(1, 0), sb(1, 0)};
  const std::string why = simulate({rank0, rank1});
  EXPECT_EQ(why,
            "stage 0 -> stage 1: message 2 in posting order differs: stage 0 sends the activation of micro-batch 1 "
            "for chunk 0 (its action 8, comm{ send_fwd 1 send_bwd 0c1 }), stage 1 receives the gradient of "
            "micro-batch 0 for chunk 0 (its action 7, comm{ recv_bwd 0 }) (NCCL has no tags and pairs the "
            "messages of a rank pair in posting order)");

  // The same with rank 1 receiving the activation first, or both in one exchange: right.
  std::vector<Action> right = rank1;
  std::swap(right[7], right[8]);
  EXPECT_EQ(simulate({rank0, right}), "");
  std::vector<Action> both = rank1;
  both[7] = C(-1, 0, 1, 0, -1, 0, 0, 0);  // comm{ recv_fwd 1 recv_bwd 0 }
  both.erase(both.begin() + 8);
  EXPECT_EQ(simulate({rank0, both}), "");

  // Case (2): rank 0 sends the gradient, then the activation in two exchanges; rank 1 receives both in
  // one, where the activation's receive is posted first.
  std::vector<Action> grad_first = rank0;
  grad_first[8] = sb(0, 1);
  grad_first.insert(grad_first.begin() + 9, sf(1, 0));
  const std::string why2 = simulate({grad_first, both});
  EXPECT_NE(why2.find("stage 0 -> stage 1: message 2 in posting order differs: stage 0 sends the gradient of "
                      "micro-batch 0 for chunk 0"),
            std::string::npos)
      << why2;
  EXPECT_NE(why2.find("stage 1 receives the activation of micro-batch 1 for chunk 0"), std::string::npos) << why2;
  EXPECT_EQ(simulate({grad_first, rank1}), "");  // received in two exchanges, gradient first: right

  // Two exchanges on both sides in opposite orders deadlock: the old checks already catch that.
  std::vector<Action> act_first = rank0;
  act_first[8] = sf(1, 0);
  act_first.insert(act_first.begin() + 9, sb(0, 1));
  EXPECT_EQ(simulate({act_first, right}), "");
  EXPECT_NE(simulate({act_first, rank1}).find("deadlock"), std::string::npos) << simulate({act_first, rank1});
}

TEST(ScheduleProof, ActionStrings) {
  Action f;
  f.kind = K::Forward, f.mb = 3;
  EXPECT_EQ(f.str(), "F3");  // chunk 0: as before (trace span names, scripts/bubble.py)
  f.chunk = 2;
  EXPECT_EQ(f.str(), "F3c2");
  f.kind = K::BackwardWeight, f.chunk = 0;
  EXPECT_EQ(f.str(), "W3");
  Action c;
  c.send_fwd = 1, c.recv_bwd = 0, c.recv_bwd_chunk = 1;
  EXPECT_EQ(c.str(), "comm{ send_fwd 1 recv_bwd 0c1 }");
}

}  // namespace
}  // namespace tpt
