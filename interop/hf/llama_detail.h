// Internals of the Llama-family import and export shared by their files, not an API (include only
// from interop/hf/llama_*.cpp and moe.cpp): the architecture a config.json names, the model's Llama
// dimensions, the q/k row order of interleaved RoPE, and the Mixture-of-Experts families' hooks
// (interop/hf/moe.cpp: Mixtral, Qwen2-MoE, Qwen3-MoE -- their attention and norms are Llama's).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "interop/hf/llama.h"
#include "interop/hf/shards.h"
#include "model/gpt.h"

namespace tpt::llama_detail {

// A JSON value as text (numbers in their shortest round-trip form: 1e-05, 500000.0).
inline std::string jtext(const nlohmann::json& v) { return v.dump(); }

// What an HF config.json's architectures / model_type name (interop/hf/llama_config.cpp);
// `described` says it for messages.
enum class HFArch { None, GPT2, Llama, Mixtral, Qwen2Moe, Qwen3Moe, Other };
HFArch architecture_of(const nlohmann::json& cfg, std::string* described);
inline bool is_moe_arch(HFArch a) { return a == HFArch::Mixtral || a == HFArch::Qwen2Moe || a == HFArch::Qwen3Moe; }
const char* arch_name(HFArch a);  // "LlamaForCausalLM", "MixtralForCausalLM", ...

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

// HF's defaults (its Config classes) for the keys a config.json of that architecture leaves out.
struct HFDefaults {
  int64_t hidden, intermediate, layers, heads, kv_heads, vocab;  // kv_heads 0: = heads
  double eps, theta;
};
HFDefaults hf_defaults(HFArch a);

// ---- the MoE families (interop/hf/moe.cpp) ----
// config.json's MoE keys against the model config (the attention / norm keys are Llama's, checked by
// check_hf_llama_config): the experts, top-k, the router's normalisation, which layers are MoE, the
// shared expert, router_jitter_noise, sliding windows, biases; InputError naming the key.
void check_hf_moe_config(const nlohmann::json& hf, HFArch a, const ModelConfig& m, const std::string& where);
// The HF prefix of layer l's MLP ("model.layers.<l>.mlp." or Mixtral's "...block_sparse_moe.").
std::string hf_mlp_prefix(HFArch a, int64_t l);
// The HF tensors of MoE layer l's MLP (router, every expert, shared expert and its gate) and shapes.
void hf_moe_expected(HFArch a, const ModelConfig& m, int64_t l, std::map<std::string, std::vector<int64_t>>& out);
// Fills this rank's box of an MoE tensor (mlp.router, mlp.experts.*, mlp.shared_experts.gate) of
// layer l from the checkpoint: each rank reads only its experts. False when `rest` is not one.
bool load_hf_moe_param(HFArch a, const HFShards& hf, const ModelConfig& m, const ParamInfo& pi, int64_t l,
                       const std::string& rest, float* out);
// The HF architecture an MoE model exports as (Mixtral without a shared expert, Qwen2-MoE with one,
// Qwen3-MoE with model.qk_layernorm);
// HFArch::Other with *why naming the key when none can hold it.
HFArch hf_moe_export_arch(const ModelConfig& m, std::string* why);
// The export's config.json: Llama's keys `cfg` turned into architecture a's (its MoE keys set).
void hf_moe_config(HFArch a, const ModelConfig& m, nlohmann::json& cfg);
// The export's HF tensors of MoE layer l's router, routed experts and shared expert gate.
void hf_moe_tensors(HFArch a, const ModelConfig& m, int64_t l, std::vector<HFLlamaTensor>& out);

}  // namespace tpt::llama_detail
