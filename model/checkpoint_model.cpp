#include "model/checkpoint_model.h"

#include <algorithm>

#include "core/error.h"

namespace tpt {

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
    if (number("num_moe_experts", 0) > 0)
      input_error("meta.json: this checkpoint's model is a Mixture-of-Experts model (config.model.num_moe_experts " +
                  std::to_string(number("num_moe_experts", 0)) +
                  "); generation and the Hugging Face export read dense checkpoints only so far (docs/MOE.md)");
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
