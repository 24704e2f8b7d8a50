// Hugging Face Mixture-of-Experts checkpoints (interop/hf/llama.h; docs/MOE.md "Hugging Face
// checkpoints"): MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM, whose attention,
// norms, embeddings and dense MLPs are Llama's (interop/hf/llama_*.cpp). Here: their MoE keys of
// config.json, the router / experts / shared expert gate tensors in and out, Qwen3-MoE's q/k norms
// (self_attn.q_norm / k_norm [D] <-> h.<l>.attn.q_layernorm / k_layernorm, model.qk_layernorm).
//   HF (transformers' modeling_mixtral.py, modeling_qwen2_moe.py, modeling_qwen3_moe.py)   ours
//   <mlp>.gate.weight [E, C]                                       h.<l>.mlp.router.weight (E, C)
//   <mlp>.experts.<e>.w1 | gate_proj [Fe, C], w3 | up_proj [Fe, C]  h.<l>.mlp.experts.fc1.weight (E, 2, Fe, C)
//   <mlp>.experts.<e>.w2 | down_proj [C, Fe]                       h.<l>.mlp.experts.fc2.weight (E, C, Fe)
//   mlp.shared_expert.{gate,up,down}_proj                          h.<l>.mlp.shared_experts.fc1 / fc2 (llama_load.cpp)
//   mlp.shared_expert_gate.weight [1, C]                           h.<l>.mlp.shared_experts.gate.weight (1, C)
// <mlp> is Mixtral's model.layers.<l>.block_sparse_moe, Qwen's model.layers.<l>.mlp. The router:
// HF takes softmax over all E, the top k, and renormalises them when Mixtral or norm_topk_prob --
// Megatron's top-k of the logits then softmax over the k (moe_router_pre_softmax: false); without
// renormalising (norm_topk_prob: false) Megatron's moe_router_pre_softmax: true.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "interop/hf/llama_detail.h"

namespace tpt::llama_detail {

namespace {

const char* expert_names(HFArch a, int w) {  // w: 0 gate, 1 up, 2 down
  static const char* mixtral[] = {"w1", "w3", "w2"};
  static const char* qwen[] = {"gate_proj", "up_proj", "down_proj"};
  return a == HFArch::Mixtral ? mixtral[w] : qwen[w];
}

// Which layers HF makes sparse: Qwen's (l not in mlp_only_layers) and (l + 1) % decoder_sparse_step == 0;
// Mixtral's every layer.
std::vector<int> hf_sparse_layers(const nlohmann::json& hf, HFArch a, int64_t L, const std::string& where) {
  std::vector<int> moe(size_t(L), 1);
  if (a == HFArch::Mixtral) return moe;
  int64_t step = 1;
  if (hf.contains("decoder_sparse_step") && !hf["decoder_sparse_step"].is_null()) {
    if (!hf["decoder_sparse_step"].is_number_integer() || hf["decoder_sparse_step"].get<int64_t>() < 1)
      input_error(where + ": decoder_sparse_step is " + jtext(hf["decoder_sparse_step"]) + " (an integer >= 1 is needed)");
    step = hf["decoder_sparse_step"].get<int64_t>();
  }
  for (int64_t l = 0; l < L; ++l) moe[size_t(l)] = (l + 1) % step == 0;
  if (hf.contains("mlp_only_layers") && !hf["mlp_only_layers"].is_null()) {
    if (!hf["mlp_only_layers"].is_array()) input_error(where + ": mlp_only_layers is " + jtext(hf["mlp_only_layers"]));
    for (const auto& v : hf["mlp_only_layers"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= L)
        input_error(where + ": mlp_only_layers holds " + jtext(v) + " (layer indices 0.." + std::to_string(L - 1) + ")");
      moe[size_t(v.get<int64_t>())] = 0;
    }
  }
  return moe;
}

std::string pattern_text(const std::vector<int>& p) {
  std::string s = "[";
  for (size_t i = 0; i < p.size(); ++i) s += (i ? ", " : "") + std::to_string(p[i]);
  return s + "]";
}

// A router option HF's MoE blocks do not have (a softmax router, no scaling, groups or expert bias).
std::string router_incompatibility(const ModelConfig& m) {
  if (m.moe_router_score_function != MoEScore::Softmax)
    return "model.moe_router_score_function is sigmoid (Mixtral's and Qwen's routers are a softmax)";
  if (m.moe_router_topk_scaling_factor != 0) return "model.moe_router_topk_scaling_factor is set (HF: no scaling)";
  if (m.moe_router_num_groups != 0) return "model.moe_router_num_groups is set (HF: no group-limited routing)";
  if (m.moe_router_enable_expert_bias) return "model.moe_router_enable_expert_bias is true (HF: no expert bias)";
  if (m.add_bias_linear) return "model.add_bias_linear is true (HF's experts have no biases)";
  return "";
}

}  // namespace

void check_hf_moe_config(const nlohmann::json& hf, HFArch a, const ModelConfig& m, const std::string& where) {
  const std::string name = arch_name(a);
  auto integer = [&](const char* key, int64_t def) -> int64_t {
    if (!hf.contains(key) || hf[key].is_null()) return def;
    if (!hf[key].is_number_integer()) input_error(where + ": " + key + " is " + jtext(hf[key]) + ", not an integer");
    return hf[key].get<int64_t>();
  };
  auto same = [&](const char* key, int64_t got, const char* ours, int64_t want) {
    if (got != want)
      input_error(where + ": " + key + " is " + std::to_string(got) + " but " + ours + " is " + std::to_string(want));
  };
  if (const std::string why = router_incompatibility(m); !why.empty())
    input_error(where + ": " + name + " cannot hold this model: " + why);
  // HF defaults: MixtralConfig (8 experts, top 2), Qwen2MoeConfig (60, top 4, 1408, shared 5632),
  // Qwen3MoeConfig (128, top 8, 768)
  const bool mixtral = a == HFArch::Mixtral, qwen2 = a == HFArch::Qwen2Moe;
  same(mixtral ? "num_local_experts" : "num_experts", integer(mixtral ? "num_local_experts" : "num_experts",
                                                              mixtral ? 8 : qwen2 ? 60 : 128),
       "model.num_moe_experts", m.num_moe_experts);
  same("num_experts_per_tok", integer("num_experts_per_tok", mixtral ? 2 : qwen2 ? 4 : 8), "model.moe_router_topk",
       m.moe_router_topk);
  if (mixtral) same("intermediate_size", integer("intermediate_size", 14336), "model.moe_ffn_hidden_size",
                    m.moe_ffn_hidden_size);
  else same("moe_intermediate_size", integer("moe_intermediate_size", qwen2 ? 1408 : 768), "model.moe_ffn_hidden_size",
            m.moe_ffn_hidden_size);
  if (qwen2) {
    same("shared_expert_intermediate_size", integer("shared_expert_intermediate_size", 5632),
         "model.moe_shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size);
    if (!m.moe_shared_expert_gate)
      input_error(where + ": Qwen2-MoE gates its shared expert (mlp.shared_expert_gate) but model.moe_shared_expert_gate is false");
  } else if (m.moe_shared_expert_intermediate_size) {
    input_error(where + ": " + name + " has no shared expert but model.moe_shared_expert_intermediate_size is " +
                std::to_string(m.moe_shared_expert_intermediate_size));
  }
  // the router's normalisation of the top k: Mixtral always; Qwen with norm_topk_prob (default false)
  bool norm = true;
  if (!mixtral && hf.contains("norm_topk_prob") && !hf["norm_topk_prob"].is_null()) {
    if (!hf["norm_topk_prob"].is_boolean()) input_error(where + ": norm_topk_prob is " + jtext(hf["norm_topk_prob"]));
    norm = hf["norm_topk_prob"].get<bool>();
  } else if (!mixtral) {
    norm = false;
  }
  if (norm == m.moe_router_pre_softmax)
    input_error(where + ": " + (mixtral ? std::string("Mixtral renormalises its top-k probabilities")
                                        : std::string("norm_topk_prob is ") + (norm ? "true" : "false")) +
                " but model.moe_router_pre_softmax is " + (m.moe_router_pre_softmax ? "true" : "false") +
                " (norm_topk_prob: true <-> pre_softmax: false, false <-> true)");
  if (mixtral && hf.contains("router_jitter_noise") && !hf["router_jitter_noise"].is_null() &&
      !(hf["router_jitter_noise"].is_number() && hf["router_jitter_noise"].get<double>() == 0))
    input_error(where + ": router_jitter_noise is " + jtext(hf["router_jitter_noise"]) +
                ": tptrain's router has no jitter (it must be 0)");
  // which layers are MoE: HF's decoder_sparse_step / mlp_only_layers against model.moe_layer_freq
  std::vector<int> want = hf_sparse_layers(hf, a, m.num_layers, where), have;
  for (int64_t l = 0; l < m.num_layers; ++l) have.push_back(m.is_moe_layer(l));
  if (want != have)
    input_error(where + ": " +
                (mixtral ? std::string("every Mixtral layer is MoE")
                         : "decoder_sparse_step / mlp_only_layers make the MoE layers " + pattern_text(want)) +
                " but model.moe_layer_freq makes them " + pattern_text(have));
  // sliding windows: none (or one no shorter than every position)
  if (mixtral && hf.contains("sliding_window") && !hf["sliding_window"].is_null() &&
      !(hf["sliding_window"].is_number_integer() && hf["sliding_window"].get<int64_t>() >= m.max_position_embeddings))
    input_error(where + ": sliding_window is " + jtext(hf["sliding_window"]) +
                ": tptrain's attention is full causal (null, or at least model.max_position_embeddings)");
  if (!mixtral && hf.contains("use_sliding_window") && hf["use_sliding_window"] == true)
    input_error(where + ": use_sliding_window is true: tptrain's attention is full causal");
}

std::string hf_mlp_prefix(HFArch a, int64_t l) {
  return "model.layers." + std::to_string(l) + (a == HFArch::Mixtral ? ".block_sparse_moe." : ".mlp.");
}

void hf_moe_expected(HFArch a, const ModelConfig& m, int64_t l, std::map<std::string, std::vector<int64_t>>& out) {
  const int64_t C = m.hidden_size, E = m.num_moe_experts, Fe = m.moe_ffn_hidden_size,
                Fs = m.moe_shared_expert_intermediate_size;
  if (a == HFArch::Qwen3Moe) {
    const int64_t D = llama_dims(m).D;
    out["model.layers." + std::to_string(l) + ".self_attn.q_norm.weight"] = {D};
    out["model.layers." + std::to_string(l) + ".self_attn.k_norm.weight"] = {D};
  }
  if (!m.is_moe_layer(l)) return;
  const std::string p = hf_mlp_prefix(a, l);
  out[p + "gate.weight"] = {E, C};
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = p + "experts." + std::to_string(e) + ".";
    out[x + expert_names(a, 0) + ".weight"] = {Fe, C};
    out[x + expert_names(a, 1) + ".weight"] = {Fe, C};
    out[x + expert_names(a, 2) + ".weight"] = {C, Fe};
  }
  if (Fs) {
    out[p + "shared_expert.gate_proj.weight"] = {Fs, C};
    out[p + "shared_expert.up_proj.weight"] = {Fs, C};
    out[p + "shared_expert.down_proj.weight"] = {C, Fs};
    if (m.moe_shared_expert_gate) out[p + "shared_expert_gate.weight"] = {1, C};
  }
}

bool load_hf_moe_param(HFArch a, const HFShards& hf, const ModelConfig& m, const ParamInfo& pi, int64_t l,
                       const std::string& rest, float* out) {
  if (!is_moe_arch(a)) return false;
  const int64_t C = m.hidden_size, E = m.num_moe_experts, Fe = m.moe_ffn_hidden_size;
  const std::string p = hf_mlp_prefix(a, l);
  if (rest == "mlp.router.weight") {
    hf.rows(p + "gate.weight", {E, C}, 0, E, out);
  } else if (rest == "mlp.shared_experts.gate.weight") {
    hf.rows(p + "shared_expert_gate.weight", {1, C}, 0, 1, out);
  } else if (rest == "mlp.experts.fc1.weight" || rest == "mlp.experts.fc2.weight") {
    // this rank's experts: a box along dimension 0, and with ETP > 1 along the width (dimension 2 of
    // both: (E, 2, Fe, C) and (E, C, Fe)), columns [f0, f0 + Fl) of each expert's width
    const bool fc1 = rest == "mlp.experts.fc1.weight";
    for (size_t k = 1; k < pi.global_shape.size(); ++k)
      if (k != 2 && (pi.box_offset[k] != 0 || pi.box_size[k] != pi.global_shape[k]))
        internal_error("load_hf_moe_param: " + pi.name + " is split along dimension " + std::to_string(k));
    const int64_t f0 = pi.box_offset[2], Fl = pi.box_size[2];
    std::vector<float> down(fc1 || Fl == Fe ? 0 : size_t(C * Fe));
    for (int64_t el = 0; el < pi.box_size[0]; ++el) {
      const std::string x = p + "experts." + std::to_string(pi.box_offset[0] + el) + ".";
      if (fc1) {  // [gate; up]
        hf.rows(x + expert_names(a, 0) + ".weight", {Fe, C}, f0, Fl, out + (2 * el) * Fl * C);
        hf.rows(x + expert_names(a, 1) + ".weight", {Fe, C}, f0, Fl, out + (2 * el + 1) * Fl * C);
      } else if (Fl == Fe) {
        hf.rows(x + expert_names(a, 2) + ".weight", {C, Fe}, 0, C, out + el * C * Fe);
      } else {  // the columns of the rank's width
        hf.rows(x + expert_names(a, 2) + ".weight", {C, Fe}, 0, C, down.data());
        for (int64_t c = 0; c < C; ++c)
          std::copy_n(down.data() + c * Fe + f0, Fl, out + (el * C + c) * Fl);
      }
    }
  } else if (rest == "attn.q_layernorm.weight" || rest == "attn.k_layernorm.weight") {  // Qwen3-MoE (model.qk_layernorm)
    const LlamaDims d = llama_dims(m);
    std::vector<float> w(size_t(d.D));
    hf.rows("model.layers." + std::to_string(l) + ".self_attn." + (rest[5] == 'q' ? "q" : "k") + "_norm.weight", {d.D},
            0, d.D, w.data());
    for (int64_t c = 0; c < d.D; ++c) out[c] = w[size_t(hf_channel(c, d.D, d.interleaved))];  // our RoPE channel order
  } else {
    return false;
  }
  return true;
}

HFArch hf_moe_export_arch(const ModelConfig& m, std::string* why) {
  *why = router_incompatibility(m);
  if (!why->empty()) return HFArch::Other;
  if (m.qk_layernorm) {  // Qwen3-MoE: q/k norms, no shared expert, no attention biases
    if (m.moe_shared_expert_intermediate_size) *why = "model.qk_layernorm with a shared expert (Qwen3-MoE has none)";
    else if (m.add_qkv_bias) *why = "model.qk_layernorm with model.add_qkv_bias (Qwen3-MoE: no q/k/v biases)";
    return why->empty() ? HFArch::Qwen3Moe : HFArch::Other;
  }
  if (m.moe_shared_expert_intermediate_size) {  // Qwen2-MoE: a gated shared expert, q/k/v biases
    if (!m.moe_shared_expert_gate)
      *why = "a shared expert without model.moe_shared_expert_gate (Qwen2-MoE gates it)";
    else if (!m.add_qkv_bias)
      *why = "a shared expert without model.add_qkv_bias (Qwen2-MoE has q/k/v biases)";
    return why->empty() ? HFArch::Qwen2Moe : HFArch::Other;
  }
  // Mixtral: every layer MoE, the top-k renormalised, no biases
  for (int64_t l = 0; l < m.num_layers; ++l)
    if (!m.is_moe_layer(l)) *why = "dense layers (model.moe_layer_freq) without a shared expert";
  if (m.moe_router_pre_softmax) *why = "model.moe_router_pre_softmax: true without a shared expert";
  if (m.add_qkv_bias) *why = "model.add_qkv_bias without a shared expert";
  if (!why->empty()) {
    *why += ": Mixtral cannot hold it (and Qwen3-MoE has q/k norms: model.qk_layernorm)";
    return HFArch::Other;
  }
  return HFArch::Mixtral;
}

void hf_moe_config(HFArch a, const ModelConfig& m, nlohmann::json& cfg) {
  for (const char* k : {"attention_bias", "mlp_bias", "pretraining_tp"}) cfg.erase(k);
  cfg["architectures"] = {arch_name(a)};
  cfg["num_experts_per_tok"] = m.moe_router_topk;
  cfg["router_aux_loss_coef"] = m.moe_aux_loss_coeff;
  cfg["output_router_logits"] = false;
  if (a == HFArch::Mixtral) {
    cfg["model_type"] = "mixtral";
    cfg["intermediate_size"] = m.moe_ffn_hidden_size;
    cfg["num_local_experts"] = m.num_moe_experts;
    cfg["router_jitter_noise"] = 0.0;
    cfg["sliding_window"] = nullptr;
    return;
  }
  cfg["model_type"] = a == HFArch::Qwen2Moe ? "qwen2_moe" : "qwen3_moe";
  cfg["num_experts"] = m.num_moe_experts;
  cfg["moe_intermediate_size"] = m.moe_ffn_hidden_size;
  cfg["norm_topk_prob"] = !m.moe_router_pre_softmax;
  cfg["use_sliding_window"] = false;
  if (a == HFArch::Qwen2Moe) {
    cfg["shared_expert_intermediate_size"] = m.moe_shared_expert_intermediate_size;
    cfg["qkv_bias"] = true;
  } else {
    cfg["attention_bias"] = false;
  }
  // the MoE layers: the smallest decoder_sparse_step that gives them, else step 1 and mlp_only_layers
  std::vector<int> have;
  for (int64_t l = 0; l < m.num_layers; ++l) have.push_back(m.is_moe_layer(l));
  nlohmann::json dense = nlohmann::json::array();
  int64_t step = 1;
  for (int64_t s = 1; s <= m.num_layers; ++s) {
    bool fits = true;
    for (int64_t l = 0; l < m.num_layers; ++l) fits = fits && have[size_t(l)] == ((l + 1) % s == 0);
    if (fits) { step = s; break; }
    if (s == m.num_layers) {
      for (int64_t l = 0; l < m.num_layers; ++l)
        if (!have[size_t(l)]) dense.push_back(l);
    }
  }
  cfg["decoder_sparse_step"] = step;
  cfg["mlp_only_layers"] = dense;
}

void hf_moe_tensors(HFArch a, const ModelConfig& m, int64_t l, std::vector<HFLlamaTensor>& out) {
  using Read = std::function<const std::vector<float>&(const std::string&)>;
  const int64_t C = m.hidden_size, E = m.num_moe_experts, Fe = m.moe_ffn_hidden_size;
  const std::string p = hf_mlp_prefix(a, l), o = "h." + std::to_string(l) + ".mlp.";
  auto slice = [&](const std::string& hf, std::vector<int64_t> shape, const std::string& ours, int64_t at) {
    const int64_t n = shape[0] * (shape.size() > 1 ? shape[1] : 1);
    out.push_back({hf, std::move(shape), [ours, at, n](const Read& read) {
                     const std::vector<float>& src = read(ours);
                     return std::vector<float>(src.begin() + at, src.begin() + at + n);
                   }});
  };
  slice(p + "gate.weight", {E, C}, o + "router.weight", 0);
  // every expert's gate and up from one fc1 tensor, then their down from fc2 (one whole tensor read each)
  for (int64_t e = 0; e < E; ++e)
    for (int w = 0; w < 2; ++w)
      slice(p + "experts." + std::to_string(e) + "." + expert_names(a, w) + ".weight", {Fe, C},
            o + "experts.fc1.weight", (2 * e + w) * Fe * C);
  for (int64_t e = 0; e < E; ++e)
    slice(p + "experts." + std::to_string(e) + "." + expert_names(a, 2) + ".weight", {C, Fe},
          o + "experts.fc2.weight", e * C * Fe);
  if (m.moe_shared_expert_gate) slice(p + "shared_expert_gate.weight", {1, C}, o + "shared_experts.gate.weight", 0);
}

}  // namespace tpt::llama_detail
