// Tensor parallelism on 2 or 4 MPI ranks against the single-rank computation on the same full
// weights (every rank computes the TP = 1 reference locally): column-parallel linear with and
// without gather_output, row-parallel linear with reduce_from_tp_region, the Megatron MLP pair, a
// whole GPT stage (forward, loss, backward) at TP = 2 and TP = 4, and two pipeline stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "tests/common/tiny_config.h"
#include "core/ops.h"
#include "model/gpt.h"
#include "parallel/runtime.h"
#include "parallel/tensor_parallel.h"
#include "tests/common/box_elements.h"

namespace tpt {
namespace {

using VecF = std::vector<float>;

Ops& cpu() {
  static std::unique_ptr<Ops> ops = make_cpu_ops(1);
  return *ops;
}

// The same numbers on every rank.
VecF randn(size_t n, uint32_t seed, float std = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, std);
  VecF v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// Columns [c0, c0 + w) of a row-major (rows, cols) matrix.
VecF columns(const VecF& m, int64_t rows, int64_t cols, int64_t c0, int64_t w) {
  VecF out(size_t(rows * w));
  for (int64_t r = 0; r < rows; ++r) std::copy_n(m.begin() + r * cols + c0, w, out.begin() + r * w);
  return out;
}

// max |got - want| <= rtol * max |want|, and elementwise within rtol of |want| plus 1% of that scale.
void expect_close(const VecF& got, const VecF& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float w : want) scale = std::max(scale, double(std::fabs(w)));
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = rtol * (std::fabs(want[i]) + 0.01 * scale) + 1e-30;
    if (std::fabs(double(got[i]) - want[i]) > tol && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " off";
}

// The TP layouts the world allows with PP = 1: TP = world, and TP = 2 x DP = 2 on 4 ranks.
std::vector<std::pair<int, int>> tp_layouts() {
  const int world = runtime_world_size();
  std::vector<std::pair<int, int>> out = {{world, 1}};
  if (world == 4) out.push_back({2, 2});
  return out;
}

// ------------------------------------------------------------------------------------------------
// linear layers

TEST(MpiTensorParallel, ColumnParallelLinear) {
  for (auto [tp, dp] : tp_layouts()) {
    SCOPED_TRACE("TP " + std::to_string(tp) + " DP " + std::to_string(dp));
    Grid g = make_grid(tp, 1, dp);
    Comm& c = *g.tp_group;
    const int r = g.tp_rank;
    const int64_t N = 6, I = 5, Ol = 3, O = Ol * tp;
    const VecF x = randn(N * I, 1), w = randn(O * I, 2), b = randn(O, 3), dy = randn(N * O, 4);
    // the single-rank reference
    VecF y(N * O), dx(N * I), dw(O * I), db(O);
    cpu().linear_forward(y.data(), x.data(), w.data(), b.data(), N, I, O);
    cpu().linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, I, O, false);
    // this rank's output rows of the weight
    const VecF wl(w.begin() + r * Ol * I, w.begin() + (r + 1) * Ol * I), bl(b.begin() + r * Ol, b.begin() + (r + 1) * Ol);
    const VecF dw_mine(dw.begin() + r * Ol * I, dw.begin() + (r + 1) * Ol * I), db_mine(db.begin() + r * Ol, db.begin() + (r + 1) * Ol);

    for (bool gather : {true, false}) {
      SCOPED_TRACE(gather ? "gather_output" : "no gather_output");
      VecF yl(N * Ol);
      cpu().linear_forward(yl.data(), x.data(), wl.data(), bl.data(), N, I, Ol);
      VecF dyl(N * Ol);
      if (gather) {
        VecF full(N * O, -1.0f), scratch(N * O);
        gather_from_tp_region_forward(cpu(), c, full.data(), yl.data(), scratch.data(), N, Ol);
        expect_close(full, y, 1e-5, "gathered output");
        gather_from_tp_region_backward(cpu(), c, dyl.data(), dy.data(), N, Ol);
        EXPECT_EQ(dyl, columns(dy, N, O, r * Ol, Ol)) << "split backward";
      } else {
        expect_close(yl, columns(y, N, O, r * Ol, Ol), 1e-5, "local output columns");
        dyl = columns(dy, N, O, r * Ol, Ol);
      }
      VecF dxl(N * I, 9.0f), dwl(Ol * I), dbl(Ol);
      cpu().linear_backward(dxl.data(), dwl.data(), dbl.data(), dyl.data(), x.data(), wl.data(), N, I, Ol, false);
      copy_to_tp_region_backward(c, dxl.data(), N * I);  // f backward: the input gradient summed over TP
      expect_close(dxl, dx, 1e-5, "input gradient");
      expect_close(dwl, dw_mine, 1e-5, "weight gradient rows");
      expect_close(dbl, db_mine, 1e-5, "bias gradient");
    }
  }
}

TEST(MpiTensorParallel, RowParallelLinear) {
  for (auto [tp, dp] : tp_layouts()) {
    SCOPED_TRACE("TP " + std::to_string(tp) + " DP " + std::to_string(dp));
    Grid g = make_grid(tp, 1, dp);
    Comm& c = *g.tp_group;
    const int r = g.tp_rank;
    const int64_t N = 6, Il = 3, I = Il * tp, O = 5;
    const VecF x = randn(N * I, 11), w = randn(O * I, 12), b = randn(O, 13), dy = randn(N * O, 14);
    VecF y(N * O), dx(N * I), dw(O * I), db(O);
    cpu().linear_forward(y.data(), x.data(), w.data(), b.data(), N, I, O);
    cpu().linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, I, O, false);
    // this rank: input columns [r Il, (r+1) Il) of the weight and of the (already split) input
    const VecF wl = columns(w, O, I, r * Il, Il), xl = columns(x, N, I, r * Il, Il);
    VecF yl(N * O);
    cpu().linear_forward(yl.data(), xl.data(), wl.data(), r == 0 ? b.data() : nullptr, N, Il, O);  // bias once
    reduce_from_tp_region_forward(c, yl.data(), N * O);
    expect_close(yl, y, 1e-5, "reduced output");
    VecF dxl(N * Il), dwl(O * Il), dbl(O);
    cpu().linear_backward(dxl.data(), dwl.data(), dbl.data(), dy.data(), xl.data(), wl.data(), N, Il, O, false);
    expect_close(dxl, columns(dx, N, I, r * Il, Il), 1e-5, "input gradient columns");
    expect_close(dwl, columns(dw, O, I, r * Il, Il), 1e-5, "weight gradient columns");
    expect_close(dbl, db, 1e-5, "replicated bias gradient");
  }
}

// Column-parallel fc1 -> GELU -> row-parallel fc2, f before and g after: Megatron's MLP.
TEST(MpiTensorParallel, ColumnThenRowParallelMlp) {
  for (auto [tp, dp] : tp_layouts()) {
    SCOPED_TRACE("TP " + std::to_string(tp) + " DP " + std::to_string(dp));
    Grid g = make_grid(tp, 1, dp);
    Comm& c = *g.tp_group;
    const int r = g.tp_rank;
    const int64_t N = 4, C = 6, Fl = 4, F = Fl * tp;
    const VecF x = randn(N * C, 21), w1 = randn(F * C, 22), b1 = randn(F, 23), w2 = randn(C * F, 24),
               b2 = randn(C, 25), dy = randn(N * C, 26);
    // reference
    VecF h(N * F), a(N * F), y(N * C), da(N * F), dh(N * F), dx(N * C), dw1(F * C), db1(F), dw2(C * F), db2(C);
    cpu().linear_forward(h.data(), x.data(), w1.data(), b1.data(), N, C, F);
    cpu().gelu_forward(a.data(), h.data(), N * F);
    cpu().linear_forward(y.data(), a.data(), w2.data(), b2.data(), N, F, C);
    cpu().linear_backward(da.data(), dw2.data(), db2.data(), dy.data(), a.data(), w2.data(), N, F, C, false);
    cpu().gelu_backward(dh.data(), da.data(), h.data(), N * F);
    cpu().linear_backward(dx.data(), dw1.data(), db1.data(), dh.data(), x.data(), w1.data(), N, C, F, false);
    // parallel
    const VecF w1l(w1.begin() + r * Fl * C, w1.begin() + (r + 1) * Fl * C), b1l(b1.begin() + r * Fl, b1.begin() + (r + 1) * Fl);
    const VecF w2l = columns(w2, C, F, r * Fl, Fl);
    VecF hl(N * Fl), al(N * Fl), yl(N * C), dal(N * Fl), dhl(N * Fl), dxl(N * C), dw1l(Fl * C), db1l(Fl), dw2l(C * Fl), db2l(C);
    cpu().linear_forward(hl.data(), x.data(), w1l.data(), b1l.data(), N, C, Fl);
    cpu().gelu_forward(al.data(), hl.data(), N * Fl);
    cpu().linear_forward(yl.data(), al.data(), w2l.data(), r == 0 ? b2.data() : nullptr, N, Fl, C);
    reduce_from_tp_region_forward(c, yl.data(), N * C);
    expect_close(yl, y, 1e-5, "MLP output");
    cpu().linear_backward(dal.data(), dw2l.data(), db2l.data(), dy.data(), al.data(), w2l.data(), N, Fl, C, false);
    cpu().gelu_backward(dhl.data(), dal.data(), hl.data(), N * Fl);
    cpu().linear_backward(dxl.data(), dw1l.data(), db1l.data(), dhl.data(), x.data(), w1l.data(), N, C, Fl, false);
    copy_to_tp_region_backward(c, dxl.data(), N * C);
    expect_close(dxl, dx, 1e-5, "MLP input gradient");
    expect_close(dw1l, VecF(dw1.begin() + r * Fl * C, dw1.begin() + (r + 1) * Fl * C), 1e-5, "fc1 weight gradient");
    expect_close(db1l, VecF(db1.begin() + r * Fl, db1.begin() + (r + 1) * Fl), 1e-5, "fc1 bias gradient");
    expect_close(dw2l, columns(dw2, C, F, r * Fl, Fl), 1e-5, "fc2 weight gradient");
    expect_close(db2l, db2, 1e-5, "fc2 bias gradient");
  }
}

// ------------------------------------------------------------------------------------------------
// the whole GPT stage

// 2 layers, hidden 16, 4 heads, seq 8, vocab 37: padded to 40 at TP 1, 48 at TP 2, 64 at TP 4 (where
// the last rank holds nothing but padding rows).
Config tiny_config() { return test::tiny_gpt_config({.heads = 4}); }

struct StageRun {
  double loss = 0;
  VecF grads;
};

// forward + loss + backward of one micro-batch through the pipeline (PP = 1: one stage); the mean
// loss (on every rank) and d mean loss / d params of this rank's shard, the tied word embedding's
// gradient summed over the embedding group as the trainer does.
StageRun run_pipeline(const GPTDims& d, const ParamLayout& l, Comm& tp, Comm* pp, Comm* embedding,
                      VecF& params, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                      int64_t B) {
  StageRun out;
  out.grads.assign(size_t(l.total), 0.0f);
  GPTStage stage(d, l, cpu(), tp, params.data(), out.grads.data(), B, 1);
  const int64_t N = B * d.S, NC = N * d.C;
  const int s = d.pp_rank;
  VecF buf(static_cast<size_t>(NC));
  if (d.first_stage()) {
    stage.forward(0, tokens.data(), nullptr);
  } else {
    pp->send_recv(nullptr, 0, 0, buf.data(), NC, s - 1);
    stage.forward(0, nullptr, buf.data());
  }
  if (!d.last_stage()) pp->send_recv(stage.output(0).f32(), NC, s + 1, nullptr, 0, 0);
  if (d.last_stage()) {
    out.loss = stage.loss(0, targets.data(), 1.0f / float(N), true) / double(N);
    stage.backward(0, nullptr);
  } else {
    pp->send_recv(nullptr, 0, 0, buf.data(), NC, s + 1);
    stage.backward(0, buf.data());
  }
  if (!d.first_stage()) pp->send_recv(stage.input_grad().f32(), NC, s - 1, nullptr, 0, 0);
  if (pp) pp->all_reduce(&out.loss, 1, ReduceOp::Sum);  // only the last stage's is nonzero
  if (embedding) {
    const ParamInfo* wte = l.find("wte.weight");
    embedding->all_reduce(out.grads.data() + wte->offset, wte->numel, ReduceOp::Sum);
  }
  return out;
}

void check_gpt(int tp, int pp, int dp, bool randomize) {
  SCOPED_TRACE("TP " + std::to_string(tp) + " PP " + std::to_string(pp) + " DP " + std::to_string(dp) +
               (randomize ? " random weights" : " init weights"));
  const Config cfg = tiny_config();
  Grid g = make_grid(tp, pp, dp);
  const int64_t B = cfg.training.micro_batch_size;

  // The full (TP = 1) parameters, the same on every rank.
  const GPTDims d1 = make_dims(cfg, 1, 0, 1, 0);
  const ParamLayout l1 = make_param_layout(d1);
  VecF p1(size_t(l1.total), 0.0f);
  init_params_host(l1, 1234, p1.data());
  if (randomize) {  // weights large enough that every gradient is well above rounding
    std::mt19937 gen(77);
    std::normal_distribution<float> nd;
    for (const ParamInfo& p : l1.params)
      for (int64_t i = 0; i < p.numel; ++i) {
        float& x = p1[size_t(p.offset + i)];
        x = p.init == ParamInfo::Init::Normal ? 0.3f * nd(gen)
            : p.init == ParamInfo::Init::Ones ? 1.0f + 0.2f * nd(gen)
                                                : 0.1f * nd(gen);
      }
  }
  const int64_t N = B * d1.S;
  std::vector<int32_t> tokens(static_cast<size_t>(N)), targets(static_cast<size_t>(N));
  std::mt19937 gen(5);
  std::uniform_int_distribution<int32_t> tok(0, 36);
  for (int64_t i = 0; i < N; ++i) tokens[size_t(i)] = tok(gen), targets[size_t(i)] = tok(gen);
  tokens[1] = tokens[9] = 36;
  tokens[2] = 0;
  targets[3] = 36;
  targets[4] = 0;
  targets[12] = 24;  // the first id of TP rank 1's shard at TP = 2

  auto self = make_self_comm();
  const StageRun ref = run_pipeline(d1, l1, *self, nullptr, nullptr, p1, tokens, targets, B);

  // This rank's shard: boxes copied from the full parameters; the padded word-embedding rows hold
  // garbage (masked: they must not matter).
  const GPTDims dn = make_dims(cfg, tp, g.tp_rank, pp, g.pp_rank);
  const ParamLayout ln = make_param_layout(dn);
  VecF pn(size_t(ln.total), 0.0f);
  for (const ParamInfo& p : ln.params) {
    const ParamInfo* f = l1.find(p.name);
    ASSERT_NE(f, nullptr) << p.name;
    std::fill(pn.begin() + p.offset, pn.begin() + p.offset + p.numel, 50.0f);
    test::for_each_box_element(p, [&](int64_t local, int64_t global) { pn[size_t(p.offset + local)] = p1[size_t(f->offset + global)]; });
  }
  const StageRun got = run_pipeline(dn, ln, *g.tp_group, pp > 1 ? g.pp_group.get() : nullptr,
                                    g.embedding_group.get(), pn, tokens, targets, B);

  EXPECT_NEAR(got.loss, ref.loss, 1e-5 * ref.loss) << "loss";
  if (!randomize) {
    EXPECT_NEAR(ref.loss, std::log(37.0), 0.02);
  }
  for (const ParamInfo& p : ln.params) {
    SCOPED_TRACE(p.name);
    const ParamInfo* f = l1.find(p.name);
    VecF mine, want;
    test::for_each_box_element(p, [&](int64_t local, int64_t global) {
      mine.push_back(got.grads[size_t(p.offset + local)]);
      want.push_back(ref.grads[size_t(f->offset + global)]);
    });
    if (!want.empty()) {
      expect_close(mine, want, 1e-4, "gradient box");
    }
    if (p.name == "wte.weight") {
      for (int64_t row = p.box_size[0]; row < p.local_shape[0]; ++row)
        for (int64_t c = 0; c < dn.C; ++c)
          ASSERT_EQ(got.grads[size_t(p.offset + row * dn.C + c)], 0.0f) << "padded row " << row;
    }
    if (p.group.copy == ModelCopy::TensorParallel) {  // identical on every TP rank, bit for bit
      VecF root(got.grads.begin() + p.offset, got.grads.begin() + p.offset + p.numel);
      g.tp_group->broadcast(root.data(), p.numel, 0);
      EXPECT_EQ(std::memcmp(root.data(), got.grads.data() + p.offset, size_t(p.numel) * sizeof(float)), 0)
          << "replicated gradient differs from TP rank 0's on TP rank " << g.tp_rank;
    }
  }
}

TEST(MpiTensorParallel, GptStageMatchesSingleRankRandomWeights) {
  for (auto [tp, dp] : tp_layouts()) check_gpt(tp, 1, dp, true);
}

TEST(MpiTensorParallel, GptStageMatchesSingleRankInitWeights) {
  for (auto [tp, dp] : tp_layouts()) check_gpt(tp, 1, dp, false);
}

// Two pipeline stages (TP = 1 on 2 ranks; TP = 2 x PP = 2 on 4 ranks): hidden states and their
// gradients over the PP group, the tied word embedding summed over the embedding group.
TEST(MpiTensorParallel, GptPipelineMatchesSingleRank) {
  const int world = runtime_world_size();
  const int tp = world / 2;
  check_gpt(tp, 2, 1, true);
  check_gpt(tp, 2, 1, false);
}

}  // namespace
}  // namespace tpt
