// The model a checkpoint holds, for the one-process tools that read a checkpoint of any layout
// (tptrain export, tptrain generate): its sizes from meta.json's resolved config, and whole
// global tensors read from whatever boxes the saving layout wrote.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "parallel/checkpoint.h"

namespace tpt {

// config.model of a checkpoint's meta.json (every key the model needs, the Mixture-of-Experts keys
// included; init_from is left empty). InputError when a key is missing or has the wrong type, or
// the sizes are inconsistent.
ModelConfig checkpoint_model_config(const nlohmann::json& meta);

// The whole global tensor `name` of the checkpoint, row-major, checked against `shape`: an
// InputError "<who>: <path> has no tensor ..." / "... has shape ..., its config implies ...".
std::vector<float> read_whole_tensor(CheckpointReader& reader, const std::string& name,
                                     const std::vector<int64_t>& shape, const std::string& who);

}  // namespace tpt
