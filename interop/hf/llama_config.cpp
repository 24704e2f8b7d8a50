// Llama's config.json (interop/hf/llama.h): the architecture a config.json names, HF's RoPE keys,
// the check of a checkpoint's config.json against the model config (the import) and the config.json
// of the export.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "interop/hf/llama.h"
#include "interop/hf/llama_detail.h"
#include "model/layers.h"

namespace tpt {

namespace llama_detail {

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

LlamaDims llama_dims(const ModelConfig& m) {
  LlamaDims d;
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

}  // namespace llama_detail

using namespace llama_detail;

namespace {

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
    // as transformers: rope_type when present, else the older "type"
    std::string type = "default";
    const char* key = s.contains("rope_type") ? "rope_type" : "type";
    if (s.contains(key) && s[key].is_string()) type = s[key].get<std::string>();
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

}  // namespace

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
  if (m.qk_layernorm)
    input_error(where + ": model.qk_layernorm is true but LlamaForCausalLM has no q/k norms (q_norm, k_norm)");

  auto integer = [&](const char* key, int64_t def) -> int64_t {
    if (!hf.contains(key) || hf[key].is_null()) return def;
    if (!hf[key].is_number_integer()) input_error(where + ": " + key + " is " + jtext(hf[key]) + ", not an integer");
    if (hf[key].is_number_unsigned() && hf[key].get<uint64_t>() > uint64_t(INT64_MAX))
      input_error(where + ": " + key + " is " + jtext(hf[key]) + ", larger than any model's");
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
  if (m.qk_layernorm) return "model.qk_layernorm is true (Llama has no q/k norms)";
  return "";
}

nlohmann::json hf_llama_config(const ModelConfig& m, DType dtype) {
  const LlamaDims d = llama_dims(m);
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

}  // namespace tpt
