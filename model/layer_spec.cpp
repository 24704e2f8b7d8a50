// The dense block's layer spec (model/layer_spec.h).
#include "model/layer_spec.h"

#include <cmath>

#include "core/error.h"
#include "model/gpt.h"

namespace tpt {

std::vector<int64_t> LinearSpec::bias_shape() const {
  if (split == LinearSplit::Row) return {weight_shape.front()};
  return {weight_shape.begin(), weight_shape.end() - 1};
}

int LayerSpec::index(const std::string& name) const {
  for (size_t i = 0; i < parts.size(); ++i)
    if (parts[i].name() == name) return int(i);
  internal_error("layer spec: no part named " + name);
}

const LinearSpec& LayerSpec::linear(int part) const {
  TPT_CHECK(part >= 0 && size_t(part) < parts.size() && parts[size_t(part)].is_linear);
  return parts[size_t(part)].linear;
}

std::vector<const LinearSpec*> LayerSpec::linears() const {
  std::vector<const LinearSpec*> r;
  for (const LayerPart& p : parts)
    if (p.is_linear) r.push_back(&p.linear);
  return r;
}

namespace {
// model.qk_layernorm: attn.q_layernorm and attn.k_layernorm, (D) each, at the end of the layer's parts
void add_qk_norms(LayerSpec& spec, const GPTDims& d) {
  if (!d.qk_norm) return;
  for (const char* name : {"attn.q_layernorm", "attn.k_layernorm"}) {
    LayerPart p;
    p.norm = {name, d.D, true};
    spec.parts.push_back(p);
  }
  spec.q_norm = int(spec.parts.size()) - 2;
  spec.k_norm = int(spec.parts.size()) - 1;
}
}  // namespace

LayerSpec make_layer_spec(const GPTDims& d) {
  // Megatron's scaled init of the two output projections of each block
  const float out_std = d.init_std / std::sqrt(2.0f * float(d.L));
  const int64_t HD = d.H * d.D, Q = d.H / d.G;
  auto norm = [&](const char* name) {
    LayerPart p;
    p.norm.name = name;
    p.norm.width = d.C;
    return p;
  };
  auto linear = [](const char* name, std::vector<int64_t> shape, int split_dim, LinearSplit split, bool bias,
                   int64_t in, int64_t out, float std) {
    LayerPart p;
    p.is_linear = true;
    p.linear = {name, std::move(shape), split_dim, split, bias, in, out, std};
    return p;
  };
  using S = LinearSplit;
  LayerSpec spec;
  spec.parts = {
      norm("ln_1"),
      d.grouped_qkv ? linear("attn.qkv", {d.G, Q + 2, d.D, d.C}, 0, S::Column, d.qkv_bias, d.C, d.qkv_width, d.init_std)
                    : linear("attn.qkv", {3, HD, d.C}, 1, S::Column, d.qkv_bias, d.C, d.qkv_width, d.init_std),
      linear("attn.proj", {d.C, HD}, 1, S::Row, d.bias, d.Cl, d.C, out_std),
      norm("ln_2"),
      d.mlp.swiglu ? linear("mlp.fc1", {2, d.F, d.C}, 1, S::Column, d.bias, d.C, d.fc1_width, d.init_std)
                   : linear("mlp.fc1", {d.F, d.C}, 0, S::Column, d.bias, d.C, d.fc1_width, d.init_std),
      linear("mlp.fc2", {d.C, d.F}, 1, S::Row, d.bias, d.Fl, d.C, out_std),
  };
  add_qk_norms(spec, d);
  return spec;
}

LayerSpec make_moe_layer_spec(const GPTDims& d) {
  LayerSpec spec = make_layer_spec(d);
  spec.parts.resize(kLn2 + 1);  // the attention half and ln_2
  spec.q_norm = spec.k_norm = -1;
  LayerPart router;
  router.is_linear = true;
  router.linear = {"mlp.router", {d.moe.E, d.C}, 0, LinearSplit::Replicated, false, d.C, d.moe.E, d.init_std};
  spec.parts.push_back(router);
  if (d.moe.Fs > 0) {  // the shared expert: a dense MLP of width Fs, TP-split as mlp.fc1 / mlp.fc2
    const float out_std = d.init_std / std::sqrt(2.0f * float(d.L));
    const int64_t Fs = d.moe.Fs;
    LayerPart fc1, fc2;
    fc1.is_linear = fc2.is_linear = true;
    fc1.linear = d.mlp.swiglu ? LinearSpec{"mlp.shared_experts.fc1", {2, Fs, d.C}, 1, LinearSplit::Column, d.bias, d.C,
                                           d.moe.shared_fc1_width, d.init_std}
                              : LinearSpec{"mlp.shared_experts.fc1", {Fs, d.C}, 0, LinearSplit::Column, d.bias, d.C,
                                           d.moe.shared_fc1_width, d.init_std};
    fc2.linear = {"mlp.shared_experts.fc2", {d.C, Fs}, 1, LinearSplit::Row, d.bias, d.moe.Fsl, d.C, out_std};
    spec.parts.push_back(fc1);
    spec.parts.push_back(fc2);
    if (d.moe.shared_gate) {
      LayerPart gate;
      gate.is_linear = true;
      gate.linear = {"mlp.shared_experts.gate", {1, d.C}, 0, LinearSplit::Replicated, false, d.C, 1, d.init_std};
      spec.parts.push_back(gate);
    }
  }
  add_qk_norms(spec, d);
  return spec;
}

}  // namespace tpt
