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
  const HFArch known[] = {HFArch::Llama, HFArch::Mixtral, HFArch::Qwen2Moe, HFArch::Qwen3Moe};
  const char* types[] = {"llama", "mixtral", "qwen2_moe", "qwen3_moe"};
  for (int i = 0; i < 4; ++i)
    if (has(arch_name(known[i])) || (names.empty() && model_type == types[i])) return known[i];
  if (has("GPT2LMHeadModel")) return HFArch::GPT2;
  if (names.empty() && model_type == "gpt2") return HFArch::GPT2;
  return HFArch::Other;
}

const char* arch_name(HFArch a) {
  switch (a) {
    case HFArch::Llama: return "LlamaForCausalLM";
    case HFArch::Mixtral: return "MixtralForCausalLM";
    case HFArch::Qwen2Moe: return "Qwen2MoeForCausalLM";
    case HFArch::Qwen3Moe: return "Qwen3MoeForCausalLM";
    case HFArch::GPT2: return "GPT2LMHeadModel";
    default: return "(unknown)";
  }
}

HFDefaults hf_defaults(HFArch a) {  // transformers' LlamaConfig, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig
  switch (a) {
    case HFArch::Mixtral: return {4096, 14336, 32, 32, 8, 32000, 1e-5, 1e6};
    case HFArch::Qwen2Moe: return {2048, 5632, 24, 16, 16, 151936, 1e-6, 1e4};
    case HFArch::Qwen3Moe: return {2048, 6144, 24, 32, 4, 151936, 1e-6, 1e4};
    default: return {4096, 11008, 32, 32, 0, 32000, 1e-6, 1e4};
  }
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
  const HFArch a = architecture_of(hf, &arch);
  if (a != HFArch::Llama && !is_moe_arch(a))
    input_error(where + ": unknown architecture (" + arch +
                "): tptrain imports LlamaForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM here");
  const std::string name = arch_name(a);
  if (a == HFArch::Llama && m.is_moe())
    input_error(where + ": a dense LlamaForCausalLM but model.num_moe_experts is " + std::to_string(m.num_moe_experts));
  if (is_moe_arch(a) && !m.is_moe())
    input_error(where + ": a Mixture-of-Experts " + name + " but model.num_moe_experts is null (a dense model)");
  const HFDefaults def = hf_defaults(a);
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
  if (a == HFArch::Llama && m.add_qkv_bias && !m.add_bias_linear)
    input_error(where + ": model.add_qkv_bias: true (a QKV bias alone) has no Llama form (attention_bias is on "
                "q, k, v and o_proj)");
  if (m.qk_layernorm != (a == HFArch::Qwen3Moe))  // Qwen3-MoE's q_norm / k_norm: RMSNorm of each head, before RoPE
    input_error(where + ": " + (m.qk_layernorm ? "model.qk_layernorm is true but " + name + " has no q/k norms"
                                               : name + " normalises q and k per head (self_attn.q_norm, k_norm) but "
                                                        "model.qk_layernorm is false"));

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
  // HF's defaults (LlamaConfig, MixtralConfig, ...) for the keys a config.json leaves out
  const int64_t H = integer("num_attention_heads", def.heads), C = integer("hidden_size", def.hidden);
  same_int("hidden_size", C, "model.hidden_size", m.hidden_size);
  if (a != HFArch::Mixtral)  // Mixtral's intermediate_size is its experts' (check_hf_moe_config)
    same_int("intermediate_size", integer("intermediate_size", def.intermediate), "model.ffn_hidden_size",
             m.ffn_hidden_size);
  same_int("num_hidden_layers", integer("num_hidden_layers", def.layers), "model.num_layers", m.num_layers);
  same_int("num_attention_heads", H, "model.num_attention_heads", m.num_attention_heads);
  same_int("num_key_value_heads", integer("num_key_value_heads", def.kv_heads ? def.kv_heads : H),
           m.group_query_attention ? "model.num_query_groups" : "model.num_attention_heads (no group_query_attention)",
           query_groups(m));
  same_int("head_dim", integer("head_dim", H > 0 ? C / H : 0), "model.kv_channels",
           m.kv_channels ? m.kv_channels : m.hidden_size / m.num_attention_heads);
  same_num("rms_norm_eps", number("rms_norm_eps", def.eps), "model.layernorm_epsilon", m.layernorm_epsilon);
  HFRope rope = hf_rope(hf, where);
  if (!hf.contains("rope_theta") && !(hf.contains("rope_parameters") && hf["rope_parameters"].is_object() &&
                                      hf["rope_parameters"].contains("rope_theta")))
    rope.theta = def.theta;
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
  same_int("vocab_size", integer("vocab_size", def.vocab), "model.vocab_size", m.vocab_size);
  if (a == HFArch::Llama) {
    same_bool("attention_bias", boolean("attention_bias", false), "model.add_bias_linear", m.add_bias_linear);
    same_bool("mlp_bias", boolean("mlp_bias", false), "model.add_bias_linear", m.add_bias_linear);
    return;
  }
  // the MoE families: no expert biases (model.add_bias_linear false); Qwen2-MoE's q/k/v biases alone
  if (m.add_bias_linear)
    input_error(where + ": " + name + " has no MLP / expert biases but model.add_bias_linear is true");
  if (a == HFArch::Qwen2Moe)
    same_bool("qkv_bias", boolean("qkv_bias", true), "model.add_qkv_bias", m.add_qkv_bias);
  else if (m.add_qkv_bias)
    input_error(where + ": " + name + " has no q/k/v biases but model.add_qkv_bias is true");
  if (a == HFArch::Qwen3Moe && boolean("attention_bias", false))
    input_error(where + ": attention_bias is true (biases on q, k, v and o_proj without MLP biases): no tptrain form");
  check_hf_moe_config(hf, a, m, where);
}

std::string hf_llama_incompatibility(const ModelConfig& m) {
  if (m.normalization != Normalization::RMSNorm) return "model.normalization is LayerNorm (Llama: RMSNorm)";
  if (!m.swiglu) return "model.swiglu is false (Llama: SwiGLU)";
  if (m.position_embedding_type != PositionEmbedding::Rope)
    return "model.position_embedding_type is learned_absolute (Llama: rope)";
  if (m.rotary_percent != 1.0)
    return "model.rotary_percent is " + jtext(m.rotary_percent) + " (Llama rotates every channel: 1.0)";
  std::string why;
  if (m.is_moe() && hf_moe_export_arch(m, &why) == HFArch::Other) return why;
  if (!m.is_moe() && m.add_qkv_bias && !m.add_bias_linear)
    return "model.add_qkv_bias is true without model.add_bias_linear (Llama's attention_bias is on q, k, v and o)";
  if (!m.is_moe() && m.qk_layernorm) return "model.qk_layernorm is true (Llama has no q/k norms)";
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
  nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
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
  std::string why;
  if (m.is_moe()) hf_moe_config(hf_moe_export_arch(m, &why), m, cfg);
  return cfg;
}

}  // namespace tpt
