// Config loading of the model-family keys: the GPT-2 defaults, the LLaMA keys (RMSNorm, SwiGLU, RoPE
// and its Llama 3 scaling, grouped-query attention, head dim) and their errors and TP constraints.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "core/config.h"
#include "core/error.h"

namespace tpt {
namespace {

namespace fs = std::filesystem;
using namespace config_test;

TEST(ConfigModel, Gpt2DefaultsUnchanged) {
  const Config c = parse_config(kBase, "test.yaml");
  const ModelConfig& m = c.model;
  EXPECT_EQ(m.normalization, Normalization::LayerNorm);
  EXPECT_FALSE(m.swiglu);
  EXPECT_EQ(m.position_embedding_type, PositionEmbedding::LearnedAbsolute);
  EXPECT_DOUBLE_EQ(m.rotary_base, 10000);
  EXPECT_DOUBLE_EQ(m.rotary_percent, 1.0);
  EXPECT_FALSE(m.rotary_interleaved);
  EXPECT_FALSE(m.rope_scaling.enabled());
  EXPECT_EQ(m.rope_scaling, RopeScaling{});
  EXPECT_FALSE(m.group_query_attention);
  EXPECT_EQ(m.num_query_groups, 0);
  EXPECT_EQ(m.kv_channels, 16);  // resolved: hidden_size 64 / 4 heads
  EXPECT_FALSE(m.untie_embeddings_and_output_weights);
  EXPECT_TRUE(m.add_bias_linear);
  EXPECT_FALSE(m.add_qkv_bias);
  EXPECT_FALSE(m.qk_layernorm);
  EXPECT_EQ(m.ffn_hidden_size, 256);
  EXPECT_EQ(query_groups(m), 4);
  EXPECT_EQ(rotary_dim(m), 0);

  const std::string y = config_to_yaml(c);
  EXPECT_HAS(y, "  layernorm_epsilon: 1.0e-05\n  normalization: LayerNorm\n  swiglu: false\n"
                "  position_embedding_type: learned_absolute\n  rotary_base: 10000\n  rotary_percent: 1\n"
                "  rotary_interleaved: false\n  rope_scaling: null\n  group_query_attention: false\n"
                "  num_query_groups: null\n  kv_channels: 16\n  untie_embeddings_and_output_weights: false\n"
                "  add_bias_linear: true\n  add_qkv_bias: false\n  qk_layernorm: false\n  init_method_std: 0.02\n");
  const nlohmann::json j = config_to_json(c)["model"];
  EXPECT_EQ(j["normalization"], "LayerNorm");
  EXPECT_EQ(j["position_embedding_type"], "learned_absolute");
  EXPECT_TRUE(j["rope_scaling"].is_null());
  EXPECT_TRUE(j["num_query_groups"].is_null());
  EXPECT_EQ(j["kv_channels"], 16);
  EXPECT_EQ(j["add_bias_linear"], true);

  // The rotary keys at their defaults are accepted with learned_absolute (the resolved YAML lists them).
  const Config d = parse_config(kBase, "test.yaml", {"model.rotary_base=10000", "model.rotary_percent=1.0",
                                                     "model.rotary_interleaved=false", "model.rope_scaling=null"});
  EXPECT_EQ(config_to_json(d), config_to_json(c));
}

TEST(ConfigModel, Llama) {
  const Config c = llama_config();
  const ModelConfig& m = c.model;
  EXPECT_EQ(m.normalization, Normalization::RMSNorm);
  EXPECT_TRUE(m.swiglu);
  EXPECT_EQ(m.ffn_hidden_size, 172);
  EXPECT_EQ(m.position_embedding_type, PositionEmbedding::Rope);
  EXPECT_DOUBLE_EQ(m.rotary_base, 500000);
  EXPECT_TRUE(m.group_query_attention);
  EXPECT_EQ(m.num_query_groups, 2);
  EXPECT_EQ(m.kv_channels, 16);
  EXPECT_TRUE(m.untie_embeddings_and_output_weights);
  EXPECT_FALSE(m.add_bias_linear);
  EXPECT_EQ(m.rope_scaling, (RopeScaling{8, 1, 4, 8192}));
  EXPECT_TRUE(m.rope_scaling.enabled());
  EXPECT_EQ(query_groups(m), 2);
  EXPECT_EQ(rotary_dim(m), 16);
  EXPECT_EQ(rotary_dim(llama_config({"model.rotary_percent=0.5"}).model), 8);
  EXPECT_EQ(rotary_dim(llama_config({"model.kv_channels=40", "model.rotary_percent=0.4"}).model), 16);

  const std::string y = config_to_yaml(c);
  EXPECT_HAS(y, "  normalization: RMSNorm\n  swiglu: true\n  position_embedding_type: rope\n"
                "  rotary_base: 500000\n  rotary_percent: 1\n  rotary_interleaved: false\n"
                "  rope_scaling: {factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
                "original_max_position_embeddings: 8192}\n  group_query_attention: true\n  num_query_groups: 2\n");
  const nlohmann::json j = config_to_json(c)["model"];
  EXPECT_EQ(j["rope_scaling"], nlohmann::json({{"factor", 8.0},
                                                {"low_freq_factor", 1.0},
                                                {"high_freq_factor", 4.0},
                                                {"original_max_position_embeddings", 8192}}));
  EXPECT_EQ(j["normalization"], "RMSNorm");
  EXPECT_EQ(j["num_query_groups"], 2);
  // The JSON (a checkpoint's meta.json) is YAML too: it reads back to the same config.
  EXPECT_EQ(config_to_json(parse_config(config_to_json(c).dump(), "meta.json")), config_to_json(c));

  // rope_scaling from a block map in the file, and cleared by --set ...=null
  const std::string file = with_model("  position_embedding_type: rope\n  rope_scaling:\n    factor: 32\n"
                                      "    low_freq_factor: 1\n    high_freq_factor: 4.5\n"
                                      "    original_max_position_embeddings: 8192\n");
  EXPECT_EQ(parse_config(file, "test.yaml").model.rope_scaling, (RopeScaling{32, 1, 4.5, 8192}));
  EXPECT_FALSE(parse_config(file, "test.yaml", {"model.rope_scaling=null"}).model.rope_scaling.enabled());
  EXPECT_FALSE(llama_config({"model.rope_scaling=null"}).model.rope_scaling.enabled());
}

TEST(ConfigModel, HeadDim) {
  // kv_channels given: hidden_size need not divide by the heads
  Config c = parse_config(kBase, "test.yaml", {"model.num_attention_heads=5", "model.kv_channels=16"});
  EXPECT_EQ(c.model.kv_channels, 16);
  c = parse_config(kBase, "test.yaml", {"model.kv_channels=32"});  // heads * kv_channels != hidden_size is fine
  EXPECT_EQ(c.model.kv_channels, 32);
  std::string m = error_of_set("model.num_attention_heads=5");
  EXPECT_HAS(m, "model.hidden_size: 64 is not divisible by model.num_attention_heads (5)");
  EXPECT_HAS(m, "model.kv_channels");
  EXPECT_HAS(error_of_set("model.kv_channels=0"), "model.kv_channels: must be >= 1, got 0 (use null");
  EXPECT_HAS(error_of_set("model.kv_channels=-4"), "model.kv_channels: must be >= 1");
  EXPECT_HAS(error_of_set("model.kv_channels=100000"), "model.kv_channels: must be <= 65536");
  m = error_of(kBase, {"model.num_attention_heads=65536", "model.hidden_size=65536", "model.kv_channels=128"});
  EXPECT_HAS(m, "model.kv_channels: model.num_attention_heads (65536) * model.kv_channels (128) must be <=");
}

TEST(ConfigModel, GroupQueryAttention) {
  Config c = parse_config(kBase, "test.yaml", {"model.group_query_attention=true", "model.num_query_groups=1"});
  EXPECT_EQ(query_groups(c.model), 1);
  c = parse_config(kBase, "test.yaml", {"model.group_query_attention=true", "model.num_query_groups=4"});
  EXPECT_EQ(query_groups(c.model), 4);

  std::string m = error_of_set("model.group_query_attention=true");
  EXPECT_EQ(m.rfind("--set model.group_query_attention=true: model.group_query_attention: ", 0), 0u) << m;
  EXPECT_HAS(m, "model.num_query_groups");
  m = error_of(with_model("  group_query_attention: true\n"));  // from the file
  EXPECT_EQ(m.rfind("test.yaml: model.group_query_attention: true needs model.num_query_groups", 0), 0u) << m;

  m = error_of_set("model.num_query_groups=2");
  EXPECT_HAS(m, "model.num_query_groups: is only used with model.group_query_attention: true");
  EXPECT_TRUE(parse_config(kBase, "test.yaml", {"model.num_query_groups=null"}).model.num_query_groups == 0);

  m = error_of(kBase, {"model.group_query_attention=true", "model.num_query_groups=3"});
  EXPECT_HAS(m, "model.num_attention_heads: 4 is not divisible by model.num_query_groups (3)");
  EXPECT_EQ(m.rfind("--set model.num_query_groups=3: ", 0), 0u) << m;  // blamed on the override that gave it
  m = error_of(kBase, {"model.group_query_attention=true", "model.num_query_groups=8"});
  EXPECT_HAS(m, "model.num_attention_heads: 4 is not divisible by model.num_query_groups (8)");
  EXPECT_HAS(error_of(kBase, {"model.group_query_attention=true", "model.num_query_groups=0"}),
             "model.num_query_groups: must be >= 1");
}

TEST(ConfigModel, Swiglu) {
  std::string m = error_of_set("model.swiglu=true");
  EXPECT_HAS(m, "model.swiglu: give model.ffn_hidden_size explicitly with model.swiglu "
                "(Llama 3 8B: 14336 for hidden 4096");
  m = error_of(kBase, {"model.ffn_hidden_size=100", "model.swiglu=true", "model.ffn_hidden_size=null"});
  EXPECT_HAS(m, "model.swiglu: give model.ffn_hidden_size explicitly");
  Config c = parse_config(kBase, "test.yaml", {"model.swiglu=true", "model.ffn_hidden_size=172"});
  EXPECT_TRUE(c.model.swiglu);
  EXPECT_EQ(c.model.ffn_hidden_size, 172);
  c = parse_config(with_model("  ffn_hidden_size: 256\n  swiglu: true\n"), "test.yaml");
  EXPECT_TRUE(c.model.swiglu);
}

TEST(ConfigModel, Rope) {
  const std::string rope = "model.position_embedding_type=rope";
  Config c = parse_config(kBase, "test.yaml", {rope, "model.rotary_percent=0.5", "model.rotary_interleaved=true"});
  EXPECT_EQ(rotary_dim(c.model), 8);
  EXPECT_TRUE(c.model.rotary_interleaved);
  c = parse_config(kBase, "test.yaml", {rope, "model.rotary_percent=0.125"});  // 16 * 0.125 = 2
  EXPECT_EQ(rotary_dim(c.model), 2);

  struct Case {
    std::vector<std::string> sets;
    std::vector<const char*> expect;
  } cases[] = {
      {{rope, "model.rotary_percent=0"}, {"model.rotary_percent: must be in (0, 1], got 0"}},
      {{rope, "model.rotary_percent=-0.5"}, {"model.rotary_percent: must be in (0, 1]"}},
      {{rope, "model.rotary_percent=1.5"}, {"model.rotary_percent: must be in (0, 1], got 1.5"}},
      {{rope, "model.rotary_percent=0.0625"},  // 16 * 0.0625 = 1: odd
       {"model.rotary_percent: model.kv_channels (16) * model.rotary_percent (0.0625) = 1 is not an even integer"}},
      {{rope, "model.rotary_percent=0.3"}, {"model.rotary_percent:", "model.kv_channels (16)", "= 4.8 is not an even"}},
      {{rope, "model.kv_channels=18", "model.rotary_percent=0.5"}, {"model.kv_channels (18)", "= 9 is not an even"}},
      {{rope, "model.rotary_base=0"}, {"model.rotary_base: must be > 0, got 0"}},
      {{rope, "model.rotary_base=-10000"}, {"model.rotary_base: must be > 0"}},
      {{"model.rotary_base=500000"},
       {"model.rotary_base: only used with position_embedding_type: rope",
        "(model.position_embedding_type is learned_absolute)"}},
      {{"model.rotary_percent=0.5"}, {"model.rotary_percent: only used with position_embedding_type: rope"}},
      {{"model.rotary_interleaved=true"}, {"model.rotary_interleaved: only used with position_embedding_type: rope"}},
      {{"model.rope_scaling={factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192}"},
       {"model.rope_scaling: only used with position_embedding_type: rope", "model.position_embedding_type"}},
      {{rope, "model.rotary_base=500000", "model.position_embedding_type=learned_absolute"},
       {"model.rotary_base: only used with position_embedding_type: rope"}},
  };
  for (const Case& k : cases) {
    std::string m = error_of(kBase, k.sets);
    EXPECT_EQ(m.rfind("--set ", 0), 0u) << m;
    for (const char* e : k.expect) EXPECT_HAS(m, e);
  }
  std::string m = error_of(with_model("  rotary_base: 500000\n"));
  EXPECT_EQ(m, "test.yaml: model.rotary_base: only used with position_embedding_type: rope "
               "(model.position_embedding_type is learned_absolute)");
}

TEST(ConfigModel, RopeScalingErrors) {
  const std::string rope = "model.position_embedding_type=rope";
  auto with = [&](const std::string& map) { return error_of(kBase, {rope, "model.rope_scaling=" + map}); };
  const std::string full = "factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192";
  struct Case {
    std::string map;
    std::vector<const char*> expect;
  } cases[] = {
      {"8", {"model.rope_scaling: expected null or a map {factor, low_freq_factor,", "got '8'"}},
      {"[8, 1, 4, 8192]", {"model.rope_scaling: expected null or a map", "got a list of 4"}},
      {"{}", {"model.rope_scaling.factor: missing required key"}},
      {"{factor: 8, low_freq_factor: 1, high_freq_factor: 4}",
       {"model.rope_scaling.original_max_position_embeddings: missing required key"}},
      {"{factor: 8, high_freq_factor: 4, original_max_position_embeddings: 8192}",
       {"model.rope_scaling.low_freq_factor: missing required key"}},
      {"{" + full + ", facter: 2}", {"model.rope_scaling.facter: unknown key (did you mean 'model.rope_scaling.factor'?)"}},
      {"{" + full + ", low_freq: 2}", {"model.rope_scaling.low_freq: unknown key"}},
      {"{" + full + ", rope_typ: llama3}", {"model.rope_scaling.rope_typ: unknown key (did you mean 'model.rope_scaling.rope_type'?)"}},
      {"{" + full + ", zzzzzzzz: 1}", {"model.rope_scaling.zzzzzzzz: unknown key (rope_scaling holds"}},
      {"{" + full + ", rope_type: linear}", {"model.rope_scaling.rope_type: only 'llama3' is supported, got 'linear'"}},
      {"{" + full + ", rope_type: [llama3]}", {"model.rope_scaling.rope_type: only 'llama3' is supported"}},
      {"{" + full + ", factor: 2}", {"model.rope_scaling.factor: duplicate key"}},
      {"{factor: 0, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192}",
       {"model.rope_scaling.factor: must be > 0, got 0"}},
      {"{factor: -8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192}",
       {"model.rope_scaling.factor: must be > 0, got -8"}},
      {"{factor: eight, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192}",
       {"model.rope_scaling.factor: expected a number, got 'eight'"}},
      {"{factor: 8, low_freq_factor: 0, high_freq_factor: 4, original_max_position_embeddings: 8192}",
       {"model.rope_scaling.low_freq_factor: must be > 0"}},
      {"{factor: 8, low_freq_factor: 1, high_freq_factor: null, original_max_position_embeddings: 8192}",
       {"model.rope_scaling.high_freq_factor: expected a number, got null"}},
      {"{factor: 8, low_freq_factor: 4, high_freq_factor: 4, original_max_position_embeddings: 8192}",
       {"model.rope_scaling.high_freq_factor: 4 must be greater than model.rope_scaling.low_freq_factor (4)"}},
      {"{factor: 8, low_freq_factor: 4, high_freq_factor: 1, original_max_position_embeddings: 8192}",
       {"model.rope_scaling.high_freq_factor: 1 must be greater than model.rope_scaling.low_freq_factor (4)"}},
      {"{factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 0}",
       {"model.rope_scaling.original_max_position_embeddings: must be >= 1, got 0"}},
      {"{factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192.5}",
       {"model.rope_scaling.original_max_position_embeddings: expected an integer, got '8192.5'"}},
      {"{factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 99999999999999999999}",
       {"model.rope_scaling.original_max_position_embeddings: 99999999999999999999 is out of range"}},
      {"{factor: '8', low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192}",
       {"model.rope_scaling.factor: expected a number"}},
  };
  for (const Case& k : cases) {
    std::string m = with(k.map);
    EXPECT_EQ(m.rfind("--set model.rope_scaling=", 0), 0u) << m;
    for (const char* e : k.expect) EXPECT_HAS(m, e);
  }
  // In the file: the message names the file.
  std::string m = error_of(with_model("  position_embedding_type: rope\n  rope_scaling:\n    factor: 8\n"));
  EXPECT_EQ(m.rfind("test.yaml: model.rope_scaling.low_freq_factor: missing required key", 0), 0u) << m;
  // rope_type llama3 (HF's configs carry it) is accepted and not kept.
  Config c = parse_config(kBase, "test.yaml", {rope, "model.rope_scaling={" + full + ", rope_type: llama3}"});
  EXPECT_EQ(c.model.rope_scaling, (RopeScaling{8, 1, 4, 8192}));
  EXPECT_EQ(config_to_json(c)["model"]["rope_scaling"].size(), 4u);
}

TEST(ConfigModel, ResolveParallelGroups) {
  // 8 heads in 2 key/value groups: TP 2 splits the groups, TP 4 cannot
  Config c = parse_config(kBase, "test.yaml",
                          {"model.num_attention_heads=8", "model.group_query_attention=true", "model.num_query_groups=2"});
  Config r = c;
  r.parallel.tensor_model_parallel_size = 2;
  resolve_parallel(r, 2);
  r = c;
  r.parallel.tensor_model_parallel_size = 4;
  std::string m = resolve_error(r, 4);
  EXPECT_HAS(m, "model.num_query_groups (2) is not divisible by parallel.tensor_model_parallel_size (4)");
  // without GQA the heads are split: 8 heads over TP 4 is fine
  r.model.group_query_attention = false;
  r.model.num_query_groups = 0;
  resolve_parallel(r, 4);
  r.parallel.tensor_model_parallel_size = 16;
  r.model.ffn_hidden_size = 256;
  EXPECT_HAS(resolve_error(r, 16), "model.num_attention_heads (8) is not divisible by parallel.tensor_model_parallel_size (16)");
}

// ... and so must its LLaMA one (every LLaMA-family key).
TEST(ConfigFiles, CliFixtureLlamaIsValid) {
  fs::path llama = fs::path(__FILE__).parent_path().parent_path() / "cli" / "bad_configs" / "llama_valid.yaml";
  if (!fs::exists(llama)) GTEST_SKIP() << llama << " not found";
  Config c = load_config(llama.string());
  resolve_parallel(c, 2);
  EXPECT_EQ(c.model.rope_scaling, (RopeScaling{8, 1, 4, 8192}));
  EXPECT_EQ(query_groups(c.model), 2);
}

}  // namespace
}  // namespace tpt
