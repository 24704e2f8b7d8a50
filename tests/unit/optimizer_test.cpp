// The LR schedule against hand-computed values, the counting rules of local_grad_sum_squares
// (each global element once: TP-replicated tensors on tp_rank 0 only, the tied copy never), and
// AdamW::step against the per-element update with the right decay flags and bias corrections.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "tests/common/tiny_config.h"
#include "core/ops.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "tests/common/box_elements.h"

namespace tpt {
namespace {

OptimizerConfig schedule(LrDecayStyle style, int64_t warmup, int64_t decay_iters) {
  OptimizerConfig o;
  o.lr = 1e-3;
  o.min_lr = 1e-4;
  o.lr_warmup_iters = warmup;
  o.lr_decay_style = style;
  o.lr_decay_iters = decay_iters;
  return o;
}

TEST(OptimizerLR, WarmupThenCosine) {
  const OptimizerConfig o = schedule(LrDecayStyle::Cosine, 10, 110);
  EXPECT_DOUBLE_EQ(learning_rate(o, 0), 0.0);
  EXPECT_DOUBLE_EQ(learning_rate(o, 1), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(o, 5), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(o, 10), 1e-3);
  // ratio (k - 10) / 100; lr = min + 0.5 (cos(pi ratio) + 1) (max - min)
  EXPECT_NEAR(learning_rate(o, 11), 1e-4 + 0.5 * (std::cos(M_PI * 0.01) + 1) * 9e-4, 1e-15);
  EXPECT_NEAR(learning_rate(o, 35), 1e-4 + 0.8535533905932737 * 9e-4, 1e-15);  // ratio 1/4
  EXPECT_NEAR(learning_rate(o, 60), 5.5e-4, 1e-15);                            // ratio 1/2
  EXPECT_NEAR(learning_rate(o, 85), 1e-4 + 0.14644660940672624 * 9e-4, 1e-15); // ratio 3/4
  EXPECT_NEAR(learning_rate(o, 110), 1e-4, 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(o, 111), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(o, 100000), 1e-4);
  // monotone after warmup
  for (int64_t k = 11; k <= 120; ++k) EXPECT_LE(learning_rate(o, k), learning_rate(o, k - 1) + 1e-18) << k;
}

TEST(OptimizerLR, WarmupThenLinear) {
  const OptimizerConfig o = schedule(LrDecayStyle::Linear, 10, 110);
  EXPECT_DOUBLE_EQ(learning_rate(o, 3), 3e-4);
  EXPECT_DOUBLE_EQ(learning_rate(o, 10), 1e-3);
  EXPECT_NEAR(learning_rate(o, 35), 1e-4 + 0.75 * 9e-4, 1e-15);
  EXPECT_NEAR(learning_rate(o, 60), 5.5e-4, 1e-15);
  EXPECT_NEAR(learning_rate(o, 100), 1e-4 + 0.1 * 9e-4, 1e-15);
  EXPECT_NEAR(learning_rate(o, 110), 1e-4, 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(o, 500), 1e-4);
}

TEST(OptimizerLR, WarmupThenConstant) {
  const OptimizerConfig o = schedule(LrDecayStyle::Constant, 4, 20);
  EXPECT_DOUBLE_EQ(learning_rate(o, 1), 2.5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(o, 2), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(o, 4), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(o, 5), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(o, 19), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(o, 20), 1e-3);
}

TEST(OptimizerLR, NoWarmup) {
  const OptimizerConfig o = schedule(LrDecayStyle::Cosine, 0, 100);
  EXPECT_DOUBLE_EQ(learning_rate(o, 0), 1e-3);
  EXPECT_NEAR(learning_rate(o, 1), 1e-4 + 0.5 * (std::cos(M_PI * 0.01) + 1) * 9e-4, 1e-15);
  EXPECT_NEAR(learning_rate(o, 50), 5.5e-4, 1e-15);
  EXPECT_NEAR(learning_rate(o, 100), 1e-4, 1e-15);
  const OptimizerConfig lin = schedule(LrDecayStyle::Linear, 0, 100);
  EXPECT_NEAR(learning_rate(lin, 20), 1e-4 + 0.8 * 9e-4, 1e-15);
  const OptimizerConfig c = schedule(LrDecayStyle::Constant, 0, 100);
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(c, 77), 1e-3);
}

// Decay shorter than the warmup: warmup, then min_lr straight away.
TEST(OptimizerLR, DecayEndsBeforeWarmup) {
  const OptimizerConfig o = schedule(LrDecayStyle::Cosine, 10, 10);
  EXPECT_DOUBLE_EQ(learning_rate(o, 10), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(o, 11), 1e-4);
}

// ------------------------------------------------------------------------------------------------

Config tiny_config() { return test::tiny_gpt_config(); }

// Each tensor filled with a constant of its own, the alignment gaps between tensors with garbage.
std::vector<float> constant_grads(const ParamLayout& l) {
  std::vector<float> g(size_t(l.total), 1000.0f);
  for (size_t i = 0; i < l.params.size(); ++i) {
    const ParamInfo& p = l.params[i];
    std::fill(g.begin() + p.offset, g.begin() + p.offset + p.numel, 0.5f + 0.25f * float(i));
  }
  return g;
}

TEST(OptimizerNorm, LocalSumSquaresCountingRules) {
  const Config c = tiny_config();
  auto ops = make_cpu_ops(1);
  for (int tp : {1, 2})
    for (int pp : {1, 2})
      for (int s = 0; s < pp; ++s)
        for (int r = 0; r < tp; ++r) {
          SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(r) + " pp " + std::to_string(pp) +
                       " stage " + std::to_string(s));
          const ParamLayout l = make_param_layout(make_dims(c, tp, r, pp, s));
          const std::vector<float> g = constant_grads(l);
          double want = 0;
          int tied = 0;
          for (size_t i = 0; i < l.params.size(); ++i) {
            const ParamInfo& p = l.params[i];
            tied += p.group.copy == ModelCopy::TiedEmbedding && s != 0;
            if ((p.group.copy == ModelCopy::TiedEmbedding && s != 0) ||
                (p.group.copy == ModelCopy::TensorParallel && r != 0))
              continue;
            const double v = 0.5 + 0.25 * double(i);
            want += v * v * double(p.numel);
          }
          EXPECT_EQ(tied, pp > 1 && s == pp - 1 ? 1 : 0);
          EXPECT_DOUBLE_EQ(local_grad_sum_squares(l, *ops, g.data()), want);
        }
}

// Sharded TP = 2 / PP = 2 gradients of one full gradient: the local sums over all ranks add up to the
// TP = 1 PP = 1 sum (every global element counted exactly once).
TEST(OptimizerNorm, ShardSumsAddUpToTheFullModel) {
  const Config c = tiny_config();
  auto ops = make_cpu_ops(1);
  const ParamLayout full = make_param_layout(make_dims(c, 1, 0, 1, 0));
  std::vector<float> gfull(size_t(full.total), 0.0f);
  std::mt19937 gen(11);
  std::normal_distribution<float> nd;
  for (const ParamInfo& p : full.params) {
    int64_t box = 1;
    for (int64_t s : p.box_size) box *= s;
    for (int64_t i = 0; i < box; ++i) gfull[size_t(p.offset + i)] = nd(gen);  // padded rows stay 0
  }
  const double want = local_grad_sum_squares(full, *ops, gfull.data());
  const int tp = 2, pp = 2;
  double total = 0;
  for (int s = 0; s < pp; ++s)
    for (int r = 0; r < tp; ++r) {
      const ParamLayout l = make_param_layout(make_dims(c, tp, r, pp, s));
      std::vector<float> g(size_t(l.total), 0.0f);
      for (const ParamInfo& p : l.params) {
        const ParamInfo* f = full.find(p.name);
        ASSERT_NE(f, nullptr);
        test::for_each_box_element(p, [&](int64_t local, int64_t global) {
          g[size_t(p.offset + local)] = gfull[size_t(f->offset + global)];
        });
      }
      total += local_grad_sum_squares(l, *ops, g.data());
    }
  EXPECT_NEAR(total, want, 1e-9 * want);
}

// ------------------------------------------------------------------------------------------------

TEST(OptimizerAdamW, StepMatchesPerElementUpdateWithDecayFlags) {
  const Config c = tiny_config();
  auto ops = make_cpu_ops(2);
  const ParamLayout l = make_param_layout(make_dims(c, 1, 0, 1, 0));
  std::vector<float> p(size_t(l.total)), g(size_t(l.total));
  std::mt19937 gen(5);
  std::normal_distribution<float> nd;
  for (float& x : p) x = nd(gen);
  std::vector<float> ref = p, m(p.size(), 0.0f), v(p.size(), 0.0f);
  OptimizerConfig o;
  o.weight_decay = 0.3;
  o.adam_beta1 = 0.8;
  o.adam_beta2 = 0.9;
  o.adam_eps = 1e-6;
  AdamW opt(l, *ops, p.data(), g.data());
  for (int64_t step = 1; step <= 3; ++step) {
    for (float& x : g) x = nd(gen);
    const double lr = 0.01 * double(step);
    opt.step(o, lr, step);
    AdamWParams a{float(lr), 0.8f, 0.9f, 1e-6f, 0.3f, float(1 - std::pow(0.8, double(step))),
                  float(1 - std::pow(0.9, double(step))), float(1.0 - 0.8), float(1.0 - 0.9)};
    for (const ParamInfo& info : l.params)
      for (int64_t i = info.offset; i < info.offset + info.numel; ++i)
        adamw_update(ref[size_t(i)], g[size_t(i)], m[size_t(i)], v[size_t(i)], a, info.weight_decay);
    for (const ParamInfo& info : l.params)
      for (int64_t i = info.offset; i < info.offset + info.numel; ++i)
        ASSERT_NEAR(p[size_t(i)], ref[size_t(i)], 1e-6 * (1 + std::fabs(ref[size_t(i)])))
            << info.name << " step " << step;
  }
  // Biases and LayerNorm: no decay. With a zero gradient from a fresh state they must not move.
  std::vector<float> p2(size_t(l.total), 2.0f), g2(size_t(l.total), 0.0f);
  AdamW fresh(l, *ops, p2.data(), g2.data());
  fresh.step(o, 0.1, 1);
  for (const ParamInfo& info : l.params) {
    const float want = info.weight_decay ? 2.0f * (1.0f - 0.1f * 0.3f) : 2.0f;
    EXPECT_FLOAT_EQ(p2[size_t(info.offset)], want) << info.name;
  }
}

// The clip folded into the update (AdamW::step's grad_scale) moves the weights, moments and compute
// copy bit for bit as the gradients scaled in their buffer first (Ops::scale) did; the buffer stays.
TEST(OptimizerAdamW, FoldedClipIsBitwiseTheScaledGradients) {
  const Config c = tiny_config();
  auto ops = make_cpu_ops(2);
  const ParamLayout l = make_param_layout(make_dims(c, 1, 0, 1, 0));
  std::mt19937 gen(9);
  std::normal_distribution<float> nd;
  std::vector<float> p(size_t(l.total)), g(size_t(l.total));
  for (float& x : p) x = nd(gen);
  for (float& x : g) x = nd(gen);
  std::vector<float> p2 = p, g2 = g, copy(p.size()), copy2(p.size());
  const std::vector<float> g_before = g;
  OptimizerConfig o;
  o.weight_decay = 0.1;
  AdamW folded(l, *ops, p.data(), g.data(), Buf(copy.data(), DType::F32));
  AdamW scaled(l, *ops, p2.data(), g2.data(), Buf(copy2.data(), DType::F32));
  const float clip = float(1.0 / (3.7 + 1e-6));
  for (int64_t step = 1; step <= 2; ++step) {
    folded.step(o, 1e-3, step, clip);
    ops->scale(g2.data(), clip, l.total);
    scaled.step(o, 1e-3, step);
    g2 = g;
  }
  EXPECT_EQ(std::memcmp(p.data(), p2.data(), p.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(copy.data(), copy2.data(), p.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(folded.exp_avg_sq().p, scaled.exp_avg_sq().p, p.size() * sizeof(float)), 0);
  EXPECT_EQ(g, g_before);
}

// One reduction gives the norm and the nan/inf check: a nan in a tensor the norm does not count
// (TP-replicated on tp_rank 1) is still found, and leaves the norm as it was.
TEST(OptimizerNorm, GradStatsSeesNanOutsideTheNorm) {
  const Config c = tiny_config();
  auto ops = make_cpu_ops(1);
  const ParamLayout l = make_param_layout(make_dims(c, 2, 1, 1, 0));
  std::vector<float> g = constant_grads(l);
  const std::vector<ShardRange> all = {{0, l.total, 0}};
  const std::vector<TensorSegment> segs = grad_norm_segments(l, all, {{0, l.total}});
  const GradStats clean = ops->grad_stats(g.data(), segs);
  EXPECT_FALSE(clean.nonfinite);
  EXPECT_DOUBLE_EQ(clean.sum_squares, local_grad_sum_squares(l, *ops, g.data()));
  const ParamInfo* replicated = nullptr;
  for (const ParamInfo& p : l.params)
    if (p.group.copy == ModelCopy::TensorParallel) replicated = &p;
  ASSERT_NE(replicated, nullptr);
  g[size_t(replicated->offset)] = std::numeric_limits<float>::quiet_NaN();
  const GradStats bad = ops->grad_stats(g.data(), segs);
  EXPECT_TRUE(bad.nonfinite);
  EXPECT_DOUBLE_EQ(bad.sum_squares, clean.sum_squares);
}

}  // namespace
}  // namespace tpt
