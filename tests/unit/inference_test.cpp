// model/inference.h: KV-cached decoding gives the logits of the training forward (GPTStage's
// forward, its final LayerNorm and tied LM head, and its loss) on the whole sequence; greedy and
// sampled token choice.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "model/inference.h"
#include "parallel/comm.h"
#include "tests/common/inference_check.h"

namespace tpt {
namespace {

struct TinyModel {
  Config cfg;
  GPTDims d;
  ParamLayout layout;
  std::unique_ptr<Ops> ops = make_cpu_ops(2);
  float* params = nullptr;

  TinyModel() {
    ModelConfig& m = cfg.model;
    m.num_layers = 2;
    m.hidden_size = 32;
    m.num_attention_heads = 4;
    m.ffn_hidden_size = 48;
    m.seq_length = 12;
    m.max_position_embeddings = 16;
    m.vocab_size = 37;  // padded to 40: padding rows must not leak into the logits
    m.make_vocab_size_divisible_by = 8;
    d = make_dims(cfg, 1, 0, 1, 0);
    layout = make_param_layout(d);
    std::vector<float> host(size_t(layout.total));
    init_params_host(layout, 5, host.data());
    // LayerNorm weights 1 and biases 0 would hide mistakes in their use: perturb every element
    for (const ParamInfo& p : layout.params)
      if (p.init != ParamInfo::Init::Normal)
        for (int64_t e = 0; e < p.numel; ++e) host[size_t(p.offset + e)] += 0.1f * normal_at(9, stream_id(p.name), uint64_t(e));
    params = ops->alloc(size_t(layout.total));
    ops->to_device(params, host.data(), host.size());
  }
  ~TinyModel() { ops->free(params); }
  const float* p(const std::string& name) const { return params + layout.find(name)->offset; }
};

TEST(Inference, KvCachedLogitsEqualTheTrainingForward) {
  TinyModel m;
  const GPTDims& d = m.d;
  const int64_t S = d.S, C = d.C, V = d.V;
  const std::vector<int32_t> tokens = tokens_of(S + 1, V, 3);  // inputs [0, S), targets [1, S + 1)

  // The training forward of one micro-batch of one sequence: block outputs (S, C), then the final
  // LayerNorm and the tied LM head over the unpadded vocabulary, as GPTStage::loss computes them.
  auto self = make_self_comm();
  float* grads = m.ops->alloc(size_t(m.layout.total));
  GPTStage stage(d, m.layout, *m.ops, *self, m.params, grads, 1, 1);
  stage.forward(0, tokens.data(), nullptr);
  std::vector<float> ln(static_cast<size_t>(S * C)), mean(static_cast<size_t>(S)), rstd(static_cast<size_t>(S)),
      full(static_cast<size_t>(S * V));
  m.ops->layernorm_forward(ln.data(), mean.data(), rstd.data(), stage.output(0), m.p("ln_f.weight"), m.p("ln_f.bias"),
                           S, C, d.eps);
  m.ops->linear_forward(full.data(), ln.data(), m.p("wte.weight"), nullptr, S, C, V);
  // ... whose cross-entropy is GPTStage's loss: the logits above are the ones the trainer uses
  const double xent = sequence_xent(full, tokens.data() + 1, S, V);
  const double stage_loss = stage.loss(0, tokens.data() + 1, 1.0f, false);
  EXPECT_NEAR(xent, stage_loss, 1e-5 * std::abs(stage_loss));
  m.ops->free(grads);

  // The whole sequence in one pass, then prompts and one token at a time against the KV cache
  GPTInference inf(d, m.layout, *m.ops, m.params);
  expect_cached_decoding_equals(inf, tokens, full, S, V);
  std::vector<float> logits;

  // the cache holds max_position_embeddings positions, no more
  const std::vector<int32_t> more = tokens_of(d.P - S, V, 4);
  inf.forward(more, logits);
  EXPECT_EQ(inf.length(), d.P);
  const int32_t one = 1;
  EXPECT_THROW(inf.forward(std::span<const int32_t>(&one, 1), logits), InputError);
  EXPECT_EQ(inf.length(), d.P);
  const int32_t bad = int32_t(V);  // a padded-vocabulary id is no token
  inf.reset();
  EXPECT_THROW(inf.forward(std::span<const int32_t>(&bad, 1), logits), InputError);
}

TEST(Inference, GreedyTiesGoToTheLowestId) {
  EXPECT_EQ(greedy_token(std::vector<float>{1, 3, 3, 2}), 1);
  EXPECT_EQ(greedy_token(std::vector<float>{5, 5}), 0);
  EXPECT_EQ(greedy_token(std::vector<float>{-2, -1, -1.5f}), 1);
  EXPECT_EQ(greedy_token(std::vector<float>{0.5f}), 0);
  // temperature 0 is greedy; top-k 1 at any temperature too (ties: the lowest id ranks first)
  const std::vector<float> l = {0, 2, 7, 7, -1};
  for (uint64_t step = 0; step < 20; ++step) {
    EXPECT_EQ(sample_token(l, 0.0, 0, 1, step), 2);
    EXPECT_EQ(sample_token(l, 1.5, 1, 1, step), 2);
  }
}

TEST(Inference, SamplingIsSeededAndFollowsTheSoftmax) {
  // p = softmax(log [1, 3, 0+, ...]) = [0.25, 0.75, ~0]; top-k 2 removes the tail exactly
  const std::vector<float> l = {0.0f, std::log(3.0f), -30.0f, -40.0f};
  int counts[4] = {0, 0, 0, 0};
  const int n = 4000;
  for (int s = 0; s < n; ++s) {
    const int32_t t = sample_token(l, 1.0, 2, 42, uint64_t(s));
    ASSERT_TRUE(t == 0 || t == 1);
    ++counts[t];
    EXPECT_EQ(t, sample_token(l, 1.0, 2, 42, uint64_t(s)));  // a pure function of (seed, step)
  }
  EXPECT_NEAR(double(counts[1]) / n, 0.75, 0.03);
  // a high temperature flattens the distribution: T = 1e3 over top-2 is ~50/50
  int ones = 0;
  for (int s = 0; s < n; ++s) ones += sample_token(l, 1000.0, 2, 7, uint64_t(s)) == 1;
  EXPECT_NEAR(double(ones) / n, 0.5, 0.03);
  // another seed gives another sequence
  int differ = 0;
  for (int s = 0; s < 200; ++s) differ += sample_token(l, 1.0, 0, 1, uint64_t(s)) != sample_token(l, 1.0, 0, 2, uint64_t(s));
  EXPECT_GT(differ, 20);
}

}  // namespace
}  // namespace tpt
