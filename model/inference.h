// Inference for `tptrain generate`: the GPT of model/gpt.h as one process (TP = PP = 1), loaded
// from a checkpoint of any layout, with a KV cache: the prompt runs in one forward pass, then
// every new token runs alone, attending to the keys and values cached for all earlier positions.
// The arithmetic is the training forward's (the same Ops kernels, the same attention loop order),
// so the cached logits equal a full forward's up to GEMM blocking.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/ops.h"
#include "model/gpt.h"

namespace tpt {

// A whole model in the TP = 1, PP = 1 layout, in host memory.
struct InferenceWeights {
  ModelConfig model;          // the checkpoint's config.model
  GPTDims dims;               // make_dims(.., 1, 0, 1, 0)
  ParamLayout layout;
  std::vector<float> params;  // layout.total floats (vocabulary padding rows zero)
  // MoE with the expert bias (model.moe_router_enable_expert_bias): per layer its bias (E), the
  // checkpoint's h.<l>.mlp.router.expert_bias; empty for dense layers and without the bias
  std::vector<std::vector<float>> expert_bias;
  std::string path;           // the checkpoint directory read (iter_N)
  int64_t iteration = 0;
  nlohmann::json grid;        // the layout that saved it (meta.json "grid")
};

// Reads a checkpoint of any TP x PP x DP layout: `dir` is a checkpoint.save directory (its latest
// complete checkpoint, falling back past damaged ones as training does) or one iter_N directory.
// Only the model shards are read and checksummed. InputError when there is no usable checkpoint.
InferenceWeights load_inference_weights(const std::string& dir);

// The model + a KV cache of max_position_embeddings positions.
// ops must keep tensors in host memory (the CPU backend): the cached attention is a host loop.
// Mixture-of-Experts layers route every call's tokens on the host (model/moe_routing.h) to their
// top-k experts with no capacity (dropping is a training-time rule: at inference every token gets its
// k experts, as in Megatron) and no balancing losses (the expert bias, when trained, still chooses),
// then run MoEMLP's EP-1 expert GEMMs and the shared expert.
class GPTInference {
 public:
  // expert_bias: InferenceWeights::expert_bias (per layer; needed when d.moe.router.expert_bias)
  GPTInference(const GPTDims& d, const ParamLayout& layout, Ops& ops, const float* params,
               std::vector<std::vector<float>> expert_bias = {});
  GPTInference(const GPTInference&) = delete;
  GPTInference& operator=(const GPTInference&) = delete;

  // Runs `tokens` at positions [length(), length() + n) and appends their keys and values to the
  // cache. logits: (n, V) of every new position if all_positions, else (V) of the last one only
  // (the unpadded vocabulary V). InputError when the positions would pass max_position_embeddings.
  void forward(std::span<const int32_t> tokens, std::vector<float>& logits, bool all_positions = false);

  int64_t length() const { return len_; }           // positions cached so far
  int64_t max_length() const { return d_.P; }       // max_position_embeddings
  int64_t vocab_size() const { return d_.V; }
  void reset() { len_ = 0; }

 private:
  const float* p(const std::string& name) const;
  // Layer l's attention of n new positions (from length()) over every cached one: appends their
  // keys and values from qkv (n, (H + 2 G) D) to the cache, writes att (n, H D).
  void cached_attention(int64_t l, const float* qkv, float* att, int64_t n);
  // MoE layer l's MLP of n tokens: y (n, C) from ln_2's output ln2 (n, C).
  void moe_mlp(int64_t l, const float* ln2, float* y, int64_t n);

  GPTDims d_;
  const ParamLayout& layout_;
  Ops& ops_;
  const float* params_;
  int64_t len_ = 0;
  std::vector<float> k_cache_, v_cache_;  // (L, P, G D) each: keys / values of every cached position
  RouterOptions router_;  // the model's, without capacity and balancing losses
  std::vector<std::vector<float>> expert_bias_;  // per layer (E) with the expert bias
  // MoE scratch, grown to the largest call (n k rows): the experts' input rows, fc1 output, activation,
  // output rows (expert-major); the shared expert's (n rows) reuse the last three
  std::vector<float> moe_xin_, moe_fc1_, moe_act_, moe_wact_, moe_out_;
  std::vector<int32_t> moe_ident_, moe_zero_;  // the rows' index lists (MoERowWeights)
};

// Next-token choice. Greedy: the id of the largest logit, the lowest id among equal ones.
int32_t greedy_token(std::span<const float> logits);

// Sampling: temperature > 0 scales the logits, top_k > 0 keeps the k largest (ties: lower ids
// first), then one draw from the softmax with a counter-based random number: a pure function of
// (seed, step), so a (seed, prompt) pair always gives the same text. temperature <= 0: greedy.
int32_t sample_token(std::span<const float> logits, double temperature, int64_t top_k, uint64_t seed, uint64_t step);

}  // namespace tpt
