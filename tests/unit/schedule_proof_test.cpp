// Interleaved 1F1B and ZB-H1 proven by the simulator (parallel/schedule.h): every (PP, M, v) of a
// grid simulates (pairing across the ring, no deadlock, F before B before W per micro-batch and
// chunk); the orders are Megatron's / the ZB-H1 paper's; the timed bubbles are the published ones;
// hand-checked lists for small cases; broken lists are caught.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "model/memory.h"
#include "parallel/schedule.h"

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
  EXPECT_EQ(parse_schedule("zb-h1"), ScheduleKind::ZeroBubbleH1);
  EXPECT_EQ(parse_schedule("1f1b"), ScheduleKind::OneFOneB);
  EXPECT_THROW(parse_schedule("zbh1"), InputError);
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
