// Hugging Face LlamaForCausalLM checkpoints in and out (docs/ARCHITECTURE.md "Model", README
// "Continue pretraining from a Hugging Face Llama checkpoint"), and on the same files the
// Mixture-of-Experts MixtralForCausalLM / Qwen2MoeForCausalLM (interop/hf/moe.cpp, docs/MOE.md
// "Hugging Face checkpoints") and Qwen3MoeForCausalLM (q/k norms: model.qk_layernorm):
//  - model.init_from: what the path names (an HF Llama directory, its model.safetensors.index.json,
//    its config.json, one .safetensors file; or HF GPT-2, interop/hf/gpt2.h) and the Llama import:
//    config.json checked against the model config, every rank reading only the rows of its boxes from
//    the memory-mapped shards (q/k/v_proj -> the grouped QKV, gate/up_proj -> [gate; up]);
//  - tptrain export: config.json of a Llama-family model and the HF tensors of our global tensors.
// HF's tensors are all [out, in] (torch.nn.Linear) and its q/k rows are in the rotate-half RoPE order
// (pairs (j, j + D/2)); with model.rotary_interleaved the rows of each q/k head are permuted between
// that order and ours (pairs (2j, 2j + 1)): Meta's -> HF's permutation of convert_llama_weights_to_hf.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/dtype.h"
#include "model/gpt.h"

namespace tpt {

// ---- model.init_from ----

// Fills the host parameter buffer of this rank's layout from model.init_from (m.init_from): an HF
// Llama, Mixtral, Qwen2-MoE or Qwen3-MoE checkpoint (by its config.json's architectures / model_type; an MoE
// one for an MoE model config, each rank reading only its experts) or an HF GPT-2 safetensors file
// (no config.json, or one of model_type gpt2). Throws InputError naming the file, the key or the
// tensor: an unknown architecture, config.json disagreeing with the model config (both values), a
// missing or doubly named tensor, a missing shard, a shape that disagrees with config.json.
void load_init_from(const ModelConfig& m, const GPTDims& d, const ParamLayout& layout, float* params);

// The Llama import alone: `path` is a directory (config.json + model.safetensors or
// model.safetensors.index.json), an index file, a config.json, or one safetensors file with
// config.json beside it.
void load_hf_llama(const std::string& path, const ModelConfig& m, const ParamLayout& layout, float* params);

// Checks an HF config.json (parsed) against the model config: the architecture, then every key
// (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
// head_dim, rms_norm_eps, rope_theta, rope_scaling or rope_parameters, tie_word_embeddings,
// attention_bias, mlp_bias, vocab_size, hidden_act; HF's LlamaConfig defaults for absent keys).
// InputError "<where>: <key> is X but model.<key> is Y".
void check_hf_llama_config(const nlohmann::json& hf, const ModelConfig& m, const std::string& where);

// ---- tptrain export ----

// Empty when the model can be written as an HF LlamaForCausalLM (an MoE model: Mixtral, Qwen2-MoE or Qwen3-MoE);
// else why not, naming the key.
std::string hf_llama_incompatibility(const ModelConfig& m);

// config.json for transformers.LlamaForCausalLM, or for an MoE model MixtralForCausalLM /
// Qwen2MoeForCausalLM / Qwen3MoeForCausalLM (torch_dtype: "float32" | "bfloat16" | "float16").
nlohmann::json hf_llama_config(const ModelConfig& m, DType dtype);

// One HF tensor of the export: its name, shape, and how to compute it (row-major fp32) from our
// whole global tensors, which `read(our name)` returns (q/k rows permuted back to HF's order when
// the model uses interleaved RoPE; the unpadded vocabulary).
struct HFLlamaTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::function<std::vector<float>(const std::function<const std::vector<float>&(const std::string&)>& read)> make;
  int64_t numel() const;
};
// The tensors of the export in HF's order: embed_tokens, per layer input_layernorm, q/k/v/o_proj
// (+ biases), post_attention_layernorm, gate/up/down_proj (+ biases) -- an MoE layer's router,
// experts and shared expert instead (interop/hf/moe.cpp) --, model.norm, lm_head (untied).
std::vector<HFLlamaTensor> hf_llama_tensors(const ModelConfig& m);
// The global shape of our tensor `name` (as make_param_layout names it) in a Llama-family model: the
// layer spec's (model/layer_spec.h) for the layers' tensors.
std::vector<int64_t> llama_global_shape(const ModelConfig& m, const std::string& name);

}  // namespace tpt
