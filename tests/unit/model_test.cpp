// The whole GPT stage on one rank (TP = PP = 1): gradient of the mean loss against finite
// differences for elements of every parameter tensor, the loss at init, padding that never changes
// a loss or a gradient, micro-batch slots, and the parameter layout and its init (deterministic,
// padded rows zero, TP/PP shards that stitch back into the TP = 1 parameters bit for bit).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "tests/common/tiny_config.h"
#include "core/ops.h"
#include "model/gpt.h"
#include "parallel/comm.h"
#include "tests/common/box_elements.h"

namespace tpt {
namespace {

using VecF = std::vector<float>;

// 2 layers, hidden 16, 2 heads, seq 8, vocab 37 (padded to 40 at TP = 1, 48 at TP = 2).
Config tiny_config() { return test::tiny_gpt_config(); }

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// One TP = PP = 1 stage with host buffers (the CPU backend works on host memory).
struct TinyModel {
  Config cfg = tiny_config();
  GPTDims d;
  ParamLayout layout;
  std::unique_ptr<Ops> ops = make_cpu_ops(2);
  std::unique_ptr<Comm> comm = make_self_comm();
  VecF params, grads;
  std::unique_ptr<GPTStage> stage;
  int64_t B = 2, N = 0;
  std::vector<int32_t> tokens, targets;

  explicit TinyModel(int slots = 1) {
    d = make_dims(cfg, 1, 0, 1, 0);
    layout = make_param_layout(d);
    params.assign(size_t(layout.total), 0.0f);
    grads.assign(size_t(layout.total), 0.0f);
    init_params_host(layout, cfg.training.seed, params.data());
    stage = std::make_unique<GPTStage>(d, layout, *ops, *comm, params.data(), grads.data(), B, slots);
    N = B * d.S;
    std::mt19937 gen(7);
    std::uniform_int_distribution<int32_t> tok(0, int32_t(d.V) - 1);
    for (int64_t i = 0; i < N; ++i) {
      tokens.push_back(tok(gen));
      targets.push_back(tok(gen));
    }
    tokens[3] = tokens[11] = 36;  // the last valid id, repeated
    targets[5] = 36;
    targets[6] = 0;
  }

  // Random parameters of a size that makes every gradient well above float noise, and random
  // values in the padded rows of the word embedding (they must not matter).
  void randomize(uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const ParamInfo& p : layout.params) {
      float* x = params.data() + p.offset;
      for (int64_t i = 0; i < p.numel; ++i) {
        const float z = nd(gen);
        if (p.init == ParamInfo::Init::Normal) x[i] = 0.3f * z;
        else if (p.init == ParamInfo::Init::Ones) x[i] = 1.0f + 0.2f * z;
        else x[i] = 0.1f * z;
      }
    }
  }

  double mean_loss() {
    stage->forward(0, tokens.data(), nullptr);
    return stage->loss(0, targets.data(), 0.0f, false) / double(N);
  }

  // grads = d mean_loss / d params; returns the mean loss.
  double gradient() {
    std::fill(grads.begin(), grads.end(), 0.0f);
    stage->forward(0, tokens.data(), nullptr);
    const double l = stage->loss(0, targets.data(), 1.0f / float(N), true) / double(N);
    stage->backward(0, nullptr);
    return l;
  }
};

// Central difference of the mean loss along the direction u (a map from offsets to weights),
// Richardson-extrapolated from steps h and h/2 (error O(h^4)).
double fd_along(TinyModel& m, const std::vector<std::pair<int64_t, float>>& u, float h) {
  auto central = [&](float step) {
    std::vector<float> old;
    for (auto [off, w] : u) old.push_back(m.params[size_t(off)]);
    for (size_t i = 0; i < u.size(); ++i) m.params[size_t(u[i].first)] = old[i] + step * u[i].second;
    const double jp = m.mean_loss();
    for (size_t i = 0; i < u.size(); ++i) m.params[size_t(u[i].first)] = old[i] - step * u[i].second;
    const double jm = m.mean_loss();
    for (size_t i = 0; i < u.size(); ++i) m.params[size_t(u[i].first)] = old[i];
    return (jp - jm) / (2.0 * step);
  };
  const double d1 = central(h), d2 = central(h / 2);
  return (4.0 * d2 - d1) / 3.0;
}

TEST(ModelGradient, MeanLossGradientMatchesFiniteDifferencesForEveryTensor) {
  TinyModel m;
  m.randomize(42);
  m.gradient();
  const VecF g = m.grads;
  std::mt19937 gen(3);
  int tensors = 0;
  for (const ParamInfo& p : m.layout.params) {
    SCOPED_TRACE(p.name);
    ++tensors;
    // elements inside the box (the word embedding's padded rows are checked separately)
    std::vector<int64_t> box;
    test::for_each_box_element(p, [&](int64_t local, int64_t) { box.push_back(p.offset + local); });
    double gmax = 0;
    int64_t arg = box[0];
    for (int64_t off : box)
      if (std::fabs(g[size_t(off)]) > gmax) gmax = std::fabs(g[size_t(off)]), arg = off;
    ASSERT_GT(gmax, 1e-4) << "gradient too small to check";
    std::vector<int64_t> pick = {arg};
    std::uniform_int_distribution<size_t> any(0, box.size() - 1);
    for (int k = 0; k < 3; ++k) pick.push_back(box[any(gen)]);
    for (int64_t off : pick) {
      const double fd = fd_along(m, {{off, 1.0f}}, 2e-2f);
      const double an = g[size_t(off)];
      EXPECT_NEAR(an, fd, 1e-2 * std::fabs(fd) + 2e-3 * gmax)
          << "element " << off - p.offset << " (largest gradient " << gmax << ")";
    }
    // directional derivative along sign(g) * r over the whole box: sensitive to a wrong sign or
    // scale in any part of the tensor
    std::vector<std::pair<int64_t, float>> u;
    std::uniform_real_distribution<float> r(0.5f, 1.0f);
    double an = 0;
    for (int64_t off : box) {
      const float w = (g[size_t(off)] >= 0 ? 1.0f : -1.0f) * r(gen);
      u.push_back({off, w});
      an += double(w) * g[size_t(off)];
    }
    const double fd = fd_along(m, u, 1e-2f);
    EXPECT_NEAR(an, fd, 3e-3 * std::fabs(fd)) << "directional derivative";
  }
  EXPECT_EQ(tensors, 2 + 2 * 12 + 2);
}

// Padded vocabulary rows are masked: whatever they hold, the loss and every other gradient are
// unchanged and their own gradient is zero.
TEST(ModelGradient, PaddedVocabularyRowsChangeNothing) {
  TinyModel m;
  m.randomize(5);
  const ParamInfo* wte = m.layout.find("wte.weight");
  ASSERT_NE(wte, nullptr);
  ASSERT_EQ(wte->local_shape[0], 40);
  ASSERT_EQ(wte->box_size[0], 37);
  float* pad = m.params.data() + wte->offset + 37 * m.d.C;
  const int64_t npad = 3 * m.d.C;
  std::fill(pad, pad + npad, 0.0f);
  const double l0 = m.gradient();
  const VecF g0 = m.grads;
  for (int64_t i = 0; i < npad; ++i) pad[i] = 25.0f + float(i % 5);  // logits far above the rest
  const double l1 = m.gradient();
  EXPECT_NEAR(l1, l0, 1e-6 * l0);
  for (int64_t i = 0; i < npad; ++i)
    ASSERT_EQ(m.grads[size_t(wte->offset + 37 * m.d.C + i)], 0.0f) << "padded row gradient";
  for (size_t i = 0; i < g0.size(); ++i)
    ASSERT_NEAR(m.grads[i], g0[i], 1e-6 * (std::fabs(g0[i]) + 1e-3)) << "offset " << i;
}

TEST(ModelLoss, LossAtInitIsCloseToLogVocab) {
  TinyModel m;
  const double l = m.mean_loss();
  // std-0.02 weights give near-uniform logits over the 37 real ids: ln 37 = 3.611 (ln 40 = 3.689
  // would mean the 3 padded columns took part in the softmax).
  EXPECT_NEAR(l, std::log(37.0), 0.02);
  // and the gradient pass computes the same loss
  EXPECT_NEAR(m.gradient(), l, 1e-7);
}

// Two micro-batches in flight in separate slots, backward in reverse order: the gradients are the
// sum of the two micro-batches' gradients computed one at a time.
TEST(ModelGradient, SlotsAccumulateLikeSeparateMicroBatches) {
  TinyModel m(2);
  m.randomize(9);
  std::vector<int32_t> tok2 = m.tokens, tgt2 = m.targets;
  std::reverse(tok2.begin(), tok2.end());
  std::rotate(tgt2.begin(), tgt2.begin() + 3, tgt2.end());
  const float s = 1.0f / float(m.N);

  auto one = [&](const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt, double* loss) {
    std::fill(m.grads.begin(), m.grads.end(), 0.0f);
    m.stage->forward(0, tok.data(), nullptr);
    *loss = m.stage->loss(0, tgt.data(), s, true);
    m.stage->backward(0, nullptr);
    return m.grads;
  };
  double la = 0, lb = 0;
  const VecF ga = one(m.tokens, m.targets, &la);
  const VecF gb = one(tok2, tgt2, &lb);

  std::fill(m.grads.begin(), m.grads.end(), 0.0f);
  m.stage->forward(0, m.tokens.data(), nullptr);
  m.stage->forward(1, tok2.data(), nullptr);
  const double l1 = m.stage->loss(1, tgt2.data(), s, true);
  m.stage->backward(1, nullptr);
  const double l0 = m.stage->loss(0, m.targets.data(), s, true);
  m.stage->backward(0, nullptr);
  EXPECT_NEAR(l0, la, 1e-9 * la);
  EXPECT_NEAR(l1, lb, 1e-9 * lb);
  for (size_t i = 0; i < ga.size(); ++i) {
    const double want = double(ga[i]) + gb[i];
    // float sums in another order (GEMM accumulating into the gradient vs. adding two results):
    // a few ulps of the largest terms; a missing or doubled micro-batch is off by 100%
    ASSERT_NEAR(m.grads[i], want, 1e-5 * (std::fabs(want) + 1e-3)) << "offset " << i;
  }

  // loss() without want_grad in between: backward recomputes the logits gradient of its own slot
  std::fill(m.grads.begin(), m.grads.end(), 0.0f);
  m.stage->forward(0, m.tokens.data(), nullptr);
  m.stage->forward(1, tok2.data(), nullptr);
  m.stage->loss(0, m.targets.data(), s, true);
  m.stage->loss(1, tgt2.data(), s, true);  // overwrites the shared logits buffer
  m.stage->backward(0, nullptr);
  m.stage->backward(1, nullptr);
  for (size_t i = 0; i < ga.size(); ++i) {
    const double want = double(ga[i]) + gb[i];
    ASSERT_NEAR(m.grads[i], want, 1e-5 * (std::fabs(want) + 1e-3)) << "offset " << i << " (recompute path)";
  }
}

// Two pipeline stages chained in one process (hidden states forward, input gradient back, the
// tied word embedding's two gradients summed) reproduce the one-stage loss and gradients.
TEST(ModelGradient, TwoPipelineStagesChainedMatchOneStage) {
  TinyModel m;
  m.randomize(13);
  const double want_loss = m.gradient();
  const float s = 1.0f / float(m.N);
  std::vector<GPTDims> d;
  std::vector<ParamLayout> l;
  for (int st = 0; st < 2; ++st) {
    d.push_back(make_dims(m.cfg, 1, 0, 2, st));
    l.push_back(make_param_layout(d.back()));
  }
  std::vector<VecF> p, g;
  for (int st = 0; st < 2; ++st) {
    p.emplace_back(size_t(l[size_t(st)].total), 0.0f);
    g.emplace_back(size_t(l[size_t(st)].total), 0.0f);
    for (const ParamInfo& info : l[size_t(st)].params) {
      const ParamInfo* f = m.layout.find(info.name);
      ASSERT_NE(f, nullptr);
      ASSERT_EQ(info.numel, f->numel);
      std::copy_n(m.params.begin() + f->offset, info.numel, p.back().begin() + info.offset);
    }
  }
  GPTStage first(d[0], l[0], *m.ops, *m.comm, p[0].data(), g[0].data(), m.B, 1);
  GPTStage last(d[1], l[1], *m.ops, *m.comm, p[1].data(), g[1].data(), m.B, 1);
  first.forward(0, m.tokens.data(), nullptr);
  last.forward(0, nullptr, first.output(0));
  const double loss = last.loss(0, m.targets.data(), s, true) / double(m.N);
  last.backward(0, nullptr);
  first.backward(0, last.input_grad());
  EXPECT_NEAR(loss, want_loss, 1e-6 * want_loss);
  const ParamInfo* wte0 = l[0].find("wte.weight");
  const ParamInfo* wte1 = l[1].find("wte.weight");
  ASSERT_TRUE(wte0 && wte1 && !wte1->group.primary && wte0->group.primary);
  EXPECT_TRUE(wte0->group.copy == ModelCopy::TiedEmbedding && wte1->group.copy == ModelCopy::TiedEmbedding);
  for (int64_t i = 0; i < wte0->numel; ++i)  // the embedding-group all-reduce of the trainer
    g[0][size_t(wte0->offset + i)] += g[1][size_t(wte1->offset + i)];
  for (int st = 0; st < 2; ++st)
    for (const ParamInfo& info : l[size_t(st)].params) {
      if (!info.group.primary) continue;  // the tied copy
      const ParamInfo* f = m.layout.find(info.name);
      for (int64_t i = 0; i < info.numel; ++i) {
        const float want = m.grads[size_t(f->offset + i)];
        ASSERT_NEAR(g[size_t(st)][size_t(info.offset + i)], want, 1e-5 * (std::fabs(want) + 1e-3))
            << info.name << " element " << i << " (stage " << st << ")";
      }
    }
}

// ------------------------------------------------------------------------------------------------
// layout and init

VecF init_of(const ParamLayout& l, uint64_t seed) {
  VecF v(size_t(l.total), -1.0f);
  init_params_host(l, seed, v.data());
  return v;
}

TEST(ModelInit, DeterministicAndSeedDependent) {
  const Config c = tiny_config();
  const GPTDims d = make_dims(c, 1, 0, 1, 0);
  const ParamLayout l = make_param_layout(d);
  const VecF a = init_of(l, 1234), b = init_of(l, 1234), other = init_of(l, 1235);
  for (const ParamInfo& p : l.params) {
    EXPECT_EQ(std::memcmp(a.data() + p.offset, b.data() + p.offset, size_t(p.numel) * sizeof(float)), 0) << p.name;
    if (p.init == ParamInfo::Init::Normal) {
      EXPECT_NE(std::memcmp(a.data() + p.offset, other.data() + p.offset, size_t(p.numel) * sizeof(float)), 0)
          << p.name << " does not depend on the seed";
    }
  }
}

TEST(ModelInit, ValuesFollowTheContract) {
  const Config c = tiny_config();
  const GPTDims d = make_dims(c, 1, 0, 1, 0);
  EXPECT_EQ(d.Vp, 40);
  EXPECT_EQ(d.D, 8);
  const ParamLayout l = make_param_layout(d);
  const VecF v = init_of(l, 1234);
  const double out_std = 0.02 / std::sqrt(2.0 * 2);
  for (const ParamInfo& p : l.params) {
    SCOPED_TRACE(p.name);
    const float* x = v.data() + p.offset;
    const bool is_ln = p.name.find("ln_") != std::string::npos;
    const bool is_weight = p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, ".weight") == 0;
    EXPECT_EQ(p.weight_decay, is_weight && !is_ln) << "weight decay on every 2-D weight, none on biases/LN";
    if (is_ln && is_weight) {
      for (int64_t i = 0; i < p.numel; ++i) ASSERT_EQ(x[i], 1.0f);
    } else if (!is_weight) {
      for (int64_t i = 0; i < p.numel; ++i) ASSERT_EQ(x[i], 0.0f);
    } else {
      const bool out_proj = p.name.find("attn.proj") != std::string::npos || p.name.find("mlp.fc2") != std::string::npos;
      const int64_t n = numel_of(p.box_size);
      double s = 0, s2 = 0;
      for (int64_t i = 0; i < n; ++i) s += x[i], s2 += double(x[i]) * x[i];
      const double mean = s / double(n), sd = std::sqrt(s2 / double(n) - mean * mean);
      const double want = out_proj ? out_std : 0.02;
      EXPECT_NEAR(sd, want, 0.2 * want) << "init std";
      EXPECT_NEAR(mean, 0.0, 4 * want / std::sqrt(double(n)));
    }
  }
}

TEST(ModelInit, PaddedWordEmbeddingRowsAreZero) {
  const Config c = tiny_config();
  for (int tp : {1, 2}) {
    for (int r = 0; r < tp; ++r) {
      const GPTDims d = make_dims(c, tp, r, 1, 0);
      const ParamLayout l = make_param_layout(d);
      const VecF v = init_of(l, 1234);
      const ParamInfo* w = l.find("wte.weight");
      ASSERT_NE(w, nullptr);
      EXPECT_EQ(w->local_shape[0], d.Vl);
      EXPECT_EQ(w->box_offset[0], std::min<int64_t>(d.vocab_begin, d.V));
      EXPECT_EQ(w->box_size[0], std::max<int64_t>(0, std::min(d.V, d.vocab_begin + d.Vl) - d.vocab_begin));
      for (int64_t row = w->box_size[0]; row < d.Vl; ++row)
        for (int64_t c2 = 0; c2 < d.C; ++c2)
          ASSERT_EQ(v[size_t(w->offset + row * d.C + c2)], 0.0f) << "tp " << tp << " rank " << r << " row " << row;
      int64_t nonzero = 0;
      for (int64_t i = 0; i < w->box_size[0] * d.C; ++i) nonzero += v[size_t(w->offset + i)] != 0.0f;
      EXPECT_EQ(nonzero, w->box_size[0] * d.C);
    }
  }
}

// Stitching the TP (and PP) shards by box_offset/box_size reproduces the TP = 1 tensors exactly.
void check_stitching(int tp, int pp) {
  SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
  const Config c = tiny_config();
  const ParamLayout full = make_param_layout(make_dims(c, 1, 0, 1, 0));
  const VecF ref = init_of(full, 1234);
  VecF stitched(size_t(full.total), std::numeric_limits<float>::quiet_NaN());
  std::vector<int> writes(size_t(full.total), 0);
  for (int s = 0; s < pp; ++s)
    for (int r = 0; r < tp; ++r) {
      const GPTDims d = make_dims(c, tp, r, pp, s);
      const ParamLayout l = make_param_layout(d);
      const VecF v = init_of(l, 1234);
      for (const ParamInfo& p : l.params) {
        const ParamInfo* f = full.find(p.name);
        ASSERT_NE(f, nullptr) << p.name << " is not a TP = 1 tensor";
        ASSERT_EQ(p.global_shape, f->global_shape) << p.name;
        ASSERT_EQ(p.box_offset.size(), p.global_shape.size());
        for (size_t k = 0; k < p.global_shape.size(); ++k)
          ASSERT_LE(p.box_offset[k] + p.box_size[k], p.global_shape[k]) << p.name;
        EXPECT_EQ(p.group.copy == ModelCopy::TiedEmbedding, p.name == "wte.weight" && pp > 1) << p.name;
        EXPECT_EQ(p.group.primary, !(p.name == "wte.weight" && s != 0) && (p.group.copy != ModelCopy::TensorParallel || r == 0))
            << p.name;
        test::for_each_box_element(p, [&](int64_t local, int64_t global) {
          // the TP = 1 local tensor is the whole global tensor (its padded rows come after)
          const size_t at = size_t(f->offset + global);
          const float x = v[size_t(p.offset + local)];
          if (writes[at]++) {
            EXPECT_EQ(x, stitched[at]) << p.name << " replicated copies differ";
          }
          stitched[at] = x;
        });
      }
    }
  for (const ParamInfo& f : full.params) {
    const int64_t n = numel_of(f.global_shape);
    const int want_writes = (f.group.copy == ModelCopy::TensorParallel ? tp : 1) * (f.name == "wte.weight" && pp > 1 ? 2 : 1);
    for (int64_t i = 0; i < n; ++i) {
      const size_t at = size_t(f.offset + i);
      ASSERT_EQ(writes[at], want_writes) << f.name << " element " << i << " covered " << writes[at] << " times";
      ASSERT_EQ(std::memcmp(&stitched[at], &ref[at], sizeof(float)), 0)
          << f.name << " element " << i << ": " << stitched[at] << " vs " << ref[at];
    }
  }
}

TEST(ModelInit, TensorParallelShardsStitchToTheFullParameters) { check_stitching(2, 1); }
TEST(ModelInit, TensorAndPipelineShardsStitchToTheFullParameters) { check_stitching(2, 2); }

TEST(ModelInit, ShardingFlagsAndShapes) {
  const Config c = tiny_config();
  const GPTDims d = make_dims(c, 2, 1, 1, 0);
  EXPECT_EQ(d.Vp, 48);
  EXPECT_EQ(d.Vl, 24);
  EXPECT_EQ(d.vocab_begin, 24);
  EXPECT_EQ(d.Hl, 1);
  EXPECT_EQ(d.Cl, 8);
  EXPECT_EQ(d.Fl, 32);
  const ParamLayout l = make_param_layout(d);
  for (const ParamInfo& p : l.params) {
    SCOPED_TRACE(p.name);
    const bool replicated = p.name.find("ln_") != std::string::npos || p.name == "wpe.weight" ||
                            p.name.find("attn.proj.bias") != std::string::npos ||
                            p.name.find("mlp.fc2.bias") != std::string::npos;
    EXPECT_EQ(p.group.copy == ModelCopy::TensorParallel, replicated);
    EXPECT_EQ(p.group.primary, !replicated);  // tp_rank 1 holds no primary copy of a replicated tensor
    EXPECT_EQ(p.offset % 16, 0);
    EXPECT_EQ(p.numel, numel_of(p.local_shape));
  }
  EXPECT_EQ(l.find("h.0.attn.qkv.weight")->box_offset, (std::vector<int64_t>{0, 8, 0}));
  EXPECT_EQ(l.find("h.0.attn.qkv.weight")->box_size, (std::vector<int64_t>{3, 8, 16}));
  EXPECT_EQ(l.find("h.1.attn.proj.weight")->box_offset, (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(l.find("h.1.mlp.fc1.weight")->box_offset, (std::vector<int64_t>{32, 0}));
  EXPECT_EQ(l.find("h.1.mlp.fc2.weight")->box_size, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(l.find("wte.weight")->box_offset, (std::vector<int64_t>{24, 0}));
  EXPECT_EQ(l.find("wte.weight")->box_size, (std::vector<int64_t>{13, 16}));
}

}  // namespace
}  // namespace tpt
