// model/inference.h with the LLaMA family's options (inference_test.cpp's check on a Llama-shaped
// model): RMSNorm, SwiGLU, RoPE (interleaved or rotate-half, partial rotary, Llama 3.1's
// rope_scaling), grouped-query attention with fewer KV heads than query heads, an untied output
// layer and no biases. KV-cached logits -- the prompt in one pass, then a token at a time, the
// cache holding G key/value heads and RoPE at positions len..len+n-1 -- equal GPTStage's training
// forward (one rank) of the whole sequence, its final RMSNorm and lm_head, and its loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/ops.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "model/inference.h"
#include "model/layers.h"
#include "parallel/comm.h"
#include "tests/common/inference_check.h"

namespace tpt {
namespace {

struct LlamaVariant {
  const char* name;
  int64_t groups;       // num_query_groups (of 4 heads)
  int kv_channels;      // head dim (0: hidden / heads)
  double rotary_percent;
  bool interleaved;
  bool scaling;         // Llama 3.1 rope_scaling
  bool qk_norm = false;  // model.qk_layernorm (Qwen3): the cache holds the normalised, rotated keys
};

// GQA with 2 groups of 2, head dim 12 (not hidden / heads), interleaved pairs on half the channels,
// rope_scaling whose three branches (kept, smoothed, divided) all apply to the 3 frequencies; and
// multi-query (1 group of 4), rotate-half on every channel, no scaling; GQA 2 with Qwen3's q/k norms.
const LlamaVariant kVariants[] = {
    {"gqa2_interleaved_partial_scaled", 2, 12, 0.5, true, true},
    {"mqa_rotate_half_full", 1, 0, 1.0, false, false},
    {"gqa2_qk_norm", 2, 12, 1.0, false, false, true},
};

struct LlamaModel {
  Config cfg;
  GPTDims d;
  ParamLayout layout;
  std::unique_ptr<Ops> ops = make_cpu_ops(2);
  float* params = nullptr;

  explicit LlamaModel(const LlamaVariant& v) {
    ModelConfig& m = cfg.model;
    m.num_layers = 2;
    m.hidden_size = 32;
    m.num_attention_heads = 4;
    m.ffn_hidden_size = 40;
    m.seq_length = 12;
    m.max_position_embeddings = 16;
    m.vocab_size = 37;  // padded to 40: padding rows must not leak into the logits
    m.make_vocab_size_divisible_by = 8;
    m.layernorm_epsilon = 1e-5;
    m.normalization = Normalization::RMSNorm;
    m.swiglu = true;
    m.position_embedding_type = PositionEmbedding::Rope;
    m.rotary_base = 10000;
    m.rotary_percent = v.rotary_percent;
    m.rotary_interleaved = v.interleaved;
    if (v.scaling) m.rope_scaling = RopeScaling{8.0, 1.0, 4.0, 256};
    m.group_query_attention = true;
    m.num_query_groups = int(v.groups);
    m.kv_channels = v.kv_channels;
    m.untie_embeddings_and_output_weights = true;
    m.add_bias_linear = false;
    m.qk_layernorm = v.qk_norm;
    d = make_dims(cfg, 1, 0, 1, 0);
    layout = make_param_layout(d);
    std::vector<float> host(size_t(layout.total));
    init_params_host(layout, 5, host.data());
    // RMSNorm weights 1 would hide mistakes in their use: perturb every element; the projections'
    // small init std is raised so that attention and the MLP matter to the logits
    for (const ParamInfo& p : layout.params) {
      const float extra = p.init == ParamInfo::Init::Normal ? 0.0f : 0.1f;
      const float gain = p.init == ParamInfo::Init::Normal ? 5.0f : 1.0f;
      for (int64_t e = 0; e < p.numel; ++e) {
        float& x = host[size_t(p.offset + e)];
        x = gain * x + extra * normal_at(9, stream_id(p.name), uint64_t(e));
      }
    }
    params = ops->alloc(size_t(layout.total));
    ops->to_device(params, host.data(), host.size());
  }
  ~LlamaModel() { ops->free(params); }
  const float* p(const std::string& name) const { return params + layout.find(name)->offset; }
};

std::string variant_name(const ::testing::TestParamInfo<LlamaVariant>& info) { return info.param.name; }

class InferenceLlama : public ::testing::TestWithParam<LlamaVariant> {};

// The model is the shape asked for: no biases, no learned positions, RMSNorm weights only, the grouped
// QKV, [gate; up] fc1, an lm_head of its own, and RoPE's frequencies as configured.
TEST_P(InferenceLlama, ModelHasTheLlamaShape) {
  LlamaModel m(GetParam());
  const GPTDims& d = m.d;
  EXPECT_LT(d.G, d.H);
  EXPECT_TRUE(d.norm.rms);
  EXPECT_TRUE(d.mlp.swiglu);
  EXPECT_TRUE(d.untied);
  EXPECT_GT(d.rot, 0);
  EXPECT_EQ(d.rot, int64_t(std::lround(double(d.D) * GetParam().rotary_percent)));
  EXPECT_EQ(d.rope_interleaved, GetParam().interleaved);
  for (const ParamInfo& p : m.layout.params) EXPECT_EQ(p.name.find("bias"), std::string::npos) << p.name;
  EXPECT_EQ(m.layout.find("wpe.weight"), nullptr);
  ASSERT_NE(m.layout.find("lm_head.weight"), nullptr);
  EXPECT_EQ(m.layout.find("h.0.attn.qkv.weight")->global_shape,
            (std::vector<int64_t>{d.G, d.H / d.G + 2, d.D, d.C}));
  EXPECT_EQ(m.layout.find("h.0.mlp.fc1.weight")->global_shape, (std::vector<int64_t>{2, d.F, d.C}));
  for (const char* n : {"h.1.attn.q_layernorm.weight", "h.1.attn.k_layernorm.weight"}) {
    const ParamInfo* qk = m.layout.find(n);
    EXPECT_EQ(qk != nullptr, GetParam().qk_norm) << n;
    if (qk) {
      EXPECT_EQ(qk->global_shape, std::vector<int64_t>{d.D}) << n;
    }
  }
  // rope_scaling changes the frequencies: the lowest ones are divided by the factor
  const std::vector<float> plain = [&] {
    ModelConfig mc = m.cfg.model;
    mc.rope_scaling = RopeScaling{};
    return rope_inv_freq(mc);
  }();
  ASSERT_EQ(d.inv_freq.size(), size_t(d.rot / 2));
  if (GetParam().scaling) {
    EXPECT_EQ(d.inv_freq.front(), plain.front()) << "a high frequency is kept";
    EXPECT_NEAR(d.inv_freq.back(), plain.back() / 8.0f, 1e-6 * plain.back()) << "a low frequency is divided";
    EXPECT_NE(d.inv_freq, plain);
    if (d.inv_freq.size() == 3) {  // the middle one lies between: smoothed
      EXPECT_LT(d.inv_freq[1], plain[1]);
      EXPECT_GT(d.inv_freq[1], plain[1] / 8.0f);
    }
  } else {
    EXPECT_EQ(d.inv_freq, plain);
  }
}

TEST_P(InferenceLlama, KvCachedLogitsEqualTheTrainingForward) {
  LlamaModel m(GetParam());
  const GPTDims& d = m.d;
  const int64_t S = d.S, C = d.C, V = d.V;
  const std::vector<int32_t> tokens = tokens_of(S + 1, V, 3);  // inputs [0, S), targets [1, S + 1)

  // The training forward of one micro-batch of one sequence (RoPE at positions n % S = 0..S-1): block
  // outputs (S, C), then the final RMSNorm and the untied lm_head over the unpadded vocabulary.
  auto self = make_self_comm();
  float* grads = m.ops->alloc(size_t(m.layout.total));
  GPTStage stage(d, m.layout, *m.ops, *self, m.params, grads, 1, 1);
  stage.forward(0, tokens.data(), nullptr);
  std::vector<float> ln(static_cast<size_t>(S * C)), rstd(static_cast<size_t>(S)), full(static_cast<size_t>(S * V));
  m.ops->rmsnorm_forward(ln.data(), rstd.data(), stage.output(0), m.p("ln_f.weight"), S, C, d.eps);
  m.ops->linear_forward(full.data(), ln.data(), m.p("lm_head.weight"), nullptr, S, C, V);
  // ... whose cross-entropy is GPTStage's loss: the logits above are the ones the trainer uses
  const double xent = sequence_xent(full, tokens.data() + 1, S, V);
  const double stage_loss = stage.loss(0, tokens.data() + 1, 1.0f, false);
  EXPECT_NEAR(xent, stage_loss, 1e-5 * std::abs(stage_loss));
  // not vacuous: the tied word embedding as output layer would give other logits
  std::vector<float> tied(static_cast<size_t>(S * V));
  m.ops->linear_forward(tied.data(), ln.data(), m.p("wte.weight"), nullptr, S, C, V);
  EXPECT_GT(std::abs(tied[0] - full[0]) + std::abs(tied[1] - full[1]), 1e-3);
  m.ops->free(grads);

  // The whole sequence in one pass, then prompts and one token at a time against the KV cache
  GPTInference inf(d, m.layout, *m.ops, m.params);
  expect_cached_decoding_equals(inf, tokens, full, S, V);
  std::vector<float> logits;
  // chunks of several tokens after the prompt: positions len..len+n-1 for each chunk
  inf.reset();
  for (int64_t t0 : {int64_t(0), int64_t(3), int64_t(4), int64_t(9)}) {
    const int64_t n = (t0 == 0 ? 3 : t0 == 3 ? 1 : t0 == 4 ? 5 : S - 9);
    inf.forward(std::span<const int32_t>(tokens.data() + t0, size_t(n)), logits, true);
    expect_close(logits.data(), full.data() + t0 * V, n * V, "chunk at " + std::to_string(t0));
  }
  EXPECT_EQ(inf.length(), S);
}

// Positions past the training sequence (up to max_position_embeddings): token by token against the
// cache equals one pass over all of them.
TEST_P(InferenceLlama, CachedDecodingPastSeqLengthEqualsOnePass) {
  LlamaModel m(GetParam());
  const GPTDims& d = m.d;
  const int64_t P = d.P, V = d.V;
  ASSERT_GT(P, d.S);
  const std::vector<int32_t> tokens = tokens_of(P, V, 7);
  GPTInference inf(d, m.layout, *m.ops, m.params);
  std::vector<float> full, logits;
  inf.forward(tokens, full, true);
  ASSERT_EQ(full.size(), size_t(P * V));
  inf.reset();
  inf.forward(std::span<const int32_t>(tokens.data(), 2), logits);
  expect_close(logits.data(), full.data() + V, V, "prompt of 2");
  for (int64_t t = 2; t < P; ++t) {
    inf.forward(std::span<const int32_t>(&tokens[size_t(t)], 1), logits);
    expect_close(logits.data(), full.data() + t * V, V, "cached decoding at position " + std::to_string(t));
  }
  EXPECT_EQ(inf.length(), P);
}

// A micro-batch of two sequences: the second one's tokens are at positions n % S = 0..S-1 again,
// so its rows of the training forward equal generation of that sequence alone.
TEST_P(InferenceLlama, SecondSequenceOfAMicroBatchRestartsPositions) {
  LlamaModel m(GetParam());
  const GPTDims& d = m.d;
  const int64_t S = d.S, C = d.C, V = d.V;
  std::vector<int32_t> tokens = tokens_of(2 * S, V, 11);
  auto self = make_self_comm();
  float* grads = m.ops->alloc(size_t(m.layout.total));
  GPTStage stage(d, m.layout, *m.ops, *self, m.params, grads, 2, 1);
  stage.forward(0, tokens.data(), nullptr);
  std::vector<float> ln(static_cast<size_t>(2 * S * C)), rstd(static_cast<size_t>(2 * S)),
      full(static_cast<size_t>(2 * S * V));
  m.ops->rmsnorm_forward(ln.data(), rstd.data(), stage.output(0), m.p("ln_f.weight"), 2 * S, C, d.eps);
  m.ops->linear_forward(full.data(), ln.data(), m.p("lm_head.weight"), nullptr, 2 * S, C, V);
  m.ops->free(grads);
  GPTInference inf(d, m.layout, *m.ops, m.params);
  std::vector<float> logits;
  for (int64_t b = 0; b < 2; ++b) {
    inf.reset();
    inf.forward(std::span<const int32_t>(tokens.data() + b * S, size_t(S)), logits, true);
    expect_close(logits.data(), full.data() + b * S * V, S * V, "sequence " + std::to_string(b));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, InferenceLlama, ::testing::ValuesIn(kVariants), variant_name);

}  // namespace
}  // namespace tpt
