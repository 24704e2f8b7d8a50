#include "model/checkpoint_model.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"

namespace tpt {

ModelConfig checkpoint_model_config(const nlohmann::json& meta) {
  if (!meta.contains("config") || !meta["config"].is_object() || !meta["config"].contains("model"))
    input_error("meta.json: config.model is missing");
  ModelConfig c = model_config_from_json(meta["config"]["model"], "meta.json: config");
  c.init_from.clear();
  const int G = query_groups(c), rot = rotary_dim(c);
  if (c.num_layers < 1 || c.hidden_size < 1 || c.num_attention_heads < 1 || c.kv_channels < 1 || G < 1 ||
      c.num_attention_heads % G || c.ffn_hidden_size < 1 || c.max_position_embeddings < 1 || c.vocab_size < 1 ||
      c.make_vocab_size_divisible_by < 1 || rot % 2 || rot > c.kv_channels ||
      (c.position_embedding_type == PositionEmbedding::Rope && rot < 2))
    input_error("meta.json: config.model has inconsistent sizes: " + meta["config"]["model"].dump());
  return c;
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
