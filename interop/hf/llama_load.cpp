// The Llama import (interop/hf/llama.h): what model.init_from names (Llama or GPT-2, by config.json),
// and a LlamaForCausalLM checkpoint read into this rank's boxes of the parameter buffer.
#include "interop/hf/llama.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "core/safetensors.h"
#include "interop/hf/gpt2.h"
#include "interop/hf/llama_detail.h"
#include "interop/hf/shards.h"
#include "model/layers.h"

namespace tpt {

using namespace llama_detail;

void load_hf_llama(const std::string& path, const ModelConfig& m, const ParamLayout& layout, float* params) {
  const std::string what = "model.init_from";
  const HFPaths p = hf_paths(path);
  if (p.config.empty())
    input_error(what + ": " + path + ": no config.json " + (p.file.empty() ? "in it" : "beside it") +
                " (a Hugging Face Llama checkpoint needs one)");
  const nlohmann::json cfg = read_json_file(p.config, what);
  check_hf_llama_config(cfg, m, what + ": " + p.config);
  std::string described;
  const HFArch arch = architecture_of(cfg, &described);
  const HFShards hf(p, what);
  const LlamaDims d = llama_dims(m);
  const bool qkv_bias = d.bias || m.add_qkv_bias;
  const int64_t C = d.C, D = d.D, HD = d.H * d.D, GD = d.G * d.D;

  // the tensors config.json implies; anything else in the checkpoint is an error (rotary_emb.inv_freq
  // buffers are skipped, a tied checkpoint's lm_head.weight is HF's tied copy and ignored)
  std::map<std::string, std::vector<int64_t>> expected = {{"model.embed_tokens.weight", {d.V, C}},
                                                          {"model.norm.weight", {C}}};
  if (d.untied) expected["lm_head.weight"] = {d.V, C};
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".";
    expected[h + "input_layernorm.weight"] = {C};
    expected[h + "post_attention_layernorm.weight"] = {C};
    expected[h + "self_attn.q_proj.weight"] = {HD, C};
    expected[h + "self_attn.k_proj.weight"] = {GD, C};
    expected[h + "self_attn.v_proj.weight"] = {GD, C};
    expected[h + "self_attn.o_proj.weight"] = {C, HD};
    if (is_moe_arch(arch)) hf_moe_expected(arch, m, l, expected);  // its MoE MLP, Qwen3's q/k norms
    if (!m.is_moe_layer(l)) {
      expected[h + "mlp.gate_proj.weight"] = {d.F, C};
      expected[h + "mlp.up_proj.weight"] = {d.F, C};
      expected[h + "mlp.down_proj.weight"] = {C, d.F};
    }
    if (qkv_bias) {
      expected[h + "self_attn.q_proj.bias"] = {HD};
      expected[h + "self_attn.k_proj.bias"] = {GD};
      expected[h + "self_attn.v_proj.bias"] = {GD};
    }
    if (d.bias) {
      expected[h + "self_attn.o_proj.bias"] = {C};
      expected[h + "mlp.gate_proj.bias"] = {d.F};
      expected[h + "mlp.up_proj.bias"] = {d.F};
      expected[h + "mlp.down_proj.bias"] = {C};
    }
  }
  for (const std::string& n : hf.names()) {
    if (expected.count(n) || n.ends_with(".rotary_emb.inv_freq") || (n == "lm_head.weight" && !d.untied)) continue;
    input_error(what + ": " + hf.where() + ": unexpected tensor '" + n + "' (config.json: " + arch_name(arch) +
                ", " + std::to_string(d.L) + " layers" +
                (m.is_moe() ? ", " + std::to_string(m.num_moe_experts) + " experts" : std::string()) + ", biases " +
                (d.bias ? "all" : qkv_bias ? "q/k/v" : "none") + ")");
  }
  for (const auto& [n, shape] : expected) hf.check(n, shape);  // every tensor, whichever rank needs it
  for (const std::string& t : hf.dtypes())
    if (t != "F32" && t != "BF16" && t != "F16" && t != "F64")
      input_error(what + ": " + hf.where() + ": tensors of dtype " + t + " (need BF16, F16 or F32)");

  // D rows of a q/k/v head (rows [r0, r0 + D) of `name`, cols values each) into out, permuted into our
  // RoPE pair order when `rotary` and the model uses interleaved RoPE
  std::vector<float> tmp;
  auto head = [&](const std::string& name, const std::vector<int64_t>& shape, int64_t r0, bool rotary, float* out) {
    const int64_t cols = shape.size() == 2 ? shape[1] : 1;
    if (!(rotary && d.interleaved)) return hf.rows(name, shape, r0, D, out);
    tmp.resize(size_t(D * cols));
    hf.rows(name, shape, r0, D, tmp.data());
    for (int64_t c = 0; c < D; ++c)
      std::copy_n(tmp.data() + hf_channel(c, D, true) * cols, cols, out + c * cols);
  };

  for (const ParamInfo& pi : layout.params) {
    float* out = params + pi.offset;
    std::fill(out, out + pi.numel, 0.0f);
    const std::string& n = pi.name;
    if (n == "wte.weight" || n == "lm_head.weight") {  // vocab-parallel rows; padded rows stay zero
      const std::string t = n == "wte.weight" ? "model.embed_tokens.weight" : "lm_head.weight";
      hf.rows(t, {d.V, C}, pi.box_offset[0], pi.box_size[0], out);
      continue;
    }
    if (n == "ln_f.weight") {
      hf.rows("model.norm.weight", {C}, 0, C, out);
      continue;
    }
    if (n.rfind("h.", 0) != 0) internal_error("load_hf_llama: no mapping for parameter " + n);
    const size_t dot = n.find('.', 2);
    const std::string rest = n.substr(dot + 1);
    const int64_t layer = std::stoll(n.substr(2, dot - 2));
    const std::string h = "model.layers." + std::to_string(layer) + ".";
    if (load_hf_moe_param(arch, hf, m, pi, layer, rest, out)) continue;
    // the dense MLP, or an MoE layer's shared expert (HF's mlp.shared_expert.*, width Fs) the same way
    const bool shared = rest.starts_with("mlp.shared_experts.");
    const std::string mlp = shared ? h + "mlp.shared_expert." : h + "mlp.";
    const int64_t F = shared ? m.moe_shared_expert_intermediate_size : d.F;
    const bool weight = rest.ends_with(".weight");
    const std::string kind = weight ? "weight" : "bias";
    auto shape2 = [&](int64_t rows, int64_t cols) {
      return weight ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
    };
    const int64_t cols = weight ? C : 1;
    if (rest == "ln_1.weight") {
      hf.rows(h + "input_layernorm.weight", {C}, 0, C, out);
    } else if (rest == "ln_2.weight") {
      hf.rows(h + "post_attention_layernorm.weight", {C}, 0, C, out);
    } else if (rest == "attn.qkv.weight" || rest == "attn.qkv.bias") {
      const std::string q = h + "self_attn.q_proj." + kind, k = h + "self_attn.k_proj." + kind,
                        v = h + "self_attn.v_proj." + kind;
      const auto qs = shape2(HD, C), kvs = shape2(GD, C);
      const int64_t hs = D * cols;  // floats per head
      if (pi.global_shape.size() == (weight ? 4u : 3u)) {  // grouped [G, Q + 2, D, (C)]: this rank's groups
        for (int64_t gl = 0; gl < pi.box_size[0]; ++gl) {
          const int64_t g = pi.box_offset[0] + gl;
          float* o = out + gl * (d.Q + 2) * hs;
          for (int64_t i = 0; i < d.Q; ++i) head(q, qs, (g * d.Q + i) * D, true, o + i * hs);
          head(k, kvs, g * D, true, o + d.Q * hs);
          head(v, kvs, g * D, false, o + (d.Q + 1) * hs);
        }
      } else {  // [3, H D, (C)] sharded along the heads
        const int64_t first = pi.box_offset[1] / D, heads = pi.box_size[1] / D;
        for (int64_t w = 0; w < 3; ++w)
          for (int64_t i = 0; i < heads; ++i)
            head(w == 0 ? q : w == 1 ? k : v, w == 0 ? qs : kvs, (first + i) * D, w < 2,
                 out + (w * heads + i) * hs);
      }
    } else if (rest == "attn.proj.weight") {  // [C, H D]: columns of this rank's heads
      const SafetensorsReader& st = hf.check(h + "self_attn.o_proj.weight", {C, HD});
      st.read_box(h + "self_attn.o_proj.weight", pi.box_offset, pi.box_size, out);
    } else if (rest == "attn.proj.bias") {
      hf.rows(h + "self_attn.o_proj.bias", {C}, 0, C, out);
    } else if (rest.ends_with("fc1.weight") || rest.ends_with("fc1.bias")) {  // [2, F, (C)] = [gate; up], this rank's rows
      const int64_t f0 = pi.box_offset[1], fl = pi.box_size[1];
      hf.rows(mlp + "gate_proj." + kind, shape2(F, C), f0, fl, out);
      hf.rows(mlp + "up_proj." + kind, shape2(F, C), f0, fl, out + fl * cols);
    } else if (rest.ends_with("fc2.weight")) {  // [C, F]: columns of this rank
      const SafetensorsReader& st = hf.check(mlp + "down_proj.weight", {C, F});
      st.read_box(mlp + "down_proj.weight", pi.box_offset, pi.box_size, out);
    } else if (rest.ends_with("fc2.bias")) {
      hf.rows(mlp + "down_proj.bias", {C}, 0, C, out);
    } else {
      internal_error("load_hf_llama: no mapping for parameter " + n);
    }
  }
  const std::set<std::string> dt = hf.dtypes();
  std::string dts;
  for (const std::string& t : dt) dts += (dts.empty() ? "" : "/") + t;
  const char* family[] = {"Llama", "Mixtral", "Qwen2-MoE", "Qwen3-MoE"};
  const std::string moe = m.is_moe() ? ", " + std::to_string(m.num_moe_experts) + " experts top-" +
                                           std::to_string(m.moe_router_topk) +
                                           (m.moe_shared_expert_intermediate_size ? " + a shared expert" : "")
                                     : "";
  spdlog::info("init_from: Hugging Face {} {} ({} shard{}, {}; {} layers, hidden {}, {} heads / {} KV groups, vocab {}"
               "{}{})",
               family[int(arch) - int(HFArch::Llama)], hf.where(), hf.num_shards(), hf.num_shards() == 1 ? "" : "s",
               dts, d.L, C, d.H, d.G, d.V, moe, d.interleaved ? "; q/k rows permuted to interleaved RoPE" : "");
}

void load_init_from(const ModelConfig& m, const GPTDims& d, const ParamLayout& layout, float* params) {
  const std::string& path = m.init_from;
  const HFPaths p = hf_paths(path);
  HFArch arch = HFArch::None;
  std::string described;
  if (!p.config.empty()) arch = architecture_of(read_json_file(p.config, "model.init_from"), &described);
  if (arch == HFArch::Other)
    input_error("model.init_from: " + p.config + ": unknown architecture (" + described +
                "): tptrain imports LlamaForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM "
                "and GPT2LMHeadModel");
  if (arch == HFArch::Llama || is_moe_arch(arch)) return load_hf_llama(path, m, layout, params);
  if (m.is_moe())
    input_error("model.init_from: " + path + " holds Hugging Face GPT-2 weights, which have no experts (model." +
                "num_moe_experts is " + std::to_string(m.num_moe_experts) +
                "); MoE checkpoints are MixtralForCausalLM, Qwen2MoeForCausalLM or Qwen3MoeForCausalLM directories");
  // HF GPT-2: a safetensors file (a directory or its config.json: its model.safetensors)
  if (!p.index.empty())
    input_error("model.init_from: " + path + ": a sharded checkpoint, but " +
                (p.config.empty() ? std::string("there is no config.json beside it") : p.config + " is GPT-2's") +
                " (tptrain reads sharded Llama checkpoints; GPT-2 from one model.safetensors)");
  if (!is_gpt2_architecture(m))
    input_error("model.init_from: " + path + " holds Hugging Face GPT-2 weights" +
                (p.config.empty() ? " (no config.json names another architecture)" : "") +
                ", which cannot hold this model (" + describe_architecture(m) +
                "); a Llama checkpoint is a directory with config.json (LlamaForCausalLM)");
  const std::string file = p.file.empty() ? p.dir + "/model.safetensors" : p.file;
  load_hf_gpt2(file, d, layout, params);
}

}  // namespace tpt
