// Hugging Face Llama checkpoints in and out (interop/hf/llama.h): the import on every rank of TP x PP
// layouts against the export's inverse (each HF tensor back bit for bit, for grouped and multi-head
// QKV, interleaved RoPE, biases, tied embeddings), the import's index checks, config.json against the
// model config (every key named with both values), 16-bit safetensors writing and --max-shard-size.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli.h"  // parse_byte_size (export --max-shard-size)
#include "core/dtype.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "interop/hf/llama.h"
#include "model/gpt.h"
#include "tests/common/tiny_config.h"

namespace tpt {
namespace {

namespace fs = std::filesystem;

#define EXPECT_INPUT_ERROR(stmt, text)                                            \
  do {                                                                            \
    try {                                                                         \
      stmt;                                                                       \
      ADD_FAILURE() << "no InputError from " #stmt;                               \
    } catch (const InputError& e) {                                               \
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what(); \
    }                                                                             \
  } while (0)

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::temp_directory_path() / ("hf_llama_test_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter()++)))
               .string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

struct Variant {
  bool gqa = true, bias = false, tied = false, interleaved = false;
  int moe = 0;  // 1: Mixtral (every layer MoE), 2: Qwen2-MoE (layer 0 dense, a gated shared expert, q/k/v biases),
                // 3: Qwen3-MoE (layer 0 dense, q/k norms)
};

Config llama_config(const Variant& v) {
  test::TinyShape s;
  s.layers = 2;
  s.hidden = 16;
  s.heads = 4;
  s.ffn = 12;
  s.vocab = 37;
  Config c = test::tiny_gpt_config(s);
  ModelConfig& m = c.model;
  m.normalization = Normalization::RMSNorm;
  m.swiglu = true;
  m.position_embedding_type = PositionEmbedding::Rope;
  m.rotary_interleaved = v.interleaved;
  m.group_query_attention = v.gqa;
  m.num_query_groups = v.gqa ? 2 : 0;
  m.kv_channels = 6;  // != hidden / heads
  m.untie_embeddings_and_output_weights = !v.tied;
  m.add_bias_linear = v.bias;
  m.rotary_base = 500000;
  m.rope_scaling = {8.0, 1.0, 4.0, 8192};
  if (v.moe) {
    m.num_moe_experts = 4;
    m.moe_ffn_hidden_size = 10;
    m.moe_router_topk = 2;
    c.parallel.expert_tensor_parallel_size = 1;
  }
  if (v.moe == 3) {
    m.moe_layer_freq.every = 0;
    m.moe_layer_freq.pattern = {0, 1};
    m.qk_layernorm = true;
  }
  if (v.moe == 2) {
    m.moe_layer_freq.every = 0;
    m.moe_layer_freq.pattern = {0, 1};
    m.moe_shared_expert_intermediate_size = 8;
    m.moe_shared_expert_gate = true;
    m.add_qkv_bias = true;
    m.moe_router_pre_softmax = true;
  }
  return c;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  f << j.dump(2);
}

// Random HF tensors of the model (every value distinct), written as `shards` files (+ index) in bf16.
std::map<std::string, std::vector<float>> write_hf(const std::string& dir, const ModelConfig& m, int shards,
                                                   DType dtype = DType::BF16) {
  std::map<std::string, std::vector<float>> t;
  std::vector<HFLlamaTensor> list = hf_llama_tensors(m);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const HFLlamaTensor& x : list) {
    std::vector<float>& v = t[x.name];
    v.resize(size_t(x.numel()));
    for (float& f : v) f = round_to(u(rng), dtype);
  }
  write_json(dir + "/config.json", hf_llama_config(m, dtype));
  nlohmann::json wm = nlohmann::json::object();
  const size_t per = (list.size() + size_t(shards) - 1) / size_t(shards);
  for (int s = 0; s < shards; ++s) {
    SafetensorsWriter w;
    const std::string file = shards == 1 ? "model.safetensors" : "model-0000" + std::to_string(s + 1) + "-of-0000" +
                                                                   std::to_string(shards) + ".safetensors";
    for (size_t i = size_t(s) * per; i < std::min(list.size(), size_t(s + 1) * per); ++i) {
      w.add(list[i].name, list[i].shape, t[list[i].name].data(), dtype);
      wm[list[i].name] = file;
    }
    w.write(dir + "/" + file);
  }
  if (shards > 1) write_json(dir + "/model.safetensors.index.json", {{"metadata", {{"total_size", 0}}}, {"weight_map", wm}});
  return t;
}

// Imports `path` on every rank of TP x PP and assembles our global tensors from the ranks' boxes.
// With ep > 1 also on every EP rank (each holding E / ep experts).
std::map<std::string, std::vector<float>> import_all(const Config& cfg, const std::string& path, int tp, int pp,
                                                     int ep = 1) {
  std::map<std::string, std::vector<float>> global;
  for (int er = 0; er < ep; ++er)
  for (int pr = 0; pr < pp; ++pr)
    for (int tr = 0; tr < tp; ++tr) {
      GPTDims d = make_dims(cfg, tp, tr, pp, pr);
      apply_expert_parallel(d, ep, er);
      const ParamLayout layout = make_param_layout(d);
      std::vector<float> params(size_t(layout.total), -7.0f);
      load_hf_llama(path, cfg.model, layout, params.data());
      for (const ParamInfo& p : layout.params) {
        EXPECT_EQ(p.global_shape, llama_global_shape(cfg.model, p.name)) << p.name;
        std::vector<float>& g = global[p.name];
        int64_t n = 1;
        for (int64_t s : p.global_shape) n *= s;
        g.resize(size_t(n), NAN);
        // scatter the box (row-major, box_size) into the global tensor
        const size_t nd = p.global_shape.size();
        std::vector<int64_t> idx(nd, 0);
        int64_t box_n = 1;
        for (int64_t s : p.box_size) box_n *= s;
        for (int64_t k = 0; k < box_n; ++k) {
          int64_t rem = k, at = 0;
          for (size_t a = nd; a-- > 0;) {
            idx[a] = rem % p.box_size[a];
            rem /= p.box_size[a];
          }
          for (size_t a = 0; a < nd; ++a) at = at * p.global_shape[a] + p.box_offset[a] + idx[a];
          g[size_t(at)] = params[size_t(p.offset + k)];
        }
        for (int64_t k = box_n; k < p.numel; ++k) EXPECT_EQ(params[size_t(p.offset + k)], 0.0f) << p.name << " padding";
      }
    }
  return global;
}

void round_trip(const Variant& v, int tp, int pp, int shards, int ep = 1) {
  const Config cfg = llama_config(v);
  TempDir dir;
  const auto hf = write_hf(dir.path, cfg.model, shards);
  const auto global = import_all(cfg, dir.path, tp, pp, ep);
  for (const auto& [name, g] : global)
    for (float x : g) ASSERT_FALSE(std::isnan(x)) << name << ": not covered by the ranks' boxes";
  const std::function<const std::vector<float>&(const std::string&)> read =
      [&](const std::string& n) -> const std::vector<float>& { return global.at(n); };
  for (const HFLlamaTensor& t : hf_llama_tensors(cfg.model)) {
    const std::vector<float> back = t.make(read);
    ASSERT_EQ(back.size(), hf.at(t.name).size()) << t.name;
    for (size_t i = 0; i < back.size(); ++i)
      ASSERT_EQ(float_to_bits(back[i]), float_to_bits(hf.at(t.name)[i])) << t.name << " [" << i << "]";
  }
}

TEST(HFLlama, ImportOnEveryRankThenExportIsTheInput) {
  round_trip({.gqa = true}, 2, 2, 3);
  round_trip({.gqa = true, .interleaved = true}, 2, 1, 1);
  round_trip({.gqa = false, .bias = true, .tied = true}, 2, 2, 2);
  round_trip({.gqa = false, .bias = true, .interleaved = true}, 4, 1, 1);
  round_trip({.gqa = true, .bias = true, .tied = true, .interleaved = true}, 1, 2, 4);
}

// Mixtral, Qwen2-MoE and Qwen3-MoE (interop/hf/moe.cpp): every EP x TP x PP rank reads its experts
// (and the router, the shared expert's TP rows, its gate, the q/k norms); the ranks' boxes cover every tensor and export back
// bit for bit.
TEST(HFLlama, MoEImportOnEveryExpertRankThenExportIsTheInput) {
  round_trip({.gqa = true, .moe = 1}, 1, 1, 2, 4);
  round_trip({.gqa = true, .moe = 1}, 2, 2, 3, 2);
  round_trip({.gqa = false, .moe = 2}, 2, 2, 3, 2);
  round_trip({.gqa = true, .tied = true, .moe = 2}, 1, 1, 1, 4);
  round_trip({.gqa = true, .moe = 3}, 2, 2, 2, 2);
  round_trip({.gqa = true, .interleaved = true, .moe = 3}, 1, 2, 1, 4);
}

TEST(HFLlama, GroupedQKVIsMegatronsLayout) {
  // our grouped qkv [G, Q + 2, D, C]: group g = its query heads g*Q.., then k_proj head g, then v_proj head g
  const Config cfg = llama_config({.gqa = true});
  TempDir dir;
  const auto hf = write_hf(dir.path, cfg.model, 1);
  const auto global = import_all(cfg, dir.path, 1, 1);
  const int64_t C = 16, D = 6, Q = 2;
  const std::vector<float>& qkv = global.at("h.1.attn.qkv.weight");
  const std::vector<float>& q = hf.at("model.layers.1.self_attn.q_proj.weight");
  const std::vector<float>& k = hf.at("model.layers.1.self_attn.k_proj.weight");
  const std::vector<float>& v = hf.at("model.layers.1.self_attn.v_proj.weight");
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t r = 0; r < D; ++r)
      for (int64_t c = 0; c < C; ++c) {
        auto at = [&](int64_t slot) { return qkv[size_t(((g * (Q + 2) + slot) * D + r) * C + c)]; };
        EXPECT_EQ(at(0), q[size_t(((g * Q + 0) * D + r) * C + c)]);
        EXPECT_EQ(at(1), q[size_t(((g * Q + 1) * D + r) * C + c)]);
        EXPECT_EQ(at(2), k[size_t((g * D + r) * C + c)]);
        EXPECT_EQ(at(3), v[size_t((g * D + r) * C + c)]);
      }
  // [gate; up]
  const std::vector<float>& fc1 = global.at("h.0.mlp.fc1.weight");
  EXPECT_EQ(fc1[0], hf.at("model.layers.0.mlp.gate_proj.weight")[0]);
  EXPECT_EQ(fc1[size_t(12 * C)], hf.at("model.layers.0.mlp.up_proj.weight")[0]);
}

TEST(HFLlama, InterleavedPermutesQKRowsPerHead) {
  // with rotary_interleaved our channel 2j + e of a q/k head is HF's e * D/2 + j; v is not permuted
  const Config cfg = llama_config({.gqa = true, .interleaved = true});
  TempDir dir;
  const auto hf = write_hf(dir.path, cfg.model, 1);
  const auto global = import_all(cfg, dir.path, 1, 1);
  const int64_t C = 16, D = 6, Q = 2;
  const std::vector<float>& qkv = global.at("h.0.attn.qkv.weight");
  const std::vector<float>& q = hf.at("model.layers.0.self_attn.q_proj.weight");
  const std::vector<float>& v = hf.at("model.layers.0.self_attn.v_proj.weight");
  for (int64_t ch = 0; ch < D; ++ch) {
    const int64_t hf_ch = (ch % 2) * (D / 2) + ch / 2;
    EXPECT_EQ(qkv[size_t(ch * C)], q[size_t(hf_ch * C)]) << ch;                        // group 0, query head 0
    EXPECT_EQ(qkv[size_t(((Q + 1) * D + ch) * C)], v[size_t(ch * C)]) << ch;             // group 0, value
  }
}

TEST(HFLlama, ConfigMismatchesNameBothValues) {
  const Config cfg = llama_config({});
  const ModelConfig& m = cfg.model;
  const nlohmann::json good = hf_llama_config(m, DType::BF16);
  EXPECT_NO_THROW(check_hf_llama_config(good, m, "cfg"));
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json j = good;
    if (value.is_discarded()) j.erase(key);
    else j[key] = value;
    return j;
  };
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("intermediate_size", 14), m, "cfg"),
                     "cfg: intermediate_size is 14 but model.ffn_hidden_size is 12");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("hidden_size", 32), m, "cfg"), "hidden_size is 32 but model.hidden_size is 16");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("num_hidden_layers", 3), m, "cfg"), "num_hidden_layers is 3 but model.num_layers is 2");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("num_attention_heads", 8), m, "cfg"),
                     "num_attention_heads is 8 but model.num_attention_heads is 4");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("num_key_value_heads", 1), m, "cfg"),
                     "num_key_value_heads is 1 but model.num_query_groups is 2");
  // absent: HF's default (= num_attention_heads)
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("num_key_value_heads", nlohmann::json(nlohmann::json::value_t::discarded)), m, "cfg"),
                     "num_key_value_heads is 4 but model.num_query_groups is 2");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("head_dim", 4), m, "cfg"), "head_dim is 4 but model.kv_channels is 6");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("rms_norm_eps", 1e-6), m, "cfg"),
                     "rms_norm_eps is 1e-06 but model.layernorm_epsilon is 1e-05");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("rope_theta", 10000.0), m, "cfg"),
                     "rope_theta is 10000.0 but model.rotary_base is 500000.0");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("rope_scaling", nullptr), m, "cfg"),
                     "rope_scaling is without scaling but model.rope_scaling is {\"factor\":8.0");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 2.0}}), m, "cfg"),
                     "rope_type \"yarn\"");
  // rope_type wins over the older "type" when both are there (as transformers reads them)
  nlohmann::json both = good;
  both["rope_scaling"]["type"] = "default";
  EXPECT_NO_THROW(check_hf_llama_config(both, m, "cfg"));
  both["rope_scaling"]["rope_type"] = "default";
  both["rope_scaling"]["type"] = "llama3";
  EXPECT_INPUT_ERROR(check_hf_llama_config(both, m, "cfg"), "rope_scaling is without scaling but model.rope_scaling is");
  both["rope_scaling"].erase("rope_type");
  EXPECT_NO_THROW(check_hf_llama_config(both, m, "cfg"));  // "type" alone still counts
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("tie_word_embeddings", true), m, "cfg"),
                     "tie_word_embeddings is true but model.untie_embeddings_and_output_weights is true");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("attention_bias", true), m, "cfg"),
                     "attention_bias is true but model.add_bias_linear is false");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("mlp_bias", true), m, "cfg"), "mlp_bias is true but model.add_bias_linear is false");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("vocab_size", 32000), m, "cfg"), "vocab_size is 32000 but model.vocab_size is 37");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("hidden_act", "gelu"), m, "cfg"), "hidden_act is \"gelu\"");
  EXPECT_INPUT_ERROR(check_hf_llama_config(with("architectures", {"MistralForCausalLM"}), m, "cfg"),
                     "unknown architecture (architectures [\"MistralForCausalLM\"]");
  // transformers 5's rope_parameters form
  nlohmann::json v5 = good;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  EXPECT_NO_THROW(check_hf_llama_config(v5, m, "cfg"));
  v5["rope_parameters"]["rope_theta"] = 1e4;
  EXPECT_INPUT_ERROR(check_hf_llama_config(v5, m, "cfg"), "rope_parameters.rope_theta is 10000.0 but model.rotary_base");
  // the model side: what a Llama checkpoint cannot initialise
  ModelConfig ln = m;
  ln.normalization = Normalization::LayerNorm;
  EXPECT_INPUT_ERROR(check_hf_llama_config(good, ln, "cfg"), "model.normalization is LayerNorm");
  ModelConfig half = m;
  half.rotary_percent = 0.5;
  EXPECT_INPUT_ERROR(check_hf_llama_config(good, half, "cfg"), "model.rotary_percent is 0.5");
  EXPECT_NE(hf_llama_incompatibility(ln).find("model.normalization"), std::string::npos);
  ModelConfig qkv_only = m;
  qkv_only.add_qkv_bias = true;
  EXPECT_NE(hf_llama_incompatibility(qkv_only).find("model.add_qkv_bias"), std::string::npos);
  ModelConfig qk_norm = m;  // Qwen3's q/k norms: no LlamaForCausalLM tensors for them
  qk_norm.qk_layernorm = true;
  EXPECT_NE(hf_llama_incompatibility(qk_norm).find("model.qk_layernorm"), std::string::npos);
  EXPECT_INPUT_ERROR(check_hf_llama_config(good, qk_norm, "cfg"), "model.qk_layernorm is true");
  EXPECT_EQ(hf_llama_incompatibility(m), "");
}

TEST(HFLlama, IndexErrorsNameTheTensorOrShard) {
  const Config cfg = llama_config({});
  const GPTDims d = make_dims(cfg, 1, 0, 1, 0);
  const ParamLayout layout = make_param_layout(d);
  std::vector<float> params(size_t(layout.total));
  auto load = [&](const std::string& p) { load_hf_llama(p, cfg.model, layout, params.data()); };
  {  // a missing shard
    TempDir dir;
    write_hf(dir.path, cfg.model, 3);
    fs::remove(dir.path + "/model-00002-of-00003.safetensors");
    EXPECT_INPUT_ERROR(load(dir.path), "names shard 'model-00002-of-00003.safetensors'");
  }
  {  // a tensor named twice in weight_map (text edited: JSON parsers keep one)
    TempDir dir;
    write_hf(dir.path, cfg.model, 2);
    std::ifstream in(dir.path + "/model.safetensors.index.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("\"model.norm.weight\"");
    ASSERT_NE(at, std::string::npos);
    text.insert(at, "\"model.norm.weight\": \"model-00001-of-00002.safetensors\", ");
    std::ofstream(dir.path + "/model.safetensors.index.json") << text;
    EXPECT_INPUT_ERROR(load(dir.path), "weight_map names tensor 'model.norm.weight' twice");
  }
  {  // a tensor in a shard the index does not map it to
    TempDir dir;
    write_hf(dir.path, cfg.model, 2);
    nlohmann::json idx;
    std::ifstream(dir.path + "/model.safetensors.index.json") >> idx;
    idx["weight_map"].erase("model.norm.weight");
    write_json(dir.path + "/model.safetensors.index.json", idx);
    EXPECT_INPUT_ERROR(load(dir.path + "/model.safetensors.index.json"), "holds tensor 'model.norm.weight', which");
  }
  {  // a missing tensor, an unexpected one, a wrong shape
    TempDir dir;
    const auto t = write_hf(dir.path, cfg.model, 1);
    SafetensorsWriter w;
    for (const auto& x : hf_llama_tensors(cfg.model))
      if (x.name != "lm_head.weight") w.add(x.name, x.shape, t.at(x.name).data());
    w.write(dir.path + "/model.safetensors");
    EXPECT_INPUT_ERROR(load(dir.path), "tensor 'lm_head.weight' is missing (config.json implies shape [37, 16])");
    SafetensorsWriter w2;
    for (const auto& x : hf_llama_tensors(cfg.model)) w2.add(x.name, x.shape, t.at(x.name).data());
    w2.add("model.layers.2.mlp.up_proj.weight", {12, 16}, t.at("model.layers.0.mlp.up_proj.weight").data());
    w2.write(dir.path + "/model.safetensors");
    EXPECT_INPUT_ERROR(load(dir.path), "unexpected tensor 'model.layers.2.mlp.up_proj.weight'");
    SafetensorsWriter w3;
    for (const auto& x : hf_llama_tensors(cfg.model))
      w3.add(x.name, x.name == "model.norm.weight" ? std::vector<int64_t>{4, 4} : x.shape, t.at(x.name).data());
    w3.write(dir.path + "/model.safetensors");
    EXPECT_INPUT_ERROR(load(dir.path + "/config.json"), "tensor 'model.norm.weight' has shape [4, 4], but config.json implies [16]");
  }
  {  // no config.json / an unknown architecture through load_init_from
    TempDir dir;
    write_hf(dir.path, cfg.model, 1);
    fs::remove(dir.path + "/config.json");
    EXPECT_INPUT_ERROR(load(dir.path + "/model.safetensors"), "no config.json beside it");
    nlohmann::json c = hf_llama_config(cfg.model, DType::BF16);
    c["architectures"] = {"Qwen2ForCausalLM"};
    write_json(dir.path + "/config.json", c);
    ModelConfig m = cfg.model;
    m.init_from = dir.path;
    EXPECT_INPUT_ERROR(load_init_from(m, d, layout, params.data()), "unknown architecture");
  }
}

// Shard names are confined to the checkpoint's folder by name: '..' and absolute names are refused
// even when the file they name exists and holds the right tensors; the Hugging Face cache's layout
// (snapshots/<rev>/<shard> a symlink to ../../blobs/<hash>) imports the same numbers as plain files.
TEST(HFLlama, IndexShardNamesStayInsideTheFolder) {
  const Config cfg = llama_config({});
  const GPTDims d = make_dims(cfg, 1, 0, 1, 0);
  const ParamLayout layout = make_param_layout(d);
  std::vector<float> params(size_t(layout.total)), plain(size_t(layout.total));
  auto load = [&](const std::string& p) { load_hf_llama(p, cfg.model, layout, params.data()); };
  TempDir root;
  const std::string dir = root.path + "/ckpt";
  fs::create_directories(dir + "/sub");
  write_hf(dir, cfg.model, 2);
  load(dir);
  plain = params;
  const std::string shard = "model-00001-of-00002.safetensors";
  fs::copy_file(dir + "/" + shard, root.path + "/" + shard);  // outside, and holding the right tensors
  nlohmann::json idx;
  std::ifstream(dir + "/model.safetensors.index.json") >> idx;
  auto with_shard = [&](const std::string& name) {
    nlohmann::json j = idx;
    for (auto& [k, v] : j["weight_map"].items())
      if (v == shard) v = name;
    write_json(dir + "/model.safetensors.index.json", j);
  };
  const std::string head = dir + "/model.safetensors.index.json: weight_map[\"";
  with_shard("../" + shard);
  EXPECT_INPUT_ERROR(load(dir), "names shard '../" + shard + "' has a '..' component");
  EXPECT_INPUT_ERROR(load(dir), head);
  with_shard("sub/../../" + shard);
  EXPECT_INPUT_ERROR(load(dir), "has a '..' component: a file it names must lie inside " + dir);
  with_shard("sub/..");
  EXPECT_INPUT_ERROR(load(dir), "has a '..' component");
  with_shard(root.path + "/" + shard);  // absolute, and it exists: not "does not exist"
  EXPECT_INPUT_ERROR(load(dir), "names shard '" + root.path + "/" + shard + "' is an absolute path");
  with_shard("");
  EXPECT_INPUT_ERROR(load(dir), "names shard '' is empty");
  with_shard("sub/x..safetensors");  // ".." inside a name is no component: a plain missing file
  EXPECT_INPUT_ERROR(load(dir), "names shard 'sub/x..safetensors' (tensor");
  ASSERT_EQ(::mkfifo((dir + "/sub/fifo.safetensors").c_str(), 0600), 0);
  with_shard("sub/fifo.safetensors");  // refused at once, never opened for a blocking read
  EXPECT_INPUT_ERROR(load(dir), "sub/fifo.safetensors: not a regular file (a FIFO)");
  fs::create_directories(dir + "/sub/dir.safetensors");
  with_shard("sub/dir.safetensors");
  EXPECT_INPUT_ERROR(load(dir), "not a regular file (a directory)");

  // the HF cache: snapshots/<rev>/ holds links into ../../blobs/, and "./" names are fine
  const std::string cache = root.path + "/models--x/", snap = cache + "snapshots/abc123";
  fs::create_directories(cache + "blobs");
  fs::create_directories(snap);
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string blob = "blob" + std::to_string(n++);
    fs::copy_file(e.path(), cache + "blobs/" + blob);
    fs::create_symlink("../../blobs/" + blob, snap + "/" + e.path().filename().string());
  }
  nlohmann::json j = idx;
  for (auto& [k, v] : j["weight_map"].items()) v = "./" + v.get<std::string>();
  fs::remove(snap + "/model.safetensors.index.json");
  write_json(snap + "/model.safetensors.index.json", j);
  std::fill(params.begin(), params.end(), -1.0f);
  load(snap);
  EXPECT_EQ(params, plain);
}

TEST(HFLlama, SixteenBitSafetensorsRoundToNearestEven) {
  TempDir dir;
  const std::vector<float> x = {1.0f, -2.5f, bits_to_float(0x3F808000), bits_to_float(0x3F818000), 65504.0f,
                                1e-7f, 3.14159265f, -0.0f};
  SafetensorsWriter w;
  w.add("a", {2, 4}, x.data(), DType::BF16);
  w.add("b", {8}, x.data(), DType::F16);
  w.add("c", {8}, x.data());
  EXPECT_EQ(w.data_bytes(), 16u + 16u + 32u);
  w.write(dir.path + "/x.safetensors");
  SafetensorsReader r(dir.path + "/x.safetensors");
  EXPECT_EQ(r.info("a").dtype, "BF16");
  EXPECT_EQ(r.info("b").dtype, "F16");
  EXPECT_EQ(r.info("c").dtype, "F32");
  EXPECT_EQ(r.info("a").shape, (std::vector<int64_t>{2, 4}));
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t a, b;
    std::memcpy(&a, r.raw("a") + 2 * i, 2);
    std::memcpy(&b, r.raw("b") + 2 * i, 2);
    EXPECT_EQ(a, fp32_to_bf16(x[i])) << i;
    EXPECT_EQ(b, fp32_to_fp16(x[i])) << i;
  }
  uint16_t tie;
  std::memcpy(&tie, r.raw("a") + 2 * 2, 2);
  EXPECT_EQ(tie, 0x3F80);  // 1 + 2^-8: the tie goes to the even 0x3F80
  std::memcpy(&tie, r.raw("a") + 2 * 3, 2);
  EXPECT_EQ(tie, 0x3F82);
  std::vector<float> back(8);
  r.read("c", back.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(float_to_bits(back[i]), float_to_bits(x[i]));
}

TEST(HFLlama, ByteSizes) {
  EXPECT_EQ(parse_byte_size("5GB"), 5000000000);
  EXPECT_EQ(parse_byte_size("100KB"), 100000);
  EXPECT_EQ(parse_byte_size("100kB"), 100000);
  EXPECT_EQ(parse_byte_size("1.5MB"), 1500000);
  EXPECT_EQ(parse_byte_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("123"), 123);
  EXPECT_EQ(parse_byte_size("10 MiB"), 10 << 20);
  for (const char* bad : {"", "GB", "5XB", "-1", "0", "1.2.3GB", "0.1B"})
    EXPECT_INPUT_ERROR(parse_byte_size(bad), "--max-shard-size");
}

}  // namespace
}  // namespace tpt
