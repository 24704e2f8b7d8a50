#include "model/checkpoint_model.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"

namespace tpt {

namespace {
// What the checkpoint readers need of the MoE keys to lay out and route the model (the config loader's
// full rules, core/config_moe.cpp, held when the checkpoint was saved): consistent sizes.
void check_moe(const ModelConfig& c, const nlohmann::json& m) {
  const int E = c.num_moe_experts, k = c.moe_router_topk, g = c.moe_router_num_groups, gk = c.moe_router_group_topk;
  const LayerFreq& f = c.moe_layer_freq;
  bool ok = E >= 1 && k >= 1 && k <= E && c.moe_ffn_hidden_size >= 1 && (g == 0) == (gk == 0) &&
            c.moe_router_topk_scaling_factor >= 0 && (f.pattern.empty() ? f.every >= 1 : f.every == 0) &&
            (f.pattern.empty() || int64_t(f.pattern.size()) == c.num_layers);
  for (int x : f.pattern) ok = ok && (x == 0 || x == 1);
  if (g != 0) ok = ok && g >= 1 && E % g == 0 && gk >= 1 && gk <= g && k % gk == 0 && k / gk <= E / g;
  if (!ok) input_error("meta.json: config.model has inconsistent Mixture-of-Experts keys: " + m.dump());
  if (c.moe_shared_expert_intermediate_size < 0 || (c.moe_shared_expert_gate && c.moe_shared_expert_intermediate_size == 0))
    input_error("meta.json: config.model has inconsistent shared-expert keys: " + m.dump());
  if (c.moe_router_enable_expert_bias && c.moe_router_score_function != MoEScore::Sigmoid)
    input_error("meta.json: config.model.moe_router_enable_expert_bias needs moe_router_score_function: sigmoid: " +
                m.dump());
}
}  // namespace

ModelConfig checkpoint_model_config(const nlohmann::json& meta) {
  try {
    const nlohmann::json& m = meta.at("config").at("model");
    ModelConfig c;
    c.num_layers = m.at("num_layers").get<int>();
    c.hidden_size = m.at("hidden_size").get<int>();
    c.num_attention_heads = m.at("num_attention_heads").get<int>();
    c.ffn_hidden_size = m.at("ffn_hidden_size").get<int>();
    c.seq_length = m.at("seq_length").get<int>();
    c.max_position_embeddings = m.at("max_position_embeddings").get<int>();
    c.vocab_size = m.at("vocab_size").get<int>();
    c.make_vocab_size_divisible_by = m.value("make_vocab_size_divisible_by", c.make_vocab_size_divisible_by);
    c.layernorm_epsilon = m.at("layernorm_epsilon").get<double>();
    c.init_method_std = m.at("init_method_std").get<double>();
    c.hidden_dropout = m.at("hidden_dropout").get<double>();
    c.attention_dropout = m.at("attention_dropout").get<double>();
    // the LLaMA-family options (absent from checkpoints older than them: GPT-2's defaults)
    auto choice = [&](const char* key, auto def) {
      if (!m.contains(key) || m.at(key).is_null()) return def;
      const std::string v = m.at(key).get<std::string>();
      const auto names = enum_names(def);
      for (size_t i = 0; i < names.size(); ++i)
        if (names[i] == v) return decltype(def)(i);
      input_error(std::string("meta.json: config.model.") + key + ": unknown value '" + v + "'");
    };
    auto number = [&](const char* key, auto def) {
      return m.contains(key) && !m.at(key).is_null() ? m.at(key).get<decltype(def)>() : def;
    };
    c.normalization = choice("normalization", c.normalization);
    c.swiglu = number("swiglu", c.swiglu);
    c.position_embedding_type = choice("position_embedding_type", c.position_embedding_type);
    c.rotary_base = number("rotary_base", c.rotary_base);
    c.rotary_percent = number("rotary_percent", c.rotary_percent);
    c.rotary_interleaved = number("rotary_interleaved", c.rotary_interleaved);
    if (m.contains("rope_scaling") && !m.at("rope_scaling").is_null()) {
      const nlohmann::json& r = m.at("rope_scaling");
      c.rope_scaling = {r.at("factor").get<double>(), r.at("low_freq_factor").get<double>(),
                        r.at("high_freq_factor").get<double>(), r.at("original_max_position_embeddings").get<int64_t>()};
    }
    c.group_query_attention = number("group_query_attention", c.group_query_attention);
    c.num_query_groups = number("num_query_groups", c.num_query_groups);
    c.kv_channels = number("kv_channels", c.hidden_size / std::max(1, c.num_attention_heads));
    c.untie_embeddings_and_output_weights = number("untie_embeddings_and_output_weights", c.untie_embeddings_and_output_weights);
    c.add_bias_linear = number("add_bias_linear", c.add_bias_linear);
    c.add_qkv_bias = number("add_qkv_bias", c.add_qkv_bias);
    c.qk_layernorm = number("qk_layernorm", c.qk_layernorm);
    // Mixture-of-Experts (docs/MOE.md; absent or null num_moe_experts: a dense model)
    c.num_moe_experts = number("num_moe_experts", 0);
    if (c.is_moe()) {
      c.moe_ffn_hidden_size = number("moe_ffn_hidden_size", c.ffn_hidden_size);  // resolved when saved
      if (m.contains("moe_layer_freq") && !m.at("moe_layer_freq").is_null()) {
        const nlohmann::json& f = m.at("moe_layer_freq");
        if (f.is_array()) c.moe_layer_freq = {0, f.get<std::vector<int>>()};
        else c.moe_layer_freq = {f.get<int>(), {}};
      }
      c.moe_router_topk = number("moe_router_topk", c.moe_router_topk);
      c.moe_router_score_function = choice("moe_router_score_function", c.moe_router_score_function);
      c.moe_router_pre_softmax = number("moe_router_pre_softmax", c.moe_router_pre_softmax);
      c.moe_router_topk_scaling_factor = number("moe_router_topk_scaling_factor", c.moe_router_topk_scaling_factor);
      c.moe_router_num_groups = number("moe_router_num_groups", c.moe_router_num_groups);
      c.moe_router_group_topk = number("moe_router_group_topk", c.moe_router_group_topk);
      c.moe_router_enable_expert_bias = number("moe_router_enable_expert_bias", c.moe_router_enable_expert_bias);
      c.moe_router_bias_update_rate = number("moe_router_bias_update_rate", c.moe_router_bias_update_rate);
      c.moe_router_load_balancing_type = choice("moe_router_load_balancing_type", c.moe_router_load_balancing_type);
      c.moe_aux_loss_coeff = number("moe_aux_loss_coeff", c.moe_aux_loss_coeff);
      c.moe_z_loss_coeff = number("moe_z_loss_coeff", c.moe_z_loss_coeff);
      c.moe_shared_expert_intermediate_size =
          number("moe_shared_expert_intermediate_size", c.moe_shared_expert_intermediate_size);
      c.moe_shared_expert_gate = number("moe_shared_expert_gate", c.moe_shared_expert_gate);
      c.moe_expert_capacity_factor = number("moe_expert_capacity_factor", c.moe_expert_capacity_factor);
      c.moe_token_drop_policy = choice("moe_token_drop_policy", c.moe_token_drop_policy);
      c.moe_pad_expert_input_to_capacity = number("moe_pad_expert_input_to_capacity", c.moe_pad_expert_input_to_capacity);
      c.moe_token_dispatcher_type = choice("moe_token_dispatcher_type", c.moe_token_dispatcher_type);
      c.moe_router_dtype = number("moe_router_dtype", c.moe_router_dtype);
      check_moe(c, m);
    }
    const int G = query_groups(c), rot = rotary_dim(c);
    if (c.num_layers < 1 || c.hidden_size < 1 || c.num_attention_heads < 1 || c.kv_channels < 1 || G < 1 ||
        c.num_attention_heads % G || c.ffn_hidden_size < 1 || c.max_position_embeddings < 1 || c.vocab_size < 1 ||
        c.make_vocab_size_divisible_by < 1 || rot % 2 || rot > c.kv_channels ||
        (c.position_embedding_type == PositionEmbedding::Rope && rot < 2))
      input_error("meta.json: config.model has inconsistent sizes: " + m.dump());
    return c;
  } catch (const nlohmann::json::exception& e) {
    input_error(std::string("meta.json: config.model is incomplete: ") + e.what());
  }
}

std::vector<float> read_whole_tensor(CheckpointReader& reader, const std::string& name,
                                     const std::vector<int64_t>& shape, const std::string& who) {
  auto it = reader.tensors().find(name);
  if (it == reader.tensors().end()) input_error(who + ": " + reader.path() + " has no tensor '" + name + "'");
  if (it->second != shape)
    input_error(who + ": " + reader.path() + ": tensor '" + name + "' has shape " + shape_string(it->second) +
                ", its config implies " + shape_string(shape));
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> data(static_cast<size_t>(n));
  reader.read({name, shape, std::vector<int64_t>(shape.size(), 0), shape, shape, data.data()});
  return data;
}

}  // namespace tpt
