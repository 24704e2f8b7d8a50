#include "model/checkpoint_model.h"

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
    if (c.num_layers < 1 || c.hidden_size < 1 || c.num_attention_heads < 1 || c.hidden_size % c.num_attention_heads ||
        c.ffn_hidden_size < 1 || c.max_position_embeddings < 1 || c.vocab_size < 1 || c.make_vocab_size_divisible_by < 1)
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
