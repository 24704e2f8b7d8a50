// Parameter layout of one (tp_rank, pp_rank) shard of the GPT, and its counter-based init.
#include <algorithm>
#include <cmath>

#include "core/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/gpt.h"

namespace tpt {

GPTDims make_dims(const Config& cfg, int tp, int tp_rank, int pp, int pp_rank) {
  const ModelConfig& m = cfg.model;
  GPTDims d;
  d.L = m.num_layers;
  d.C = m.hidden_size;
  d.H = m.num_attention_heads;
  d.D = d.C / d.H;
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
  if (d.H % tp || d.F % tp || d.L % pp || d.C % d.H)
    internal_error("make_dims: unchecked grid/model mismatch");
  int64_t per_stage = d.L / pp;
  d.layer_begin = per_stage * pp_rank;
  d.layer_end = d.layer_begin + per_stage;
  d.Hl = d.H / tp;
  d.Cl = d.Hl * d.D;
  d.Fl = d.F / tp;
  d.Vl = d.Vp / tp;
  d.v0 = d.Vl * tp_rank;
  d.position_ids = cfg.data.reset_position_ids;
  d.loss_mask = cfg.data.eod_mask_loss;
  d.sequence_parallel = cfg.parallel.sequence_parallel && tp > 1;  // with TP 1 there is nothing to split
  if (d.sequence_parallel && d.S % tp) internal_error("make_dims: unchecked sequence_parallel / seq_length mismatch");
  return d;
}

const ParamInfo* ParamLayout::find(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

namespace {

struct LayoutBuilder {
  ParamLayout layout;
  void add(ParamInfo p) {
    p.numel = 1;
    for (int64_t s : p.local_shape) p.numel *= s;
    p.offset = layout.total;
    layout.total += (p.numel + 15) / 16 * 16;  // 64-byte aligned tensors
    layout.params.push_back(std::move(p));
  }
};

ParamInfo replicated(std::string name, std::vector<int64_t> shape, ParamInfo::Init init) {
  ParamInfo p;
  p.name = std::move(name);
  p.global_shape = shape;
  p.box_offset.assign(shape.size(), 0);
  p.box_size = shape;
  p.local_shape = shape;
  p.tp_replicated = true;
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

ParamInfo word_embedding(const GPTDims& d, bool tied_copy) {
  ParamInfo p;
  p.name = "wte.weight";
  p.global_shape = {d.V, d.C};
  int64_t rows = std::max<int64_t>(0, std::min(d.V, d.v0 + d.Vl) - d.v0);
  p.box_offset = {std::min(d.v0, d.V), 0};
  p.box_size = {rows, d.C};
  p.local_shape = {d.Vl, d.C};
  p.weight_decay = true;
  p.tied_copy = tied_copy;
  p.init = ParamInfo::Init::Normal;
  p.init_std = d.init_std;
  return p;
}

}  // namespace

ParamLayout make_param_layout(const GPTDims& d) {
  using I = ParamInfo::Init;
  LayoutBuilder b;
  // Megatron's scaled init of the two output projections of each block.
  const float out_std = d.init_std / std::sqrt(2.0f * float(d.L));
  if (d.first_stage()) {
    b.add(word_embedding(d, false));
    ParamInfo wpe = replicated("wpe.weight", {d.P, d.C}, I::Normal);
    wpe.weight_decay = true;
    wpe.init_std = d.init_std;
    b.add(wpe);
  }
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l) {
    std::string pre = "h." + std::to_string(l) + ".";
    b.add(replicated(pre + "ln_1.weight", {d.C}, I::Ones));
    b.add(replicated(pre + "ln_1.bias", {d.C}, I::Zeros));
    ParamInfo qkv = sharded(pre + "attn.qkv.weight", {3, d.C, d.C}, 1, d.tp, d.tp_rank);
    qkv.weight_decay = true;
    qkv.init = I::Normal;
    qkv.init_std = d.init_std;
    b.add(qkv);
    b.add(sharded(pre + "attn.qkv.bias", {3, d.C}, 1, d.tp, d.tp_rank));
    ParamInfo proj = sharded(pre + "attn.proj.weight", {d.C, d.C}, 1, d.tp, d.tp_rank);
    proj.weight_decay = true;
    proj.init = I::Normal;
    proj.init_std = out_std;
    b.add(proj);
    b.add(replicated(pre + "attn.proj.bias", {d.C}, I::Zeros));
    b.add(replicated(pre + "ln_2.weight", {d.C}, I::Ones));
    b.add(replicated(pre + "ln_2.bias", {d.C}, I::Zeros));
    ParamInfo fc1 = sharded(pre + "mlp.fc1.weight", {d.F, d.C}, 0, d.tp, d.tp_rank);
    fc1.weight_decay = true;
    fc1.init = I::Normal;
    fc1.init_std = d.init_std;
    b.add(fc1);
    b.add(sharded(pre + "mlp.fc1.bias", {d.F}, 0, d.tp, d.tp_rank));
    ParamInfo fc2 = sharded(pre + "mlp.fc2.weight", {d.C, d.F}, 1, d.tp, d.tp_rank);
    fc2.weight_decay = true;
    fc2.init = I::Normal;
    fc2.init_std = out_std;
    b.add(fc2);
    b.add(replicated(pre + "mlp.fc2.bias", {d.C}, I::Zeros));
  }
  if (d.last_stage()) {
    b.add(replicated("ln_f.weight", {d.C}, I::Ones));
    b.add(replicated("ln_f.bias", {d.C}, I::Zeros));
    if (!d.first_stage()) b.add(word_embedding(d, true));
  }
  return b.layout;
}

std::vector<GradRange> layer_ranges(const ParamLayout& layout, const GPTDims& d) {
  std::vector<GradRange> r;
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l) {
    const std::string pre = "h." + std::to_string(l) + ".";
    const ParamInfo* first = layout.find(pre + "ln_1.weight");
    const ParamInfo* last = layout.find(pre + "mlp.fc2.bias");
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
