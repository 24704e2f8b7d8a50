#include "interop/hf/llama.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/safetensors.h"
#include "interop/hf/gpt2.h"
#include "model/layers.h"

namespace tpt {
namespace {

namespace fs = std::filesystem;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A JSON value as text (numbers in their shortest round-trip form: 1e-05, 500000.0).
std::string jtext(const nlohmann::json& v) { return v.dump(); }

nlohmann::json read_json_file(const std::string& path, const std::string& what,
                              const nlohmann::json::parser_callback_t& cb = nullptr) {
  std::ifstream f(path, std::ios::binary);
  if (!f) input_error(what + ": cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::json::parse(ss.str(), cb);
  } catch (const InputError&) {
    throw;
  } catch (const nlohmann::json::exception& e) {
    input_error(what + ": " + path + " is not valid JSON: " + e.what());
  }
}

std::string parent_dir(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

bool is_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

bool is_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// ---- what model.init_from names ----

enum class HFArch { None, GPT2, Llama, Other };

HFArch architecture_of(const nlohmann::json& cfg, std::string* described) {
  if (!cfg.is_object()) {
    *described = "a " + std::string(cfg.type_name()) + " instead of an object";
    return HFArch::Other;
  }
  const auto arch = cfg.find("architectures");
  const auto type = cfg.find("model_type");
  std::vector<std::string> names;
  if (arch != cfg.end() && arch->is_array())
    for (const auto& a : *arch)
      if (a.is_string()) names.push_back(a.get<std::string>());
  const std::string model_type = type != cfg.end() && type->is_string() ? type->get<std::string>() : "";
  *described = "architectures " + (arch != cfg.end() ? jtext(*arch) : std::string("(none)")) + ", model_type " +
               (model_type.empty() ? std::string("(none)") : "\"" + model_type + "\"");
  auto has = [&](const char* n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  if (has("LlamaForCausalLM")) return HFArch::Llama;
  if (has("GPT2LMHeadModel")) return HFArch::GPT2;
  if (names.empty() && model_type == "llama") return HFArch::Llama;
  if (names.empty() && model_type == "gpt2") return HFArch::GPT2;
  return HFArch::Other;
}

// The config.json that belongs to init_from (empty when there is none) and the directory it lives in.
struct InitPaths {
  std::string dir, config, index, file;  // file: one safetensors file named directly
};

InitPaths init_paths(const std::string& path) {
  InitPaths p;
  if (is_dir(path)) {
    p.dir = path;
  } else {
    p.dir = parent_dir(path);
    const std::string base = fs::path(path).filename().string();
    if (ends_with(base, ".index.json")) p.index = path;
    else if (base == "config.json") p.config = path;
    else p.file = path;
  }
  if (p.config.empty() && is_file(p.dir + "/config.json")) p.config = p.dir + "/config.json";
  return p;
}

// ---- the shards of an HF checkpoint ----

// The tensors of an HF checkpoint: one safetensors file, or the shards an index names. Every shard
// is memory-mapped (its header parsed); reads touch only the rows asked for.
class HFShards {
 public:
  HFShards(const InitPaths& p, const std::string& what) : what_(what) {
    std::string index = p.index;
    std::string single = p.file;
    if (index.empty() && single.empty()) {
      if (is_file(p.dir + "/model.safetensors.index.json")) index = p.dir + "/model.safetensors.index.json";
      else if (is_file(p.dir + "/model.safetensors")) single = p.dir + "/model.safetensors";
      else
        input_error(what + ": " + p.dir + " holds neither model.safetensors nor model.safetensors.index.json");
    }
    if (!index.empty()) open_index(index, p.dir);
    else {
      where_ = single;
      shards_.push_back(std::make_unique<SafetensorsReader>(single));
      for (const std::string& n : shards_.back()->names()) owner_[n] = 0;
    }
  }

  const std::string& where() const { return where_; }
  size_t num_shards() const { return shards_.size(); }
  bool contains(const std::string& name) const { return owner_.count(name) != 0; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, s] : owner_) out.push_back(n);
    return out;
  }
  const SafetensorsReader& shard_of(const std::string& name) const { return *shards_[owner_.at(name)]; }
  std::set<std::string> dtypes() const {
    std::set<std::string> out;
    for (const auto& [n, s] : owner_) out.insert(shards_[s]->info(n).dtype);
    return out;
  }

  // Checks that `name` exists with `shape` (config.json's); returns its file.
  const SafetensorsReader& check(const std::string& name, const std::vector<int64_t>& shape) const {
    auto it = owner_.find(name);
    if (it == owner_.end())
      input_error(what_ + ": " + where_ + ": tensor '" + name + "' is missing (config.json implies shape " +
                  shape_str(shape) + ")");
    const SafetensorsReader& st = *shards_[it->second];
    if (st.info(name).shape != shape)
      input_error(what_ + ": " + st.path() + ": tensor '" + name + "' has shape " + shape_str(st.info(name).shape) +
                  ", but config.json implies " + shape_str(shape));
    return st;
  }

  // rows [r0, r0 + n) of a 1-D or 2-D tensor (checked against `shape`) into out, row-major
  void rows(const std::string& name, const std::vector<int64_t>& shape, int64_t r0, int64_t n, float* out) const {
    const SafetensorsReader& st = check(name, shape);
    if (n == 0) return;
    if (shape.size() == 1) st.read_box(name, std::vector<int64_t>{r0}, std::vector<int64_t>{n}, out);
    else st.read_box(name, std::vector<int64_t>{r0, 0}, std::vector<int64_t>{n, shape[1]}, out);
  }

 private:
  void open_index(const std::string& index, const std::string& dir) {
    where_ = index;
    // A tensor named twice in weight_map: JSON parsers keep one silently, so the keys are seen as
    // they are parsed (depth 1: the top-level keys, depth 2: the keys inside them).
    std::string top;
    std::string twice;
    const nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t ev,
                                                     nlohmann::json& parsed) {
      if (ev == nlohmann::json::parse_event_t::key) {
        const std::string k = parsed.get<std::string>();
        if (depth == 1) {
          top = k;
          seen_.clear();
        } else if (depth == 2 && top == "weight_map" && !seen_.insert(k).second && twice.empty()) {
          twice = k;
        }
      }
      return true;
    };
    const nlohmann::json j = read_json_file(index, what_, cb);
    if (!twice.empty()) input_error(what_ + ": " + index + ": weight_map names tensor '" + twice + "' twice");
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      input_error(what_ + ": " + index + ": no \"weight_map\" object (a Hugging Face model.safetensors.index.json)");
    std::map<std::string, size_t> shard_ids;
    std::vector<std::string> shard_files;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        input_error(what_ + ": " + index + ": weight_map[\"" + it.key() + "\"] is " + jtext(it.value()) +
                    ", not a file name");
      const std::string file = it.value().get<std::string>();
      auto [s, fresh] = shard_ids.emplace(file, shard_files.size());
      if (fresh) {
        const std::string path = dir + "/" + file;
        if (file.empty() || fs::path(file).is_absolute() || !is_file(path))
          input_error(what_ + ": " + index + " names shard '" + file + "' (tensor '" + it.key() +
                      "'), which does not exist: " + path);
        shard_files.push_back(path);
      }
      owner_[it.key()] = s->second;
    }
    if (shard_files.empty()) input_error(what_ + ": " + index + ": weight_map is empty");
    for (const std::string& f : shard_files) shards_.push_back(std::make_unique<SafetensorsReader>(f));
    // every tensor of the index in its shard; no tensor in two shards or outside the index
    for (const auto& [name, s] : owner_)
      if (!shards_[s]->contains(name))
        input_error(what_ + ": " + index + " maps tensor '" + name + "' to " + shard_files[s] +
                    ", which does not hold it");
    for (size_t s = 0; s < shards_.size(); ++s)
      for (const std::string& name : shards_[s]->names()) {
        auto it = owner_.find(name);
        if (it == owner_.end())
          input_error(what_ + ": " + shard_files[s] + " holds tensor '" + name + "', which " + index +
                      " does not name");
        if (it->second != s)
          input_error(what_ + ": tensor '" + name + "' is in two shards: " + shard_files[s] + " and " +
                      shard_files[it->second] + " (the index names the latter)");
      }
  }

  std::string what_, where_;
  std::vector<std::unique_ptr<SafetensorsReader>> shards_;
  std::map<std::string, size_t> owner_;
  std::set<std::string> seen_;
};

// ---- config.json ----

// HF's RoPE settings: rope_theta and rope_scaling (Llama 3.1's "llama3", or none), from the legacy keys
// (rope_theta, rope_scaling) or transformers 5's rope_parameters.
struct HFRope {
  double theta = 10000.0;
  RopeScaling scaling;
  nlohmann::json scaling_json;  // as written (for messages)
};

HFRope hf_rope(const nlohmann::json& hf, const std::string& where) {
  HFRope r;
  auto num = [&](const nlohmann::json& obj, const char* key, const std::string& ctx) {
    if (!obj.contains(key) || !obj[key].is_number())
      input_error(where + ": " + ctx + "." + key + " is " + (obj.contains(key) ? jtext(obj[key]) : "missing") +
                  " (a number is needed)");
    return obj[key].get<double>();
  };
  auto scaling = [&](const nlohmann::json& s, const std::string& ctx) {
    std::string type = "default";
    for (const char* k : {"rope_type", "type"})
      if (s.contains(k) && s[k].is_string()) type = s[k].get<std::string>();
    if (type == "default") return;
    if (type != "llama3")
      input_error(where + ": " + ctx + " has rope_type \"" + type +
                  "\": tptrain implements Llama 3.1's \"llama3\" scaling only (model.rope_scaling)");
    r.scaling.factor = num(s, "factor", ctx);
    r.scaling.low_freq_factor = num(s, "low_freq_factor", ctx);
    r.scaling.high_freq_factor = num(s, "high_freq_factor", ctx);
    const double orig = num(s, "original_max_position_embeddings", ctx);
    r.scaling.original_max_position_embeddings = int64_t(orig);
    r.scaling_json = s;
  };
  if (hf.contains("rope_parameters") && !hf["rope_parameters"].is_null()) {
    const nlohmann::json& p = hf["rope_parameters"];
    if (!p.is_object()) input_error(where + ": rope_parameters is " + jtext(p) + ", not an object");
    if (p.contains("rope_theta")) r.theta = num(p, "rope_theta", "rope_parameters");
    else if (hf.contains("rope_theta")) r.theta = num(hf, "rope_theta", "config");
    scaling(p, "rope_parameters");
    return r;
  }
  if (hf.contains("rope_theta") && !hf["rope_theta"].is_null()) r.theta = num(hf, "rope_theta", "config");
  if (hf.contains("rope_scaling") && !hf["rope_scaling"].is_null()) {
    if (!hf["rope_scaling"].is_object()) input_error(where + ": rope_scaling is " + jtext(hf["rope_scaling"]));
    scaling(hf["rope_scaling"], "rope_scaling");
  }
  return r;
}

std::string scaling_text(const RopeScaling& s) {
  if (!s.enabled()) return "null";
  return nlohmann::json{{"factor", s.factor},
                        {"low_freq_factor", s.low_freq_factor},
                        {"high_freq_factor", s.high_freq_factor},
                        {"original_max_position_embeddings", s.original_max_position_embeddings}}
      .dump();
}

// The Llama rows of our q/k heads: with interleaved RoPE our channel 2j + e is HF's e * D/2 + j
// (HF: rotate-half pairs (j, j + D/2)); else the same channel.
int64_t hf_channel(int64_t c, int64_t D, bool interleaved) {
  return interleaved ? (c % 2) * (D / 2) + c / 2 : c;
}

struct Dims {
  int64_t L, C, H, G, Q, D, F, V;
  bool bias, untied, interleaved;
};

Dims llama_dims(const ModelConfig& m) {
  Dims d;
  d.L = m.num_layers;
  d.C = m.hidden_size;
  d.H = m.num_attention_heads;
  d.G = query_groups(m);
  d.Q = d.H / d.G;
  d.D = m.kv_channels ? m.kv_channels : d.C / d.H;
  d.F = m.ffn_hidden_size;
  d.V = m.vocab_size;
  d.bias = m.add_bias_linear;
  d.untied = m.untie_embeddings_and_output_weights;
  d.interleaved = m.rotary_interleaved;
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// config.json

void check_hf_llama_config(const nlohmann::json& hf, const ModelConfig& m, const std::string& where) {
  std::string arch;
  if (architecture_of(hf, &arch) != HFArch::Llama)
    input_error(where + ": unknown architecture (" + arch + "): tptrain imports LlamaForCausalLM here");
  // the architecture's fixed parts
  if (hf.contains("hidden_act") && !hf["hidden_act"].is_null() && hf["hidden_act"] != "silu")
    input_error(where + ": hidden_act is " + jtext(hf["hidden_act"]) + ": tptrain's Llama MLP is SwiGLU (silu)");
  if (!m.swiglu) input_error(where + ": hidden_act is \"silu\" (SwiGLU) but model.swiglu is false");
  if (m.normalization != Normalization::RMSNorm)
    input_error(where + ": Llama's norms are RMSNorm but model.normalization is LayerNorm");
  if (m.position_embedding_type != PositionEmbedding::Rope)
    input_error(where + ": Llama's positions are rotary but model.position_embedding_type is learned_absolute");
  if (m.rotary_percent != 1.0)
    input_error(where + ": Llama rotates every channel of a head but model.rotary_percent is " +
                jtext(m.rotary_percent));
  if (m.add_qkv_bias && !m.add_bias_linear)
    input_error(where + ": model.add_qkv_bias: true (a QKV bias alone) has no Llama form (attention_bias is on "
                "q, k, v and o_proj)");

  auto integer = [&](const char* key, int64_t def) -> int64_t {
    if (!hf.contains(key) || hf[key].is_null()) return def;
    if (!hf[key].is_number_integer()) input_error(where + ": " + key + " is " + jtext(hf[key]) + ", not an integer");
    return hf[key].get<int64_t>();
  };
  auto number = [&](const char* key, double def) -> double {
    if (!hf.contains(key) || hf[key].is_null()) return def;
    if (!hf[key].is_number()) input_error(where + ": " + key + " is " + jtext(hf[key]) + ", not a number");
    return hf[key].get<double>();
  };
  auto boolean = [&](const char* key, bool def) -> bool {
    if (!hf.contains(key) || hf[key].is_null()) return def;
    if (!hf[key].is_boolean()) input_error(where + ": " + key + " is " + jtext(hf[key]) + ", not true/false");
    return hf[key].get<bool>();
  };
  auto same_int = [&](const char* key, int64_t got, const std::string& ours, int64_t want) {
    if (got != want)
      input_error(where + ": " + key + " is " + std::to_string(got) + " but " + ours + " is " + std::to_string(want));
  };
  auto same_num = [&](const char* key, double got, const std::string& ours, double want) {
    if (got != want) input_error(where + ": " + key + " is " + jtext(got) + " but " + ours + " is " + jtext(want));
  };
  auto same_bool = [&](const char* key, bool got, const std::string& ours, bool want) {
    if (got != want)
      input_error(where + ": " + key + " is " + (got ? "true" : "false") + " but " + ours + " is " +
                  (want ? "true" : "false"));
  };
  // HF's LlamaConfig defaults for the keys a config.json leaves out
  const int64_t H = integer("num_attention_heads", 32), C = integer("hidden_size", 4096);
  same_int("hidden_size", C, "model.hidden_size", m.hidden_size);
  same_int("intermediate_size", integer("intermediate_size", 11008), "model.ffn_hidden_size", m.ffn_hidden_size);
  same_int("num_hidden_layers", integer("num_hidden_layers", 32), "model.num_layers", m.num_layers);
  same_int("num_attention_heads", H, "model.num_attention_heads", m.num_attention_heads);
  same_int("num_key_value_heads", integer("num_key_value_heads", H),
           m.group_query_attention ? "model.num_query_groups" : "model.num_attention_heads (no group_query_attention)",
           query_groups(m));
  same_int("head_dim", integer("head_dim", H > 0 ? C / H : 0), "model.kv_channels",
           m.kv_channels ? m.kv_channels : m.hidden_size / m.num_attention_heads);
  same_num("rms_norm_eps", number("rms_norm_eps", 1e-6), "model.layernorm_epsilon", m.layernorm_epsilon);
  const HFRope rope = hf_rope(hf, where);
  same_num(hf.contains("rope_parameters") && !hf["rope_parameters"].is_null() ? "rope_parameters.rope_theta"
                                                                             : "rope_theta",
           rope.theta, "model.rotary_base", m.rotary_base);
  if (!(rope.scaling == m.rope_scaling))
    input_error(where + ": " +
                (hf.contains("rope_parameters") && !hf["rope_parameters"].is_null() ? "rope_parameters" : "rope_scaling") +
                " is " + (rope.scaling.enabled() ? jtext(rope.scaling_json) : std::string("without scaling")) +
                " but model.rope_scaling is " + scaling_text(m.rope_scaling));
  if (const bool tie = boolean("tie_word_embeddings", false); tie == m.untie_embeddings_and_output_weights)
    input_error(where + ": tie_word_embeddings is " + (tie ? "true" : "false") +
                " but model.untie_embeddings_and_output_weights is " + (tie ? "true" : "false"));
  same_bool("attention_bias", boolean("attention_bias", false), "model.add_bias_linear", m.add_bias_linear);
  same_bool("mlp_bias", boolean("mlp_bias", false), "model.add_bias_linear", m.add_bias_linear);
  same_int("vocab_size", integer("vocab_size", 32000), "model.vocab_size", m.vocab_size);
}

std::string hf_llama_incompatibility(const ModelConfig& m) {
  if (m.normalization != Normalization::RMSNorm) return "model.normalization is LayerNorm (Llama: RMSNorm)";
  if (!m.swiglu) return "model.swiglu is false (Llama: SwiGLU)";
  if (m.position_embedding_type != PositionEmbedding::Rope)
    return "model.position_embedding_type is learned_absolute (Llama: rope)";
  if (m.rotary_percent != 1.0)
    return "model.rotary_percent is " + jtext(m.rotary_percent) + " (Llama rotates every channel: 1.0)";
  if (m.add_qkv_bias && !m.add_bias_linear)
    return "model.add_qkv_bias is true without model.add_bias_linear (Llama's attention_bias is on q, k, v and o)";
  return "";
}

nlohmann::json hf_llama_config(const ModelConfig& m, DType dtype) {
  const Dims d = llama_dims(m);
  nlohmann::json scaling = nullptr;
  if (m.rope_scaling.enabled())
    scaling = {{"rope_type", "llama3"},
               {"factor", m.rope_scaling.factor},
               {"low_freq_factor", m.rope_scaling.low_freq_factor},
               {"high_freq_factor", m.rope_scaling.high_freq_factor},
               {"original_max_position_embeddings", m.rope_scaling.original_max_position_embeddings}};
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", d.V},
          {"hidden_size", d.C},
          {"intermediate_size", d.F},
          {"num_hidden_layers", d.L},
          {"num_attention_heads", d.H},
          {"num_key_value_heads", d.G},
          {"head_dim", d.D},
          {"hidden_act", "silu"},
          {"max_position_embeddings", m.max_position_embeddings},
          {"initializer_range", m.init_method_std},
          {"rms_norm_eps", m.layernorm_epsilon},
          {"rope_theta", m.rotary_base},
          {"rope_scaling", scaling},
          {"attention_bias", d.bias},
          {"attention_dropout", m.attention_dropout},
          {"mlp_bias", d.bias},
          {"tie_word_embeddings", !d.untied},
          {"pretraining_tp", 1},
          {"use_cache", true},
          {"torch_dtype", dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32"}};
}

// ---------------------------------------------------------------------------------------------
// import

void load_hf_llama(const std::string& path, const ModelConfig& m, const ParamLayout& layout, float* params) {
  const std::string what = "model.init_from";
  const InitPaths p = init_paths(path);
  if (p.config.empty())
    input_error(what + ": " + path + ": no config.json " + (p.file.empty() ? "in it" : "beside it") +
                " (a Hugging Face Llama checkpoint needs one)");
  check_hf_llama_config(read_json_file(p.config, what), m, what + ": " + p.config);
  const HFShards hf(p, what);
  const Dims d = llama_dims(m);
  const int64_t C = d.C, D = d.D, HD = d.H * d.D, GD = d.G * d.D;

  // the tensors config.json implies; anything else in the checkpoint is an error (rotary_emb.inv_freq
  // buffers are skipped, a tied checkpoint's lm_head.weight is HF's tied copy and ignored)
  std::map<std::string, std::vector<int64_t>> expected = {{"model.embed_tokens.weight", {d.V, C}},
                                                          {"model.norm.weight", {C}}};
  if (d.untied) expected["lm_head.weight"] = {d.V, C};
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".";
    expected[h + "input_layernorm.weight"] = {C};
    expected[h + "post_attention_layernorm.weight"] = {C};
    expected[h + "self_attn.q_proj.weight"] = {HD, C};
    expected[h + "self_attn.k_proj.weight"] = {GD, C};
    expected[h + "self_attn.v_proj.weight"] = {GD, C};
    expected[h + "self_attn.o_proj.weight"] = {C, HD};
    expected[h + "mlp.gate_proj.weight"] = {d.F, C};
    expected[h + "mlp.up_proj.weight"] = {d.F, C};
    expected[h + "mlp.down_proj.weight"] = {C, d.F};
    if (d.bias) {
      expected[h + "self_attn.q_proj.bias"] = {HD};
      expected[h + "self_attn.k_proj.bias"] = {GD};
      expected[h + "self_attn.v_proj.bias"] = {GD};
      expected[h + "self_attn.o_proj.bias"] = {C};
      expected[h + "mlp.gate_proj.bias"] = {d.F};
      expected[h + "mlp.up_proj.bias"] = {d.F};
      expected[h + "mlp.down_proj.bias"] = {C};
    }
  }
  for (const std::string& n : hf.names()) {
    if (expected.count(n) || ends_with(n, ".rotary_emb.inv_freq") || (n == "lm_head.weight" && !d.untied)) continue;
    input_error(what + ": " + hf.where() + ": unexpected tensor '" + n + "' (config.json: " + std::to_string(d.L) +
                " layers, attention_bias/mlp_bias " + (d.bias ? "true" : "false") + ")");
  }
  for (const auto& [n, shape] : expected) hf.check(n, shape);  // every tensor, whichever rank needs it
  for (const std::string& t : hf.dtypes())
    if (t != "F32" && t != "BF16" && t != "F16" && t != "F64")
      input_error(what + ": " + hf.where() + ": tensors of dtype " + t + " (need BF16, F16 or F32)");

  // D rows of a q/k/v head (rows [r0, r0 + D) of `name`, cols values each) into out, permuted into our
  // RoPE pair order when `rotary` and the model uses interleaved RoPE
  std::vector<float> tmp;
  auto head = [&](const std::string& name, const std::vector<int64_t>& shape, int64_t r0, bool rotary, float* out) {
    const int64_t cols = shape.size() == 2 ? shape[1] : 1;
    if (!(rotary && d.interleaved)) return hf.rows(name, shape, r0, D, out);
    tmp.resize(size_t(D * cols));
    hf.rows(name, shape, r0, D, tmp.data());
    for (int64_t c = 0; c < D; ++c)
      std::copy_n(tmp.data() + hf_channel(c, D, true) * cols, cols, out + c * cols);
  };

  for (const ParamInfo& pi : layout.params) {
    float* out = params + pi.offset;
    std::fill(out, out + pi.numel, 0.0f);
    const std::string& n = pi.name;
    if (n == "wte.weight" || n == "lm_head.weight") {  // vocab-parallel rows; padded rows stay zero
      const std::string t = n == "wte.weight" ? "model.embed_tokens.weight" : "lm_head.weight";
      hf.rows(t, {d.V, C}, pi.box_offset[0], pi.box_size[0], out);
      continue;
    }
    if (n == "ln_f.weight") {
      hf.rows("model.norm.weight", {C}, 0, C, out);
      continue;
    }
    if (n.rfind("h.", 0) != 0) internal_error("load_hf_llama: no mapping for parameter " + n);
    const size_t dot = n.find('.', 2);
    const std::string rest = n.substr(dot + 1);
    const std::string h = "model.layers." + n.substr(2, dot - 2) + ".";
    const bool weight = ends_with(rest, ".weight");
    const std::string kind = weight ? "weight" : "bias";
    auto shape2 = [&](int64_t rows, int64_t cols) {
      return weight ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
    };
    const int64_t cols = weight ? C : 1;
    if (rest == "ln_1.weight") {
      hf.rows(h + "input_layernorm.weight", {C}, 0, C, out);
    } else if (rest == "ln_2.weight") {
      hf.rows(h + "post_attention_layernorm.weight", {C}, 0, C, out);
    } else if (rest == "attn.qkv.weight" || rest == "attn.qkv.bias") {
      const std::string q = h + "self_attn.q_proj." + kind, k = h + "self_attn.k_proj." + kind,
                        v = h + "self_attn.v_proj." + kind;
      const auto qs = shape2(HD, C), kvs = shape2(GD, C);
      const int64_t hs = D * cols;  // floats per head
      if (pi.global_shape.size() == (weight ? 4u : 3u)) {  // grouped [G, Q + 2, D, (C)]: this rank's groups
        for (int64_t gl = 0; gl < pi.box_size[0]; ++gl) {
          const int64_t g = pi.box_offset[0] + gl;
          float* o = out + gl * (d.Q + 2) * hs;
          for (int64_t i = 0; i < d.Q; ++i) head(q, qs, (g * d.Q + i) * D, true, o + i * hs);
          head(k, kvs, g * D, true, o + d.Q * hs);
          head(v, kvs, g * D, false, o + (d.Q + 1) * hs);
        }
      } else {  // [3, H D, (C)] sharded along the heads
        const int64_t first = pi.box_offset[1] / D, heads = pi.box_size[1] / D;
        for (int64_t w = 0; w < 3; ++w)
          for (int64_t i = 0; i < heads; ++i)
            head(w == 0 ? q : w == 1 ? k : v, w == 0 ? qs : kvs, (first + i) * D, w < 2,
                 out + (w * heads + i) * hs);
      }
    } else if (rest == "attn.proj.weight") {  // [C, H D]: columns of this rank's heads
      const SafetensorsReader& st = hf.check(h + "self_attn.o_proj.weight", {C, HD});
      st.read_box(h + "self_attn.o_proj.weight", pi.box_offset, pi.box_size, out);
    } else if (rest == "attn.proj.bias") {
      hf.rows(h + "self_attn.o_proj.bias", {C}, 0, C, out);
    } else if (rest == "mlp.fc1.weight" || rest == "mlp.fc1.bias") {  // [2, F, (C)] = [gate; up], rows of this rank
      const int64_t f0 = pi.box_offset[1], fl = pi.box_size[1];
      hf.rows(h + "mlp.gate_proj." + kind, shape2(d.F, C), f0, fl, out);
      hf.rows(h + "mlp.up_proj." + kind, shape2(d.F, C), f0, fl, out + fl * cols);
    } else if (rest == "mlp.fc2.weight") {  // [C, F]: columns of this rank
      const SafetensorsReader& st = hf.check(h + "mlp.down_proj.weight", {C, d.F});
      st.read_box(h + "mlp.down_proj.weight", pi.box_offset, pi.box_size, out);
    } else if (rest == "mlp.fc2.bias") {
      hf.rows(h + "mlp.down_proj.bias", {C}, 0, C, out);
    } else {
      internal_error("load_hf_llama: no mapping for parameter " + n);
    }
  }
  const std::set<std::string> dt = hf.dtypes();
  std::string dts;
  for (const std::string& t : dt) dts += (dts.empty() ? "" : "/") + t;
  spdlog::info("init_from: Hugging Face Llama {} ({} shard{}, {}; {} layers, hidden {}, {} heads / {} KV groups, vocab {}"
               "{})",
               hf.where(), hf.num_shards(), hf.num_shards() == 1 ? "" : "s", dts, d.L, C, d.H, d.G, d.V,
               d.interleaved ? "; q/k rows permuted to interleaved RoPE" : "");
}

void load_init_from(const ModelConfig& m, const GPTDims& d, const ParamLayout& layout, float* params) {
  const std::string& path = m.init_from;
  const InitPaths p = init_paths(path);
  HFArch arch = HFArch::None;
  std::string described;
  if (!p.config.empty()) arch = architecture_of(read_json_file(p.config, "model.init_from"), &described);
  if (arch == HFArch::Other)
    input_error("model.init_from: " + p.config + ": unknown architecture (" + described +
                "): tptrain imports LlamaForCausalLM and GPT2LMHeadModel");
  if (arch == HFArch::Llama) return load_hf_llama(path, m, layout, params);
  // HF GPT-2: a safetensors file (a directory or its config.json: its model.safetensors)
  if (!p.index.empty())
    input_error("model.init_from: " + path + ": a sharded checkpoint, but " +
                (p.config.empty() ? std::string("there is no config.json beside it") : p.config + " is GPT-2's") +
                " (tptrain reads sharded Llama checkpoints; GPT-2 from one model.safetensors)");
  if (!is_gpt2_architecture(m))
    input_error("model.init_from: " + path + " holds Hugging Face GPT-2 weights" +
                (p.config.empty() ? " (no config.json names another architecture)" : "") +
                ", which cannot hold this model (" + describe_architecture(m) +
                "); a Llama checkpoint is a directory with config.json (LlamaForCausalLM)");
  const std::string file = p.file.empty() ? p.dir + "/model.safetensors" : p.file;
  load_hf_gpt2(file, d, layout, params);
}

// ---------------------------------------------------------------------------------------------
// export

int64_t HFLlamaTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> llama_global_shape(const ModelConfig& m, const std::string& name) {
  const Dims d = llama_dims(m);
  if (name == "wte.weight" || name == "lm_head.weight") return {d.V, d.C};
  if (name == "ln_f.weight") return {d.C};
  const std::string rest = name.substr(name.find('.', 2) + 1);
  if (rest == "ln_1.weight" || rest == "ln_2.weight" || rest == "attn.proj.bias" || rest == "mlp.fc2.bias") return {d.C};
  if (rest == "attn.qkv.weight")
    return m.group_query_attention ? std::vector<int64_t>{d.G, d.Q + 2, d.D, d.C}
                                   : std::vector<int64_t>{3, d.H * d.D, d.C};
  if (rest == "attn.qkv.bias")
    return m.group_query_attention ? std::vector<int64_t>{d.G, d.Q + 2, d.D} : std::vector<int64_t>{3, d.H * d.D};
  if (rest == "attn.proj.weight") return {d.C, d.H * d.D};
  if (rest == "mlp.fc1.weight") return {2, d.F, d.C};
  if (rest == "mlp.fc1.bias") return {2, d.F};
  if (rest == "mlp.fc2.weight") return {d.C, d.F};
  internal_error("llama_global_shape: no tensor " + name);
}

std::vector<HFLlamaTensor> hf_llama_tensors(const ModelConfig& m) {
  const Dims d = llama_dims(m);
  const bool grouped = m.group_query_attention;
  const int64_t C = d.C, D = d.D, HD = d.H * D, GD = d.G * D;
  using Read = std::function<const std::vector<float>&(const std::string&)>;
  std::vector<HFLlamaTensor> out;
  auto same = [&](const std::string& hf, std::vector<int64_t> shape, const std::string& ours) {
    out.push_back({hf, std::move(shape), [ours](const Read& read) { return read(ours); }});
  };
  // rows of the q (w = 0), k (1) or v (2) heads of our qkv tensor, in HF's order
  auto qkv_part = [&](const std::string& hf, const std::string& ours, int w, bool weight) {
    const int64_t cols = weight ? C : 1, rows = w == 0 ? HD : GD;
    out.push_back({hf, weight ? std::vector<int64_t>{rows, C} : std::vector<int64_t>{rows},
                   [=](const Read& read) {
                     const std::vector<float>& src = read(ours);
                     std::vector<float> dst(size_t(rows * cols));
                     const int64_t hs = D * cols, heads = rows / D;
                     for (int64_t i = 0; i < heads; ++i) {  // HF head i
                       int64_t at;  // its first float in ours
                       if (grouped) at = w == 0 ? ((i / d.Q) * (d.Q + 2) + i % d.Q) * hs : (i * (d.Q + 2) + d.Q + w - 1) * hs;
                       else at = (w * HD + i * D) * cols;
                       for (int64_t c = 0; c < D; ++c)  // our channel c -> HF channel hf_channel(c)
                         std::copy_n(src.data() + at + c * cols, cols,
                                     dst.data() + i * hs + hf_channel(c, D, w < 2 && d.interleaved) * cols);
                     }
                     return dst;
                   }});
  };
  auto fc1_part = [&](const std::string& hf, const std::string& ours, int w, bool weight) {
    const int64_t cols = weight ? C : 1;
    out.push_back({hf, weight ? std::vector<int64_t>{d.F, C} : std::vector<int64_t>{d.F}, [=](const Read& read) {
                     const std::vector<float>& src = read(ours);
                     return std::vector<float>(src.begin() + w * d.F * cols, src.begin() + (w + 1) * d.F * cols);
                   }});
  };
  same("model.embed_tokens.weight", {d.V, C}, "wte.weight");
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".", o = "h." + std::to_string(l) + ".";
    same(h + "input_layernorm.weight", {C}, o + "ln_1.weight");
    const char* qkv[] = {"q_proj", "k_proj", "v_proj"};
    for (int w = 0; w < 3; ++w) {
      qkv_part(h + "self_attn." + qkv[w] + ".weight", o + "attn.qkv.weight", w, true);
      if (d.bias) qkv_part(h + "self_attn." + qkv[w] + ".bias", o + "attn.qkv.bias", w, false);
    }
    same(h + "self_attn.o_proj.weight", {C, HD}, o + "attn.proj.weight");
    if (d.bias) same(h + "self_attn.o_proj.bias", {C}, o + "attn.proj.bias");
    same(h + "post_attention_layernorm.weight", {C}, o + "ln_2.weight");
    fc1_part(h + "mlp.gate_proj.weight", o + "mlp.fc1.weight", 0, true);
    if (d.bias) fc1_part(h + "mlp.gate_proj.bias", o + "mlp.fc1.bias", 0, false);
    fc1_part(h + "mlp.up_proj.weight", o + "mlp.fc1.weight", 1, true);
    if (d.bias) fc1_part(h + "mlp.up_proj.bias", o + "mlp.fc1.bias", 1, false);
    same(h + "mlp.down_proj.weight", {C, d.F}, o + "mlp.fc2.weight");
    if (d.bias) same(h + "mlp.down_proj.bias", {C}, o + "mlp.fc2.bias");
  }
  same("model.norm.weight", {C}, "ln_f.weight");
  if (d.untied) same("lm_head.weight", {d.V, C}, "lm_head.weight");
  return out;
}

int64_t parse_byte_size(const std::string& text) {
  auto bad = [&]() -> int64_t {
    input_error("--max-shard-size: '" + text + "' is not a size (bytes, or a number with kB/MB/GB/TB or KiB/MiB/GiB/TiB, "
                "e.g. 5GB)");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return bad();
  double value;
  try {
    size_t used = 0;
    value = std::stod(text.substr(0, i), &used);
    if (used != i) return bad();
  } catch (const std::exception&) {
    return bad();
  }
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  std::string lower;
  for (char c : unit) lower += char(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, double> units[] = {
      {"", 1},          {"b", 1},           {"kb", 1e3},        {"mb", 1e6},        {"gb", 1e9},
      {"tb", 1e12},     {"kib", 1024.0},    {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& [u, mult] : units)
    if (lower == u) {
      const double bytes = std::floor(value * mult);
      if (!(bytes >= 1) || bytes > 9.0e18) return bad();
      return int64_t(bytes);
    }
  return bad();
}

}  // namespace tpt
