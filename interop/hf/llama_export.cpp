// The Llama export (interop/hf/llama.h): each HF tensor of a LlamaForCausalLM from our whole global
// tensors, and those tensors' global shapes.
#include <algorithm>

#include "core/error.h"
#include "interop/hf/llama.h"
#include "interop/hf/llama_detail.h"
#include "model/gpt.h"
#include "model/layers.h"

namespace tpt {

using namespace llama_detail;

int64_t HFLlamaTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::vector<int64_t> llama_global_shape(const ModelConfig& m, const std::string& name) {
  Config c;
  c.model = m;
  // global shapes: the layout of one rank holding every layer and expert
  const ParamLayout layout = make_param_layout(make_dims(c, 1, 0, 1, 0));
  if (name == "wte.weight" || name == "lm_head.weight") return {llama_dims(m).V, m.hidden_size};  // unpadded
  for (const ParamInfo& p : layout.params)
    if (p.name == name) return p.global_shape;
  internal_error("llama_global_shape: no tensor " + name);
}

std::vector<HFLlamaTensor> hf_llama_tensors(const ModelConfig& m) {
  const LlamaDims d = llama_dims(m);
  const bool grouped = m.group_query_attention, qkv_bias = d.bias || m.add_qkv_bias;
  std::string why;
  const HFArch arch = m.is_moe() ? hf_moe_export_arch(m, &why) : HFArch::Llama;
  const int64_t C = d.C, D = d.D, HD = d.H * D, GD = d.G * D;
  using Read = std::function<const std::vector<float>&(const std::string&)>;
  std::vector<HFLlamaTensor> out;
  auto same = [&](const std::string& hf, std::vector<int64_t> shape, const std::string& ours) {
    out.push_back({hf, std::move(shape), [ours](const Read& read) { return read(ours); }});
  };
  // rows of the q (w = 0), k (1) or v (2) heads of our qkv tensor, in HF's order
  auto qkv_part = [&](const std::string& hf, const std::string& ours, int w, bool weight) {
    const int64_t cols = weight ? C : 1, rows = w == 0 ? HD : GD;
    out.push_back({hf, weight ? std::vector<int64_t>{rows, C} : std::vector<int64_t>{rows},
                   [=](const Read& read) {
                     const std::vector<float>& src = read(ours);
                     std::vector<float> dst(size_t(rows * cols));
                     const int64_t hs = D * cols, heads = rows / D;
                     for (int64_t i = 0; i < heads; ++i) {  // HF head i
                       int64_t at;  // its first float in ours
                       if (grouped) at = w == 0 ? ((i / d.Q) * (d.Q + 2) + i % d.Q) * hs : (i * (d.Q + 2) + d.Q + w - 1) * hs;
                       else at = (w * HD + i * D) * cols;
                       for (int64_t c = 0; c < D; ++c)  // our channel c -> HF channel hf_channel(c)
                         std::copy_n(src.data() + at + c * cols, cols,
                                     dst.data() + i * hs + hf_channel(c, D, w < 2 && d.interleaved) * cols);
                     }
                     return dst;
                   }});
  };
  auto fc1_part = [&](const std::string& hf, const std::string& ours, int w, bool weight, int64_t F) {
    const int64_t cols = weight ? C : 1;
    out.push_back({hf, weight ? std::vector<int64_t>{F, C} : std::vector<int64_t>{F}, [=](const Read& read) {
                     const std::vector<float>& src = read(ours);
                     return std::vector<float>(src.begin() + w * F * cols, src.begin() + (w + 1) * F * cols);
                   }});
  };
  // a dense MLP (HF prefix `hf`: "...mlp." or a shared expert's "...mlp.shared_expert.") of width F
  auto mlp = [&](const std::string& hf, const std::string& o, int64_t F) {
    fc1_part(hf + "gate_proj.weight", o + "fc1.weight", 0, true, F);
    if (d.bias) fc1_part(hf + "gate_proj.bias", o + "fc1.bias", 0, false, F);
    fc1_part(hf + "up_proj.weight", o + "fc1.weight", 1, true, F);
    if (d.bias) fc1_part(hf + "up_proj.bias", o + "fc1.bias", 1, false, F);
    same(hf + "down_proj.weight", {C, F}, o + "fc2.weight");
    if (d.bias) same(hf + "down_proj.bias", {C}, o + "fc2.bias");
  };
  same("model.embed_tokens.weight", {d.V, C}, "wte.weight");
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".", o = "h." + std::to_string(l) + ".";
    same(h + "input_layernorm.weight", {C}, o + "ln_1.weight");
    const char* qkv[] = {"q_proj", "k_proj", "v_proj"};
    for (int w = 0; w < 3; ++w) {
      qkv_part(h + "self_attn." + qkv[w] + ".weight", o + "attn.qkv.weight", w, true);
      if (qkv_bias) qkv_part(h + "self_attn." + qkv[w] + ".bias", o + "attn.qkv.bias", w, false);
    }
    same(h + "self_attn.o_proj.weight", {C, HD}, o + "attn.proj.weight");
    if (m.qk_layernorm)  // Qwen3-MoE's q_norm / k_norm [D], back to HF's channel order
      for (const char* w : {"q", "k"}) {
        const std::string ours = o + "attn." + w + "_layernorm.weight";
        const bool inter = d.interleaved;
        out.push_back({h + "self_attn." + w + "_norm.weight", {D}, [ours, D, inter](const Read& read) {
                         const std::vector<float>& src = read(ours);
                         std::vector<float> dst(static_cast<size_t>(D));
                         for (int64_t c = 0; c < D; ++c) dst[size_t(hf_channel(c, D, inter))] = src[size_t(c)];
                         return dst;
                       }});
      }
    if (d.bias) same(h + "self_attn.o_proj.bias", {C}, o + "attn.proj.bias");
    same(h + "post_attention_layernorm.weight", {C}, o + "ln_2.weight");
    if (!m.is_moe_layer(l)) {
      mlp(h + "mlp.", o + "mlp.", d.F);
      continue;
    }
    hf_moe_tensors(arch, m, l, out);  // router, experts, the shared expert's gate
    if (m.moe_shared_expert_intermediate_size)
      mlp(hf_mlp_prefix(arch, l) + "shared_expert.", o + "mlp.shared_experts.", m.moe_shared_expert_intermediate_size);
  }
  same("model.norm.weight", {C}, "ln_f.weight");
  if (d.untied) same("lm_head.weight", {d.V, C}, "lm_head.weight");
  return out;
}

}  // namespace tpt
