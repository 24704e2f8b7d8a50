// Internals of the Llama import and export shared by their files, not an API (include only from
// interop/hf/llama_*.cpp): the architecture a config.json names, the model's Llama dimensions and
// the q/k row order of interleaved RoPE.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/config.h"

namespace tpt::llama_detail {

// A JSON value as text (numbers in their shortest round-trip form: 1e-05, 500000.0).
inline std::string jtext(const nlohmann::json& v) { return v.dump(); }

// What an HF config.json's architectures / model_type name (interop/hf/llama_config.cpp);
// `described` says it for messages.
enum class HFArch { None, GPT2, Llama, Other };
HFArch architecture_of(const nlohmann::json& cfg, std::string* described);

// The model config's dimensions in Llama's terms: L layers, hidden C, H query heads in G KV groups
// of Q = H / G, head dimension D, FFN F, vocabulary V.
struct LlamaDims {
  int64_t L, C, H, G, Q, D, F, V;
  bool bias, untied, interleaved;
};
LlamaDims llama_dims(const ModelConfig& m);

// The Llama rows of our q/k heads: with interleaved RoPE our channel 2j + e is HF's e * D/2 + j
// (HF: rotate-half pairs (j, j + D/2)); else the same channel.
inline int64_t hf_channel(int64_t c, int64_t D, bool interleaved) {
  return interleaved ? (c % 2) * (D / 2) + c / 2 : c;
}

}  // namespace tpt::llama_detail
