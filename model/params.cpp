// Parameter layout of one (tp_rank, pp_rank) shard of the GPT, and its counter-based init.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/gpt.h"

namespace tpt {

GPTDims::Fp8Saved GPTDims::fp8_saved_inputs(int64_t l, Recompute r) const {
  Fp8Saved s;
  if (!fp8_wgrad || !fp8_layer(l) || r == Recompute::Full) return s;  // full: nothing kept
  // the norms' outputs where kept: not with the layernorm recompute module (not kept); with sequence
  // parallelism this rank's tokens' codes, where the forward gathers them as codes (fp8_gathers_codes:
  // not blockwise, whose 128 x 1 blocks would run across the TP ranks' tokens); ln_2's not in an MoE
  // layer, whose router reads it in backward. SwiGLU's output (GELU's is recomputed from fc1's).
  const bool norms = keeps_norms(r) && (!sequence_parallel || fp8_gathers_codes(l)), dense = !moe.is_moe(l);
  s.ln1 = norms;
  s.ln2 = norms && dense;
  s.act = dense && mlp.swiglu;
  return s;
}

GPTDims::Fp8Saved GPTDims::fp8_saved_by_any(Recompute r) const {
  Fp8Saved any;
  for (int64_t l = layer_begin; l < layer_end; ++l) {
    const Fp8Saved s = fp8_saved_inputs(l, r);
    any.ln1 |= s.ln1, any.ln2 |= s.ln2, any.act |= s.act;
  }
  return any;
}

GPTDims::MlpRerun GPTDims::mlp_rerun(Recompute r) const {
  MlpRerun m;
  for (int64_t l = layer_begin; l < layer_end; ++l) {
    if (keeps_mlp(r, l)) continue;
    const bool act8 = fp8_saved_inputs(l, r).act;
    m.any = true;
    m.act8 |= act8;
    m.act16 |= mlp.swiglu && !act8;
  }
  return m;
}

bool fp8_saves_inputs(const Config& cfg) {
  return make_dims(cfg, cfg.parallel.tensor_model_parallel_size, 0, 1, 0).saves_fp8_inputs(cfg.training.recompute);
}

GPTDims make_dims(const Config& cfg, int tp, int tp_rank, int pp, int pp_rank) {
  const ModelConfig& m = cfg.model;
  GPTDims d;
  d.L = m.num_layers;
  d.C = m.hidden_size;
  d.H = m.num_attention_heads;
  d.D = m.kv_channels ? m.kv_channels : d.C / d.H;
  d.F = m.ffn_hidden_size;
  d.S = m.seq_length;
  d.P = m.max_position_embeddings;
  d.V = m.vocab_size;
  d.Vp = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp);
  d.eps = float(m.layernorm_epsilon);
  d.init_std = float(m.init_method_std);
  d.tp = tp;
  d.tp_rank = tp_rank;
  d.pp = pp;
  d.pp_rank = pp_rank;
  d.G = m.group_query_attention ? m.num_query_groups : d.H;
  if (d.H % tp || d.F % tp || d.L % pp || d.G <= 0 || d.H % d.G || d.G % tp)
    internal_error("make_dims: unchecked grid/model mismatch");
  int64_t per_stage = d.L / pp;
  d.layer_begin = per_stage * pp_rank;
  d.layer_end = d.layer_begin + per_stage;
  d.Hl = d.H / tp;
  d.Cl = d.Hl * d.D;
  d.Fl = d.F / tp;
  d.kv_heads = d.G / tp;
  d.qkv_width = (d.Hl + 2 * d.kv_heads) * d.D;
  d.norm = Norm{m.normalization == Normalization::RMSNorm, d.eps};
  d.mlp = MLPActivation{m.swiglu};
  d.fc1_width = d.mlp.fc1_width(d.Fl);
  d.grouped_qkv = m.group_query_attention;
  d.rot = m.position_embedding_type == PositionEmbedding::Rope ? rotary_dim(m) : 0;
  d.rope_interleaved = m.rotary_interleaved;
  if (d.rot) d.inv_freq = rope_inv_freq(m);
  d.untied = m.untie_embeddings_and_output_weights;
  d.bias = m.add_bias_linear;
  d.qkv_bias = m.add_bias_linear || m.add_qkv_bias;
  d.qk_norm = m.qk_layernorm;
  d.recompute_norms = cfg.training.recompute_modules.layernorm;
  d.recompute_mlp = cfg.training.recompute_modules.mlp;
  if (cfg.training.fp8_format != Fp8Format::None) {
    std::tie(d.fp8_begin, d.fp8_end) = cfg.training.fp8_layer_range(m.num_layers);
    d.fp8_wgrad = cfg.training.fp8_wgrad;
    d.fp8_blockwise = cfg.training.fp8_recipe == Fp8Recipe::Blockwise;
    d.fp8_params = cfg.training.fp8_param_gather;
  }
  d.Vl = d.Vp / tp;
  d.vocab_begin = d.Vl * tp_rank;
  d.position_ids = cfg.data.reset_position_ids;
  d.loss_mask = cfg.data.eod_mask_loss;
  d.sequence_parallel = cfg.parallel.sequence_parallel && tp > 1;  // with TP 1 there is nothing to split
  if (d.sequence_parallel && d.S % tp) internal_error("make_dims: unchecked sequence_parallel / seq_length mismatch");
  d.layer = make_layer_spec(d);
  if (m.is_moe()) {  // Mixture-of-Experts (docs/MOE.md); EP 1 until apply_expert_parallel
    MoEDims& e = d.moe;
    e.E = m.num_moe_experts;
    e.Fe = m.moe_ffn_hidden_size;
    e.Fel = e.Fe;
    e.fc1_width = d.mlp.fc1_width(e.Fel);
    e.El = e.E;
    e.router = router_options(m);
    e.bias = m.add_bias_linear;
    for (int64_t l = 0; l < d.L; ++l) e.layers.push_back(m.is_moe_layer(l) ? 1 : 0);
    e.Fs = m.moe_shared_expert_intermediate_size;
    if (e.Fs % tp) internal_error("make_dims: unchecked moe_shared_expert_intermediate_size / TP mismatch");
    e.Fsl = e.Fs / tp;
    e.shared_fc1_width = d.mlp.fc1_width(e.Fsl);
    e.shared_gate = m.moe_shared_expert_gate;
    e.dispatch_factor = m.moe_dispatch_bound_factor;
    e.kept_factor = m.moe_kept_rows_factor;
    e.recompute_act = cfg.training.recompute_modules.moe_act;
    e.recompute_moe = cfg.training.recompute_modules.moe;
    e.recompute_shared = cfg.training.recompute_modules.shared_experts;
    e.allgather = m.moe_token_dispatcher_type == MoEDispatcher::AllGather;
    d.moe_layer = make_moe_layer_spec(d);
  }
  return d;
}

void apply_expert_parallel(GPTDims& d, int ep, int ep_rank, int etp, int etp_rank) {
  if (!d.moe.any()) return;
  MoEDims& m = d.moe;
  if (ep < 1 || m.E % ep || ep_rank < 0 || ep_rank >= ep) internal_error("apply_expert_parallel: unchecked EP");
  if (etp < 1 || m.Fe % etp || etp_rank < 0 || etp_rank >= etp || (etp > 1 && etp != d.tp))
    internal_error("apply_expert_parallel: unchecked ETP");
  m.ep = ep;
  m.ep_rank = ep_rank;
  m.El = m.E / ep;
  m.expert_begin = m.El * ep_rank;
  m.etp = etp;
  m.etp_rank = etp_rank;
  m.Fel = m.Fe / etp;
  m.fc1_width = d.mlp.fc1_width(m.Fel);
}

void apply_context_parallel(GPTDims& d, const Config& cfg, int cp_rank) {
  const int cp = cfg.parallel.context_parallel_size;
  if (cp <= 1) return;
  if (d.S % (2 * cp) || (d.sequence_parallel && (d.S / cp) % d.tp))
    internal_error("apply_context_parallel: unchecked seq_length / context_parallel_size mismatch");
  d.cp = cp;
  d.cp_rank = cp_rank;
  d.S /= cp;
  d.position_ids = true;  // the tokens' global positions (learned or RoPE)
}

const ParamInfo* ParamLayout::find(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

namespace {

struct LayoutBuilder {
  int tp_rank = 0;
  ParamLayout layout;
  void add(ParamInfo p) {
    if (p.group.copy == ModelCopy::TensorParallel) p.group.primary = tp_rank == 0;  // its copy counts, is saved
    p.numel = 1;
    for (int64_t s : p.local_shape) p.numel *= s;
    p.offset = layout.total;
    layout.total += (p.numel + 15) / 16 * 16;  // 64-byte aligned tensors
    layout.params.push_back(std::move(p));
  }
};

// Identical on every TP rank (the builder marks tp_rank 0's copy the primary one).
ParamInfo replicated(std::string name, std::vector<int64_t> shape, ParamInfo::Init init) {
  ParamInfo p;
  p.name = std::move(name);
  p.global_shape = shape;
  p.box_offset.assign(shape.size(), 0);
  p.box_size = shape;
  p.local_shape = shape;
  p.group.copy = ModelCopy::TensorParallel;
  p.init = init;
  return p;
}

// Sharded along dimension `dim` into tp equal parts.
ParamInfo sharded(std::string name, std::vector<int64_t> shape, int dim, int tp, int rank) {
  ParamInfo p;
  p.name = std::move(name);
  p.global_shape = shape;
  p.box_offset.assign(shape.size(), 0);
  p.box_size = shape;
  p.box_size[dim] = shape[dim] / tp;
  p.box_offset[dim] = p.box_size[dim] * rank;
  p.local_shape = p.box_size;
  p.init = ParamInfo::Init::Zeros;
  return p;
}

// A vocab-parallel (V, C) table: the word embedding, its tied copy on the last stage, or the untied
// output layer. The tied word embedding with PP > 1 has a copy on the first and on the last stage;
// the first stage's is the primary one.
ParamInfo word_embedding(const GPTDims& d, const char* name, bool tied_copy) {
  ParamInfo p;
  p.name = name;
  p.global_shape = {d.V, d.C};
  int64_t rows = std::max<int64_t>(0, std::min(d.V, d.vocab_begin + d.Vl) - d.vocab_begin);
  p.box_offset = {std::min(d.vocab_begin, d.V), 0};
  p.box_size = {rows, d.C};
  p.local_shape = {d.Vl, d.C};
  p.weight_decay = true;
  if (!d.untied && d.pp > 1) p.group.copy = ModelCopy::TiedEmbedding;
  p.group.primary = !tied_copy;
  p.init = ParamInfo::Init::Normal;
  p.init_std = d.init_std;
  return p;
}

}  // namespace

ParamLayout make_param_layout(const GPTDims& d) {
  using I = ParamInfo::Init;
  LayoutBuilder b{d.tp_rank, {}};
  auto weight = [&](ParamInfo p, float std) {  // a weight matrix: N(0, std), decayed
    p.weight_decay = true;
    p.init = I::Normal;
    p.init_std = std;
    b.add(std::move(p));
  };
  // LayerNorm: weight and bias; RMSNorm: weight. per_head (the q/k norms): each TP rank's gradient is
  // its heads' part, summed over TP (tp_replicated_ranges)
  auto norm = [&](const std::string& pre, int64_t width = 0, bool per_head = false) {
    const int64_t w = width ? width : d.C;
    auto add = [&](ParamInfo p) {
      p.group.partial_over_tp = per_head;
      b.add(std::move(p));
    };
    add(replicated(pre + ".weight", {w}, I::Ones));
    if (d.norm.has_bias()) add(replicated(pre + ".bias", {w}, I::Zeros));
  };
  if (d.first_stage()) {
    b.add(word_embedding(d, "wte.weight", false));
    if (d.learned_positions()) weight(replicated("wpe.weight", {d.P, d.C}, I::Normal), d.init_std);
  }
  // each transformer layer: its parts as the layer spec lists them (model/layer_spec.h)
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l) {
    const std::string pre = "h." + std::to_string(l) + ".";
    for (const LayerPart& part : d.spec(l).parts) {
      if (!part.is_linear) {
        norm(pre + part.norm.name, part.norm.width, part.norm.per_head);
        continue;
      }
      const LinearSpec& s = part.linear;
      const std::string w = pre + s.name + ".weight", bias = pre + s.name + ".bias";
      switch (s.split) {
        case LinearSplit::Column:
          weight(sharded(w, s.weight_shape, s.split_dim, d.tp, d.tp_rank), s.init_std);
          if (s.bias) b.add(sharded(bias, s.bias_shape(), s.split_dim, d.tp, d.tp_rank));
          break;
        case LinearSplit::Row:
          weight(sharded(w, s.weight_shape, int(s.weight_shape.size()) - 1, d.tp, d.tp_rank), s.init_std);
          if (s.bias) b.add(replicated(bias, s.bias_shape(), I::Zeros));
          break;
        case LinearSplit::Replicated:
          weight(replicated(w, s.weight_shape, I::Normal), s.init_std);
          if (s.bias) b.add(replicated(bias, s.bias_shape(), I::Zeros));
          break;
      }
    }
  }
  if (d.last_stage()) {
    norm("ln_f");
    // the output layer: its own vocab-parallel lm_head.weight (initialised like the embedding), or the
    // tied word embedding (the last stage's copy when the first stage is another)
    if (d.untied) b.add(word_embedding(d, "lm_head.weight", false));
    else if (!d.first_stage()) b.add(word_embedding(d, "wte.weight", true));
  }
  // the MoE layers' experts, after every dense tensor (their own replica group, contiguous): global
  // (E, ...) tensors, this rank's El experts the box along dimension 0 (docs/MOE.md "Parameters"); with
  // ETP > 1 also its part of each expert's width: fc1 (and its bias) column-parallel, fc2
  // row-parallel with its bias on every expert-TP rank (added and its gradient taken on etp rank 0)
  const MoEDims& m = d.moe;
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l) {
    if (!m.is_moe(l)) continue;
    if (!b.layout.params.empty() && b.layout.params.back().group.replicas == ReplicaGroup::Dense)  // a new group
      b.layout.total = (b.layout.total + kShardAlign - 1) / kShardAlign * kShardAlign;
    const std::string pre = "h." + std::to_string(l) + ".mlp.experts.";
    const float out_std = d.init_std / std::sqrt(2.0f * float(d.L));
    // width_dim: the dimension split over ETP (-1: none, the tensor is on every expert-TP rank)
    auto expert = [&](const std::string& name, std::vector<int64_t> shape, int width_dim, ParamInfo::Init init,
                      float std) {
      ParamInfo p = sharded(pre + name, shape, 0, m.ep, m.ep_rank);
      if (width_dim >= 0) {
        p.box_size[size_t(width_dim)] = shape[size_t(width_dim)] / m.etp;
        p.box_offset[size_t(width_dim)] = p.box_size[size_t(width_dim)] * m.etp_rank;
        p.local_shape = p.box_size;
      } else if (m.etp > 1) {
        p.group.copy = ModelCopy::TensorParallel;
        p.group.partial_over_tp = true;  // etp rank 0's gradient, summed over TP
      }
      p.group.replicas = ReplicaGroup::ExpertData;
      p.init = init;
      p.init_std = std;
      p.weight_decay = init == I::Normal;
      b.add(std::move(p));
    };
    const std::vector<int64_t> fc1 = d.mlp.swiglu ? std::vector<int64_t>{m.E, 2, m.Fe, d.C} : std::vector<int64_t>{m.E, m.Fe, d.C};
    const int fe_dim = d.mlp.swiglu ? 2 : 1;  // fc1's Fe dimension
    expert("fc1.weight", fc1, fe_dim, I::Normal, d.init_std);
    if (m.bias) expert("fc1.bias", {fc1.begin(), fc1.end() - 1}, fe_dim, I::Zeros, 0);
    expert("fc2.weight", {m.E, d.C, m.Fe}, 2, I::Normal, out_std);
    if (m.bias) expert("fc2.bias", {m.E, d.C}, -1, I::Zeros, 0);
  }
  // FP8 parameters: the weights of the FP8 layers' FP8 GEMMs (a shared expert's, the experts' too)
  if (d.fp8_params)
    for (int64_t l = std::max(d.layer_begin, d.fp8_begin); l < std::min(d.layer_end, d.fp8_end); ++l)
      for (const Fp8StateEntry& e : fp8_state_entries(d.moe.is_moe(l), d.moe.E, d.moe.Fs > 0))
        for (ParamInfo& p : b.layout.params)
          if (p.name == "h." + std::to_string(l) + "." + e.gemm + ".weight") p.group.fp8 = true;
  return b.layout;
}

std::vector<GradRange> layer_ranges(const ParamLayout& layout, const GPTDims& d) {
  std::vector<GradRange> r;
  // a layer's tensors of its spec are consecutive: from its first part's first tensor to its last
  // part's last (an MoE layer's experts lie in their own group, after the dense tensors)
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l) {
    const LayerSpec& spec = d.spec(l);
    const LayerPart& last_part = spec.parts.back();
    const std::string last_name =
        last_part.name() + (last_part.is_linear ? (last_part.linear.bias ? ".bias" : ".weight")
                                                : (d.norm.has_bias() ? ".bias" : ".weight"));
    const std::string pre = "h." + std::to_string(l) + ".";
    const ParamInfo* first = layout.find(pre + spec.parts.front().name() + ".weight");
    const ParamInfo* last = layout.find(pre + last_name);
    TPT_CHECK(first && last && last->offset >= first->offset);
    r.push_back({first->offset, last->offset + last->numel - first->offset});
  }
  return r;
}

void init_params_host(const ParamLayout& layout, uint64_t seed, float* params) {
  for (const ParamInfo& p : layout.params) {
    float* out = params + p.offset;
    if (p.init == ParamInfo::Init::Ones) {
      std::fill(out, out + p.numel, 1.0f);
      continue;
    }
    std::fill(out, out + p.numel, 0.0f);
    if (p.init == ParamInfo::Init::Zeros) continue;
    const uint64_t stream = stream_id(p.name);
    // element e of the global tensor gets init_std * normal(seed, name, e); local rows beyond the
    // box (vocabulary padding) stay zero
    for_each_box_row(p.box_size, p.local_shape, {}, p.global_shape, p.box_offset,
                     [&](int64_t local, int64_t global, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= 16384)
                       for (int64_t i = 0; i < n; ++i)
                         out[local + i] = p.init_std * normal_at(seed, stream, uint64_t(global + i));
                     });
  }
}

}  // namespace tpt
