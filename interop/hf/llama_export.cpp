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
  const GPTDims d = make_dims(c, 1, 0, 1, 0);  // global shapes: the layer spec of one rank holding all
  if (name == "wte.weight" || name == "lm_head.weight") return {d.V, d.C};
  if (name == "ln_f.weight") return {d.C};
  const std::string rest = name.substr(name.find('.', 2) + 1);  // h.<l>.<part>.<weight | bias>
  for (const LayerPart& part : d.layer.parts) {
    if (rest == part.name() + ".weight") return part.is_linear ? part.linear.weight_shape : std::vector<int64_t>{d.C};
    if (rest == part.name() + ".bias" && (part.is_linear || d.norm.has_bias()))
      return part.is_linear ? part.linear.bias_shape() : std::vector<int64_t>{d.C};
  }
  internal_error("llama_global_shape: no tensor " + name);
}

std::vector<HFLlamaTensor> hf_llama_tensors(const ModelConfig& m) {
  const LlamaDims d = llama_dims(m);
  const bool grouped = m.group_query_attention;
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
  auto fc1_part = [&](const std::string& hf, const std::string& ours, int w, bool weight) {
    const int64_t cols = weight ? C : 1;
    out.push_back({hf, weight ? std::vector<int64_t>{d.F, C} : std::vector<int64_t>{d.F}, [=](const Read& read) {
                     const std::vector<float>& src = read(ours);
                     return std::vector<float>(src.begin() + w * d.F * cols, src.begin() + (w + 1) * d.F * cols);
                   }});
  };
  same("model.embed_tokens.weight", {d.V, C}, "wte.weight");
  for (int64_t l = 0; l < d.L; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".", o = "h." + std::to_string(l) + ".";
    same(h + "input_layernorm.weight", {C}, o + "ln_1.weight");
    const char* qkv[] = {"q_proj", "k_proj", "v_proj"};
    for (int w = 0; w < 3; ++w) {
      qkv_part(h + "self_attn." + qkv[w] + ".weight", o + "attn.qkv.weight", w, true);
      if (d.bias) qkv_part(h + "self_attn." + qkv[w] + ".bias", o + "attn.qkv.bias", w, false);
    }
    same(h + "self_attn.o_proj.weight", {C, HD}, o + "attn.proj.weight");
    if (d.bias) same(h + "self_attn.o_proj.bias", {C}, o + "attn.proj.bias");
    same(h + "post_attention_layernorm.weight", {C}, o + "ln_2.weight");
    fc1_part(h + "mlp.gate_proj.weight", o + "mlp.fc1.weight", 0, true);
    if (d.bias) fc1_part(h + "mlp.gate_proj.bias", o + "mlp.fc1.bias", 0, false);
    fc1_part(h + "mlp.up_proj.weight", o + "mlp.fc1.weight", 1, true);
    if (d.bias) fc1_part(h + "mlp.up_proj.bias", o + "mlp.fc1.bias", 1, false);
    same(h + "mlp.down_proj.weight", {C, d.F}, o + "mlp.fc2.weight");
    if (d.bias) same(h + "mlp.down_proj.bias", {C}, o + "mlp.fc2.bias");
  }
  same("model.norm.weight", {C}, "ln_f.weight");
  if (d.untied) same("lm_head.weight", {d.V, C}, "lm_head.weight");
  return out;
}

}  // namespace tpt
