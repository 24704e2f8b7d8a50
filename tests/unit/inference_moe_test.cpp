// model/inference.h on Mixture-of-Experts models (docs/MOE.md): KV-cached decoding -- the router's
// logits, host routing with no capacity, the experts' GEMMs and the shared expert on every call's
// token count (the prompt, then one token) -- equals GPTStage's training forward (one rank, MoEMLP)
// of the whole sequence, its final norm and LM head, and its loss; with a capacity factor in the
// config, generation is the dropless training forward (capacity is a training-time rule), which the
// capacity forward is not. And checkpoint_model_config reads the MoE keys config_to_json writes into
// meta.json.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "core/config.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/rng.h"
#include "model/checkpoint_model.h"
#include "model/gpt.h"
#include "model/inference.h"
#include "parallel/comm.h"
#include "tests/common/inference_check.h"

namespace tpt {
namespace {

struct MoEVariant {
  const char* name;
  int experts, topk;
  MoEScore score;
  bool pre_softmax;
  double scaling;         // moe_router_topk_scaling_factor (0: null)
  int groups, group_topk;  // group-limited routing (0: off)
  bool swiglu, bias;       // the experts' activation and biases (as the dense MLP's)
  std::vector<int> layer_freq;  // moe_layer_freq as a list (3 layers); empty: every layer
  double aux, z;           // balancing losses in the config (training only)
  double capacity;         // moe_expert_capacity_factor (0: dropless)
  int shared;              // moe_shared_expert_intermediate_size (0: none)
  bool shared_gate;
  bool expert_bias;        // moe_router_enable_expert_bias (sigmoid scores)
};

// top-2 softmax GELU experts with biases after a dense first layer, the balancing losses on; sigmoid
// scores, group-limited (3 groups of 2, one chosen), scaled, SwiGLU experts without biases on every
// layer with a gated shared expert and a (trained, nonzero) expert bias; pre-softmax top-1 whose
// config has a binding capacity (2 rows per expert of 12 tokens), with an ungated shared expert.
const MoEVariant kVariants[] = {
    {"softmax_top2_gelu_bias_dense_first", 4, 2, MoEScore::Softmax, false, 0, 0, 0, false, true, {0, 1, 1}, 1e-2, 1e-3,
     0, 0, false, false},
    {"sigmoid_groups_scaled_swiglu_gated_shared_expert_bias", 6, 2, MoEScore::Sigmoid, false, 2.5, 3, 1, true, false, {},
     0, 0, 0, 16, true, true},
    {"pre_softmax_top1_capacity_shared", 4, 1, MoEScore::Softmax, true, 0, 0, 0, false, true, {1, 0, 1}, 0, 0, 0.5, 20,
     false, false},
};

struct MoEModel {
  Config cfg;
  GPTDims d;
  ParamLayout layout;
  std::unique_ptr<Ops> ops = make_cpu_ops(2);
  float* params = nullptr;
  std::vector<std::vector<float>> expert_bias;  // per layer (E) with the expert bias

  explicit MoEModel(const MoEVariant& v) {
    ModelConfig& m = cfg.model;
    m.num_layers = 3;
    m.hidden_size = 32;
    m.num_attention_heads = 4;
    m.ffn_hidden_size = 40;
    m.seq_length = 12;
    m.max_position_embeddings = 16;
    m.vocab_size = 37;  // padded to 40: padding rows must not leak into the logits
    m.make_vocab_size_divisible_by = 8;
    m.swiglu = v.swiglu;
    m.add_bias_linear = v.bias;
    m.num_moe_experts = v.experts;
    m.moe_ffn_hidden_size = 24;
    m.moe_layer_freq = v.layer_freq.empty() ? LayerFreq{} : LayerFreq{0, v.layer_freq};
    m.moe_router_topk = v.topk;
    m.moe_router_score_function = v.score;
    m.moe_router_pre_softmax = v.pre_softmax;
    m.moe_router_topk_scaling_factor = v.scaling;
    m.moe_router_num_groups = v.groups;
    m.moe_router_group_topk = v.group_topk;
    m.moe_aux_loss_coeff = v.aux;
    m.moe_z_loss_coeff = v.z;
    m.moe_expert_capacity_factor = v.capacity;
    m.moe_shared_expert_intermediate_size = v.shared;
    m.moe_shared_expert_gate = v.shared_gate;
    m.moe_router_enable_expert_bias = v.expert_bias;
    d = make_dims(cfg, 1, 0, 1, 0);
    layout = make_param_layout(d);
    if (v.expert_bias) {  // as a trained bias: nonzero, of the sigmoid scores' size, per MoE layer
      expert_bias.resize(size_t(d.L));
      for (int64_t l = 0; l < d.L; ++l)
        if (d.moe.is_moe(l))
          for (int64_t e = 0; e < d.moe.E; ++e)
            expert_bias[size_t(l)].push_back(0.3f * normal_at(11, stream_id("bias"), uint64_t(l * d.moe.E + e)));
    }
    std::vector<float> host(size_t(layout.total));
    init_params_host(layout, 5, host.data());
    // norm weights 1 and biases 0 would hide mistakes in their use: perturb them; a larger router
    // and expert init so that the routing and the experts matter to the logits
    for (const ParamInfo& p : layout.params) {
      const bool normal = p.init == ParamInfo::Init::Normal;
      const bool router = p.name.find(".mlp.router.") != std::string::npos ||
                          p.name.find(".mlp.shared_experts.gate.") != std::string::npos;
      const float gain = router ? 20.0f : p.name.find("_experts.") != std::string::npos && normal ? 5.0f : 1.0f;
      for (int64_t e = 0; e < p.numel; ++e) {
        float& x = host[size_t(p.offset + e)];
        x = gain * x + (normal ? 0.0f : 0.1f * normal_at(9, stream_id(p.name), uint64_t(e)));
      }
    }
    params = ops->alloc(size_t(layout.total));
    ops->to_device(params, host.data(), host.size());
  }
  ~MoEModel() { ops->free(params); }
  const float* p(const std::string& name) const { return params + layout.find(name)->offset; }

  // The training forward of one micro-batch of one sequence with dims td (d, or d with another
  // router): the S x V logits of the final norm and the LM head, as GPTStage::loss computes them;
  // loss: GPTStage's loss of the targets.
  std::vector<float> training_logits(const GPTDims& td, const std::vector<int32_t>& tokens, double* loss = nullptr) {
    const int64_t S = td.S, C = td.C, V = td.V;
    auto self = make_self_comm();
    float* grads = ops->alloc(size_t(layout.total));
    std::vector<float> full(static_cast<size_t>(S * V));
    {
      GPTStage stage(td, layout, *ops, *self, params, grads, 1, 1);
      if (MoEMLP* moe = stage.moe(); moe && td.moe.router.expert_bias)  // as the trainer loads them
        for (size_t i = 0; i < moe->layers().size(); ++i) moe->expert_bias(i) = expert_bias.at(size_t(moe->layers()[i]));
      stage.forward(0, tokens.data(), nullptr);
      std::vector<float> ln(static_cast<size_t>(S * C)), mean(static_cast<size_t>(S)), rstd(static_cast<size_t>(S));
      const ParamInfo* b = layout.find("ln_f.bias");
      ops->layernorm_forward(ln.data(), mean.data(), rstd.data(), stage.output(0), p("ln_f.weight"),
                             b ? params + b->offset : nullptr, S, C, td.eps);
      ops->linear_forward(full.data(), ln.data(), p("wte.weight"), nullptr, S, C, V);
      if (loss) *loss = stage.loss(0, tokens.data() + 1, 1.0f, false);
    }
    ops->free(grads);
    return full;
  }
};

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

void PrintTo(const MoEVariant& v, std::ostream* os) { *os << v.name; }

std::string variant_name(const ::testing::TestParamInfo<MoEVariant>& info) { return info.param.name; }

class InferenceMoE : public ::testing::TestWithParam<MoEVariant> {};

TEST_P(InferenceMoE, KvCachedLogitsEqualTheTrainingForward) {
  const MoEVariant& v = GetParam();
  MoEModel m(v);
  const GPTDims& d = m.d;
  const int64_t S = d.S, V = d.V;
  ASSERT_TRUE(d.moe.any());
  for (int64_t l = 0; l < d.L; ++l)
    EXPECT_EQ(m.layout.find("h." + std::to_string(l) + ".mlp.router.weight") != nullptr, d.moe.is_moe(l)) << l;
  EXPECT_EQ(m.layout.find("h.0.mlp.experts.fc2.bias") != nullptr, v.bias && d.moe.is_moe(0));
  EXPECT_EQ(m.layout.find("h.2.mlp.shared_experts.fc1.weight") != nullptr, v.shared != 0);
  EXPECT_EQ(m.layout.find("h.2.mlp.shared_experts.gate.weight") != nullptr, v.shared_gate);
  const std::vector<int32_t> tokens = tokens_of(S + 1, V, 3);  // inputs [0, S), targets [1, S + 1)

  // the dropless training forward (the config's router without its capacity)
  GPTDims dropless = d;
  dropless.moe.router.capacity_factor = 0;
  double stage_loss = 0;
  const std::vector<float> full = m.training_logits(dropless, tokens, &stage_loss);
  const double xent = sequence_xent(full, tokens.data() + 1, S, V);
  EXPECT_NEAR(xent, stage_loss, 1e-5 * std::abs(stage_loss)) << "the logits above are the ones the trainer uses";
  if (v.capacity != 0) {  // the capacity binds in the training forward; generation ignores it
    const std::vector<float> capped = m.training_logits(d, tokens);
    EXPECT_GT(max_abs_diff(capped, full), 1e-3) << "the capacity should drop assignments in the training forward";
  }

  // The whole sequence in one pass, then prompts and one token at a time against the KV cache
  GPTInference inf(d, m.layout, *m.ops, m.params, m.expert_bias);
  expect_cached_decoding_equals(inf, tokens, full, S, V);
  // chunks of several tokens: every call's own token count routed and dispatched
  std::vector<float> logits;
  inf.reset();
  for (int64_t t0 : {int64_t(0), int64_t(3), int64_t(4), int64_t(9)}) {
    const int64_t n = (t0 == 0 ? 3 : t0 == 3 ? 1 : t0 == 4 ? 5 : S - 9);
    inf.forward(std::span<const int32_t>(tokens.data() + t0, size_t(n)), logits, true);
    expect_close(logits.data(), full.data() + t0 * V, n * V, "chunk at " + std::to_string(t0));
  }
  EXPECT_EQ(inf.length(), S);
}

// The routed experts are not a no-op: zeroing the MoE layers' experts' fc2 (their output) changes
// generation's logits; nor is the expert bias.
TEST_P(InferenceMoE, TheExpertsMatter) {
  MoEModel m(GetParam());
  const std::vector<int32_t> tokens = tokens_of(m.d.S, m.d.V, 3);
  std::vector<float> with, without;
  {
    GPTInference inf(m.d, m.layout, *m.ops, m.params, m.expert_bias);
    inf.forward(tokens, with, true);
  }
  if (GetParam().expert_bias) {  // the bias chooses experts: a zero bias routes otherwise
    std::vector<std::vector<float>> zero = m.expert_bias;
    for (auto& b : zero) std::fill(b.begin(), b.end(), 0.0f);
    std::vector<float> unbiased;
    GPTInference inf(m.d, m.layout, *m.ops, m.params, zero);
    inf.forward(tokens, unbiased, true);
    EXPECT_GT(max_abs_diff(with, unbiased), 1e-3);
  }
  for (int64_t l = 0; l < m.d.L; ++l)
    for (const char* t : {"experts.fc2.weight", "experts.fc2.bias"})
      if (const ParamInfo* p = m.layout.find("h." + std::to_string(l) + ".mlp." + t))
        std::fill_n(m.params + p->offset, p->numel, 0.0f);
  GPTInference inf(m.d, m.layout, *m.ops, m.params, m.expert_bias);
  inf.forward(tokens, without, true);
  EXPECT_GT(max_abs_diff(with, without), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Variants, InferenceMoE, ::testing::ValuesIn(kVariants), variant_name);

// meta.json's config (config_to_json of a loaded config) gives back every MoE key generation uses.
TEST(CheckpointModelConfig, ReadsTheMoEKeys) {
  using config_test::kBase;
  for (const char* freq : {"model.moe_layer_freq=[0, 1]", "model.moe_layer_freq=2"}) {
    const Config c = parse_config(
        kBase, "test.yaml",
        {"model.num_moe_experts=6", "model.moe_ffn_hidden_size=24", freq, "model.moe_router_topk=2",
         "model.moe_router_score_function=sigmoid", "model.moe_router_topk_scaling_factor=2.5",
         "model.moe_router_num_groups=3", "model.moe_router_group_topk=1", "model.moe_aux_loss_coeff=0.01",
         "model.moe_router_load_balancing_type=seq_aux_loss", "model.moe_z_loss_coeff=0.001",
         "model.moe_expert_capacity_factor=1.5", "model.moe_token_drop_policy=position",
         "model.moe_pad_expert_input_to_capacity=true", "model.moe_shared_expert_intermediate_size=40",
         "model.moe_shared_expert_gate=true", "model.moe_router_enable_expert_bias=true",
         "model.moe_router_bias_update_rate=0.01"});
    const nlohmann::json meta = {{"config", config_to_json(c)}};
    const ModelConfig got = checkpoint_model_config(meta);
    const ModelConfig& want = c.model;
    EXPECT_EQ(got.num_moe_experts, 6);
    EXPECT_EQ(got.moe_ffn_hidden_size, want.moe_ffn_hidden_size);
    EXPECT_EQ(got.moe_layer_freq, want.moe_layer_freq) << freq;
    EXPECT_EQ(got.moe_shared_expert_intermediate_size, 40);
    EXPECT_TRUE(got.moe_shared_expert_gate);
    for (int64_t l = 0; l < want.num_layers; ++l) EXPECT_EQ(got.is_moe_layer(l), want.is_moe_layer(l));
    const RouterOptions a = router_options(got), b = router_options(want);
    EXPECT_EQ(a.E, b.E);
    EXPECT_EQ(a.k, b.k);
    EXPECT_EQ(a.score, b.score);
    EXPECT_EQ(a.pre_softmax, b.pre_softmax);
    EXPECT_EQ(a.scaling, b.scaling);
    EXPECT_EQ(a.groups, b.groups);
    EXPECT_EQ(a.group_topk, b.group_topk);
    EXPECT_EQ(a.capacity_factor, b.capacity_factor);
    EXPECT_EQ(a.drop, b.drop);
    EXPECT_EQ(a.pad_to_capacity, b.pad_to_capacity);
    EXPECT_EQ(a.balancing, b.balancing);
    EXPECT_EQ(a.aux_coeff, b.aux_coeff);
    EXPECT_EQ(a.z_coeff, b.z_coeff);
    EXPECT_TRUE(a.expert_bias);
    EXPECT_EQ(a.bias_update_rate, b.bias_update_rate);
    // the parameter layout follows: the same tensors, shapes included
    Config back;
    back.model = got;
    const ParamLayout la = make_param_layout(make_dims(back, 1, 0, 1, 0)), lb = make_param_layout(make_dims(c, 1, 0, 1, 0));
    ASSERT_EQ(la.params.size(), lb.params.size());
    for (size_t i = 0; i < la.params.size(); ++i) {
      EXPECT_EQ(la.params[i].name, lb.params[i].name);
      EXPECT_EQ(la.params[i].global_shape, lb.params[i].global_shape);
    }
  }
  // a dense model stays dense; inconsistent MoE keys are an InputError
  const Config dense = parse_config(kBase, "test.yaml");
  EXPECT_FALSE(checkpoint_model_config({{"config", config_to_json(dense)}}).is_moe());
  nlohmann::json bad = {{"config", config_to_json(parse_config(kBase, "test.yaml", {"model.num_moe_experts=4"}))}};
  bad["config"]["model"]["moe_router_topk"] = 5;
  EXPECT_THROW(checkpoint_model_config(bad), InputError);
  bad["config"]["model"]["moe_router_topk"] = 2;
  bad["config"]["model"]["moe_layer_freq"] = nlohmann::json::array({1, 0, 1});  // 2 layers
  EXPECT_THROW(checkpoint_model_config(bad), InputError);
  bad["config"]["model"]["moe_layer_freq"] = 1;
  bad["config"]["model"]["moe_router_enable_expert_bias"] = true;  // with softmax scores
  try {
    checkpoint_model_config(bad);
    ADD_FAILURE() << "the expert bias with softmax scores read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("moe_router_enable_expert_bias"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tpt
