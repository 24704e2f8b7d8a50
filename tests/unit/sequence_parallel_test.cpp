// Sequence parallelism (parallel.sequence_parallel) on threads as TP ranks (parallel/thread_comm.h):
//  - the mappings of parallel/tensor_parallel.h (gather_from_sequence_parallel_region,
//    reduce_scatter_to_sequence_parallel_region, forward and backward) in fp32, bf16 and fp16, on
//    blocks of even and odd length, against concatenations and sums computed in double;
//  - a two-stage GPT (both stages on each TP rank's thread, the pipeline message passed by hand)
//    with sequence parallelism against the TP = 1 run of the same weights: loss, every gradient
//    (the TP-replicated ones summed over TP, as GradSync does), the stage output and the input
//    gradient as this rank's rows of the TP = 1 ones. The token blocks start and end inside
//    sequences, with and without reset_position_ids, with each recompute mode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/dtype.h"
#include "core/ops.h"
#include "model/gpt.h"
#include "parallel/tensor_parallel.h"
#include "parallel/thread_comm.h"
#include "tests/common/failures.h"
#include "tests/common/tiny_config.h"
#include "tests/common/box_elements.h"

namespace tpt {
namespace {

using VecF = std::vector<float>;


const char* dtype_name(DType t) { return t == DType::F32 ? "fp32" : t == DType::BF16 ? "bf16" : "fp16"; }

// The value rank q contributes at index i (exactly representable in t).
float contribution(int q, int64_t i, DType t) {
  return round_to(float(std::sin(0.37 * double(i) + 1.3 * q) * (1.0 + 0.5 * q)), t);
}

TEST(SequenceParallel, MappingsMatchConcatenationsAndSumsInDouble) {
  for (int T : {2, 4})
    for (DType t : {DType::F32, DType::BF16, DType::F16})
      for (int64_t n : {int64_t{12}, int64_t{7}}) {  // elements per rank's block (odd: padded 16-bit words)
        const std::string where =
            std::string(dtype_name(t)) + " TP " + std::to_string(T) + " block " + std::to_string(n);
        Failures fail;
        run_thread_ranks(T, 1, 1, false, [&](Grid& g) {
          Comm& tp = *g.tp_group;
          const int r = tp.rank();
          std::unique_ptr<Ops> ops = make_cpu_ops(1);  // host memory: Bufs are host pointers
          std::unique_ptr<TPWire> wire;
          if (const int64_t bytes = tp_gather_bytes(T * n, t, T))
            wire = std::make_unique<TPWire>(TPWire{ops.get(), Buf(ops->alloc_bytes(size_t(bytes)), t)});
          auto to_t = [&](const VecF& v) {  // a buffer of dtype t holding v
            Buf b = ops->alloc(int64_t(v.size()), t);
            ops->convert(b, v.data(), int64_t(v.size()));
            return b;
          };
          auto to_f32 = [&](CBuf b, int64_t k) {
            VecF v(static_cast<size_t>(k));
            ops->convert(v.data(), b, k);
            return v;
          };
          // all-gather: the gathered tensor is every rank's block, in rank order, bit for bit
          VecF mine(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) mine[size_t(i)] = contribution(r, i, t);
          Buf shard = to_t(mine), full = ops->alloc(T * n, t);
          gather_from_sequence_parallel_region_forward(tp, full, shard, n, wire.get());
          VecF got = to_f32(full, T * n);
          for (int q = 0; q < T; ++q)
            for (int64_t i = 0; i < n; ++i)
              if (got[size_t(q * n + i)] != contribution(q, i, t))
                fail.add(where + ": all-gather element " + std::to_string(q * n + i) + " on rank " + std::to_string(r));
          // the reduce-scatter's backward is the same all-gather
          Buf full2 = ops->alloc(T * n, t);
          reduce_scatter_to_sequence_parallel_region_backward(tp, full2, shard, n, wire.get());
          if (to_f32(full2, T * n) != got) fail.add(where + ": reduce_scatter backward != all-gather");

          // reduce-scatter: rank q's partial of the whole tensor is contribution(q, 0 .. T n); this
          // rank keeps block r of their sum. Reference: the sum in double (rounded once to t).
          VecF partial(static_cast<size_t>(T * n));
          for (int64_t i = 0; i < T * n; ++i) partial[size_t(i)] = contribution(r, 3 * i + 1, t);
          Buf in = to_t(partial), out = ops->alloc(n, t);
          reduce_scatter_to_sequence_parallel_region_forward(tp, out, in, n, wire.get());
          const VecF sum = to_f32(out, n);
          Buf out2 = ops->alloc(n, t);  // the all-gather's backward is the same reduce-scatter
          gather_from_sequence_parallel_region_backward(tp, out2, in, n, wire.get());
          if (to_f32(out2, n) != sum) fail.add(where + ": all-gather backward != reduce-scatter");
          // fp32 sums in rank order differ from the double sum by rounding only; 16-bit results are
          // the fp32 sum rounded once: within half an ulp of t (2^-8 relative for bf16, 2^-11 for
          // fp16), plus the fp32 rounding
          const double rel = t == DType::F32 ? 1e-6 : t == DType::BF16 ? 1.0 / 256 : 1.0 / 2048;
          for (int64_t i = 0; i < n; ++i) {
            double want = 0;
            for (int q = 0; q < T; ++q) want += double(contribution(q, 3 * (int64_t(r) * n + i) + 1, t));
            const double tol = rel * std::max(std::fabs(want), 1.0) + 1e-6;
            if (std::fabs(double(sum[size_t(i)]) - want) > tol)
              fail.add(where + ": reduce-scatter element " + std::to_string(i) + " on rank " + std::to_string(r) +
                       ": got " + std::to_string(sum[size_t(i)]) + ", want " + std::to_string(want));
          }
          for (void* p : {shard.p, full.p, full2.p, in.p, out.p, out2.p}) ops->free(p);
          if (wire) ops->free(wire->gather.p);
        });
        EXPECT_EQ(fail.count, 0) << where;
      }
}

// ------------------------------------------------------------------------------------------------
// a two-stage GPT

// What one rank's run of the two stages gives.
struct TwoStageRun {
  double loss = 0;
  VecF grads[2];              // per stage, in its layout
  VecF output, input_grad;    // stage 0's output and stage 1's input gradient: this rank's rows (Nt, C)
};

// Forward, loss and backward of one micro-batch through stage 0 then stage 1, both built here with
// the full parameters' boxes; the tied word embedding's gradient summed over the two stages (the
// embedding group), the TP-replicated gradients over `tp`.
TwoStageRun run_two_stages(const Config& cfg, Comm& tp, int tp_rank, const VecF& full, const ParamLayout& full_layout,
                           const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                           const std::vector<int32_t>& positions, Recompute recompute) {
  const int T = tp.size();
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  TwoStageRun out;
  GPTDims d[2];
  ParamLayout l[2];
  VecF params[2];
  std::unique_ptr<GPTStage> stage[2];
  for (int s = 0; s < 2; ++s) {
    d[s] = make_dims(cfg, T, tp_rank, 2, s);
    l[s] = make_param_layout(d[s]);
    params[s].assign(size_t(l[s].total), 0.0f);
    out.grads[s].assign(size_t(l[s].total), 0.0f);
    for (const ParamInfo& p : l[s].params) {
      const ParamInfo* f = full_layout.find(p.name);
      EXPECT_NE(f, nullptr) << p.name;
      if (!f) continue;
      test::for_each_box_element(p, [&](int64_t local, int64_t global) {
        params[s][size_t(p.offset + local)] = full[size_t(f->offset + global)];
      });
    }
    stage[s] = std::make_unique<GPTStage>(d[s], l[s], *ops, tp, params[s].data(), out.grads[s].data(),
                                          cfg.training.micro_batch_size, 1, StageOptions{DType::F32, recompute});
  }
  const int64_t N = int64_t(tokens.size()), Nt = d[0].local_tokens(N);
  stage[0]->forward(0, tokens.data(), nullptr, d[0].position_ids ? positions.data() : nullptr);
  const float* h = stage[0]->output(0).f32();
  out.output.assign(h, h + Nt * d[0].C);
  stage[1]->forward(0, nullptr, out.output.data());
  out.loss = stage[1]->loss(0, targets.data(), 1.0f / float(N), true) / double(N);
  stage[1]->backward(0, nullptr);
  const float* dh = stage[1]->input_grad().f32();
  out.input_grad.assign(dh, dh + Nt * d[0].C);
  stage[0]->backward(0, out.input_grad.data());
  for (auto& st : stage) st.reset();
  // the embedding group's sum of the tied word embedding, then (sequence parallel: partial sums over
  // this rank's tokens) the replicated tensors over TP, as GradSync does
  const ParamInfo* wte0 = l[0].find("wte.weight");
  const ParamInfo* wte1 = l[1].find("wte.weight");
  for (int64_t i = 0; i < wte0->numel; ++i) {
    const float sum = out.grads[0][size_t(wte0->offset + i)] + out.grads[1][size_t(wte1->offset + i)];
    out.grads[0][size_t(wte0->offset + i)] = out.grads[1][size_t(wte1->offset + i)] = sum;
  }
  if (d[0].sequence_parallel)
    for (int s = 0; s < 2; ++s)
      for (const ParamInfo& p : l[s].params)
        if (p.group.copy == ModelCopy::TensorParallel) tp.all_reduce(out.grads[s].data() + p.offset, p.numel, ReduceOp::Sum);
  return out;
}

// max |got - want| <= rtol * (|want| + 5% of the largest |want|): the floor is rounding noise of the
// largest values summed in another order (TP 1 vs TP 4 with sequence parallelism); at 1% the clang
// sanitizer build's stage output had one element of 0.0067 off by 7.2e-7 (scale 5.0, 1.4e-7 of it)
int count_off(const VecF& got, const VecF& want, double rtol) {
  double scale = 0;
  for (float w : want) scale = std::max(scale, double(std::fabs(w)));
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::fabs(double(got[i]) - want[i]) > rtol * (std::fabs(want[i]) + 0.05 * scale) + 1e-30) ++bad;
  return bad;
}

struct SpCase {
  int tp;
  int micro_batch;
  bool position_ids;
  Recompute recompute;
};

void check_two_stages(const SpCase& c) {
  const std::string where = "TP " + std::to_string(c.tp) + " micro-batch " + std::to_string(c.micro_batch) +
                            (c.position_ids ? " reset_position_ids" : "") + " recompute " +
                            std::to_string(int(c.recompute));
  SCOPED_TRACE(where);
  // 2 layers, hidden 16, 4 heads, seq 8, vocab 37; N = micro_batch * 8 tokens
  Config cfg = test::tiny_gpt_config({.heads = 4, .micro_batch = c.micro_batch});
  cfg.data.reset_position_ids = c.position_ids;
  const int64_t S = cfg.model.seq_length, N = c.micro_batch * S;

  // the full parameters, large enough that every gradient is well above rounding
  const GPTDims d1 = make_dims(cfg, 1, 0, 1, 0);
  const ParamLayout l1 = make_param_layout(d1);
  VecF full(size_t(l1.total), 0.0f);
  std::mt19937 gen(77);
  std::normal_distribution<float> nd;
  for (const ParamInfo& p : l1.params)
    for (int64_t i = 0; i < p.numel; ++i)
      full[size_t(p.offset + i)] = p.init == ParamInfo::Init::Normal ? 0.3f * nd(gen)
                                   : p.init == ParamInfo::Init::Ones ? 1.0f + 0.2f * nd(gen)
                                                                      : 0.1f * nd(gen);
  std::vector<int32_t> tokens(static_cast<size_t>(N)), targets(static_cast<size_t>(N)), positions(static_cast<size_t>(N));
  std::uniform_int_distribution<int32_t> tok(0, 36);
  for (int64_t i = 0; i < N; ++i) {
    tokens[size_t(i)] = tok(gen), targets[size_t(i)] = tok(gen);
    positions[size_t(i)] = int32_t(i % S < 3 ? i % S : i % S - 3);  // a document starting at position 3
  }

  // reference: TP 1 (no sequence parallelism), the same two stages
  Config ref_cfg = cfg;
  auto self = make_self_comm();
  const TwoStageRun ref = run_two_stages(ref_cfg, *self, 0, full, l1, tokens, targets, positions, Recompute::None);
  ASSERT_GT(ref.loss, 0.0);

  cfg.parallel.tensor_model_parallel_size = c.tp;
  cfg.parallel.pipeline_model_parallel_size = 2;
  cfg.parallel.sequence_parallel = true;
  Failures fail;
  run_thread_ranks(c.tp, 1, 1, false, [&](Grid& g) {
    const int r = g.tp_rank;
    const TwoStageRun got = run_two_stages(cfg, *g.tp_group, r, full, l1, tokens, targets, positions, c.recompute);
    const std::string rank = " on TP rank " + std::to_string(r);
    if (std::fabs(got.loss - ref.loss) > 1e-5 * ref.loss)
      fail.add(where + ": loss " + std::to_string(got.loss) + " != " + std::to_string(ref.loss) + rank);
    // this rank's rows [r N/tp, (r+1) N/tp) of the TP 1 stage output and input gradient
    const int64_t C = cfg.model.hidden_size, Nt = N / c.tp;
    if (int64_t(got.output.size()) != Nt * C) return fail.add(where + ": output is not (N/tp, C)" + rank);
    const VecF want_out(ref.output.begin() + r * Nt * C, ref.output.begin() + (r + 1) * Nt * C);
    const VecF want_dx(ref.input_grad.begin() + r * Nt * C, ref.input_grad.begin() + (r + 1) * Nt * C);
    if (int bad = count_off(got.output, want_out, 1e-5)) fail.add(where + ": stage output off in " + std::to_string(bad) + rank);
    if (int bad = count_off(got.input_grad, want_dx, 1e-4))
      fail.add(where + ": stage input gradient off in " + std::to_string(bad) + rank);
    // every gradient: this rank's box of the TP 1 gradient
    for (int s = 0; s < 2; ++s) {
      const GPTDims ds = make_dims(cfg, c.tp, r, 2, s);
      const ParamLayout ls = make_param_layout(ds);
      const ParamLayout lref = make_param_layout(make_dims(ref_cfg, 1, 0, 2, s));
      for (const ParamInfo& p : ls.params) {
        const ParamInfo* f = lref.find(p.name);
        const ParamInfo* pf = l1.find(p.name);
        if (!f || !pf) {
          fail.add(where + ": no " + p.name + " in the reference");
          continue;
        }
        VecF mine, want;
        test::for_each_box_element(p, [&](int64_t local, int64_t global) {
          mine.push_back(got.grads[s][size_t(p.offset + local)]);
          want.push_back(ref.grads[s][size_t(f->offset + global)]);
        });
        if (int bad = count_off(mine, want, 1e-4))
          fail.add(where + ": gradient of " + p.name + " (stage " + std::to_string(s) + ") off in " +
                   std::to_string(bad) + " of " + std::to_string(want.size()) + rank);
      }
    }
  });
  EXPECT_EQ(fail.count, 0);
}

// Blocks of N/tp tokens: TP 2 x 3 sequences of 8 (12 tokens: a whole sequence and half of the next),
// TP 4 x 3 (6: the end of one sequence and the start of the next), TP 4 x 1 (2: inside one).
TEST(SequenceParallel, TwoStageGptMatchesTp1) {
  for (const SpCase& c : {SpCase{2, 3, false, Recompute::None}, SpCase{4, 3, false, Recompute::None},
                          SpCase{4, 1, false, Recompute::None}, SpCase{2, 2, false, Recompute::None}})
    check_two_stages(c);
}

TEST(SequenceParallel, TwoStageGptMatchesTp1WithPositionIdsAndRecompute) {
  for (const SpCase& c : {SpCase{2, 3, true, Recompute::None}, SpCase{4, 3, true, Recompute::Selective},
                          SpCase{2, 3, false, Recompute::Full}, SpCase{4, 3, false, Recompute::Selective}})
    check_two_stages(c);
}

// The token blocks of the TP ranks tile the micro-batch in rank order (no token twice, none
// missing), and pipeline messages are one block; TP 1 splits nothing.
TEST(SequenceParallel, LocalTokensTileTheMicroBatch) {
  Config cfg = test::tiny_gpt_config({.heads = 4, .micro_batch = 3});
  cfg.parallel.sequence_parallel = true;
  for (int T : {2, 4}) {
    int64_t next = 0;
    for (int r = 0; r < T; ++r) {
      const GPTDims d = make_dims(cfg, T, r, 1, 0);
      EXPECT_TRUE(d.sequence_parallel);
      EXPECT_EQ(d.local_token_begin(24), next);
      EXPECT_EQ(d.local_tokens(24), 24 / T);
      EXPECT_EQ(stage_message_elements(d, 3), 24 / T * d.C);
      next += d.local_tokens(24);
    }
    EXPECT_EQ(next, 24);
  }
  const GPTDims one = make_dims(cfg, 1, 0, 1, 0);  // TP 1: nothing to split
  EXPECT_FALSE(one.sequence_parallel);
  EXPECT_EQ(one.local_tokens(24), 24);
}

}  // namespace
}  // namespace tpt
