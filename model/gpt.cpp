// Forward and backward of one pipeline stage of the GPT on one TP rank, micro-batch by
// micro-batch. Shapes: N = B*S tokens of the micro-batch; Cl, Fl, Vl the local (TP-sharded) widths.
#include "model/gpt.h"

#include <cmath>

#include "core/error.h"
#include "parallel/tensor_parallel.h"

namespace tpt {

struct GPTStage::LayerActs {
  float *ln1, *ln1_mean, *ln1_rstd;  // (N, C), (N), (N)
  float* qkv;                        // (B, S, 3, Hl, D)
  float* atty;                       // (N, Cl) attention output (before the projection)
  float* lse;                        // (B, Hl, S) log-sum-exp of each query's scores
  float* x_mid;                      // (N, C) residual after attention
  float *ln2, *ln2_mean, *ln2_rstd;  // (N, C), (N), (N)
  float* fc1;                        // (N, Fl) before GELU
  float* gelu;                       // (N, Fl)
  float* x_out;                      // (N, C) block output
};

struct GPTStage::SlotActs {
  int32_t* tokens = nullptr;   // (B, S) first stage
  int32_t* targets = nullptr;  // (B, S) last stage
  float* x_in = nullptr;       // (N, C) stage input (embeddings or received hidden)
  std::vector<LayerActs> layers;
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr;  // last stage
  float dloss_scale = 0.0f;
};

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  internal_error("unknown recompute mode " + name);
}

namespace {
// the attention output and its log-sum-exp: what selective recompute rebuilds in backward
int64_t attention_core_floats(const GPTDims& d, int64_t B) { return B * d.S * d.Cl + B * d.Hl * d.S; }

int64_t layer_floats(const GPTDims& d, int64_t B, bool with_core) {
  const int64_t N = B * d.S;
  return 2 * (N * d.C + 2 * N) + 3 * N * d.Cl + (with_core ? attention_core_floats(d, B) : 0) + 2 * N * d.C +
         2 * N * d.Fl;
}
}  // namespace

int64_t activation_floats_per_microbatch(const GPTDims& d, int64_t B, Recompute r) {
  const int64_t N = B * d.S;
  const int64_t layers = d.layer_end - d.layer_begin;
  int64_t per_layer = r == Recompute::Full ? N * d.C : layer_floats(d, B, r == Recompute::None);
  int64_t n = N * d.C + layers * per_layer + 2 * N;  // + stage input, tokens, targets
  if (d.last_stage()) n += N * d.C + 2 * N;
  return n;
}

int64_t scratch_floats(const GPTDims& d, int64_t B, Recompute r) {
  const int64_t N = B * d.S;
  int64_t n = 3 * N * d.C + 3 * N * d.Cl + N * d.Cl + B * d.Hl * d.S + N * d.Fl;
  if (r == Recompute::Selective) n += attention_core_floats(d, B);  // one layer's, rebuilt in backward
  if (r == Recompute::Full) n += layer_floats(d, B, true);  // one layer rebuilt at a time
  if (d.last_stage()) n += N * d.Vl + 4 * N;
  return n;
}

int64_t tp_wire_floats(const GPTDims& d, int64_t B, DType t) {
  const int64_t n = B * d.S * d.C;  // see all_reduce_half
  return t != DType::F32 && d.tp > 1 ? (d.tp + 1) * ((n + 1) / 2) + n : 0;
}

namespace {
// Parameter (or gradient) pointers of one transformer block.
struct BlockParams {
  float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
};

BlockParams block_params(const ParamLayout& layout, float* base, int64_t layer) {
  std::string pre = "h." + std::to_string(layer) + ".";
  auto at = [&](const char* n) {
    const ParamInfo* p = layout.find(pre + n);
    TPT_CHECK(p != nullptr);
    return base + p->offset;
  };
  return {at("ln_1.weight"), at("ln_1.bias"),   at("attn.qkv.weight"), at("attn.qkv.bias"),
          at("attn.proj.weight"), at("attn.proj.bias"), at("ln_2.weight"), at("ln_2.bias"),
          at("mlp.fc1.weight"), at("mlp.fc1.bias"), at("mlp.fc2.weight"), at("mlp.fc2.bias")};
}
}  // namespace

float* GPTStage::alloc(int64_t n) {
  float* p = ops_.alloc(size_t(n));
  owned_.push_back(p);
  return p;
}

const float* GPTStage::p(const std::string& name) const {
  const ParamInfo* info = layout_.find(name);
  TPT_CHECK(info != nullptr);
  return params_ + info->offset;
}

float* GPTStage::g(const std::string& name) const {
  const ParamInfo* info = layout_.find(name);
  TPT_CHECK(info != nullptr);
  return grads_ + info->offset;
}

GPTStage::GPTStage(const GPTDims& d, const ParamLayout& layout, Ops& ops, Comm& tp, float* params,
                   float* grads, int64_t micro_batch, int slots, StageOptions options)
    : d_(d), layout_(layout), ops_(ops), tp_(tp), params_(params), grads_(grads), B_(micro_batch), opt_(options) {
  const int64_t N = B_ * d.S;
  auto layer_acts = [&](float* shared_core, float* x_out) {
    LayerActs la;
    la.ln1 = alloc(N * d.C);
    la.ln1_mean = alloc(N);
    la.ln1_rstd = alloc(N);
    la.qkv = alloc(3 * N * d.Cl);
    la.atty = shared_core ? shared_core : alloc(attention_core_floats(d, B_));
    la.lse = la.atty + N * d.Cl;
    la.x_mid = alloc(N * d.C);
    la.ln2 = alloc(N * d.C);
    la.ln2_mean = alloc(N);
    la.ln2_rstd = alloc(N);
    la.fc1 = alloc(N * d.Fl);
    la.gelu = alloc(N * d.Fl);
    la.x_out = x_out ? x_out : alloc(N * d.C);
    return la;
  };
  float* shared_core = opt_.recompute == Recompute::Selective ? alloc(attention_core_floats(d, B_)) : nullptr;
  if (opt_.recompute == Recompute::Full) recompute_acts_ = new LayerActs(layer_acts(nullptr, nullptr));
  for (int s = 0; s < slots; ++s) {
    auto* a = new SlotActs;
    slots_.push_back(a);
    a->tokens = reinterpret_cast<int32_t*>(alloc(N));
    a->targets = reinterpret_cast<int32_t*>(alloc(N));
    a->x_in = alloc(N * d.C);
    for (int64_t l = d.layer_begin; l < d.layer_end; ++l) {
      if (opt_.recompute == Recompute::Full) {  // only the layer's output (= next layer's input) is kept
        LayerActs la{};
        la.x_out = alloc(N * d.C);
        a->layers.push_back(la);
      } else {
        a->layers.push_back(layer_acts(shared_core, nullptr));
      }
    }
    if (d.last_stage()) {
      a->lnf = alloc(N * d.C);
      a->lnf_mean = alloc(N);
      a->lnf_rstd = alloc(N);
    }
  }
  if (const int64_t w = tp_wire_floats(d, B_, opt_.dtype)) wire_ = TPWire{&ops_, opt_.dtype, alloc(w)};
  dres_ = alloc(N * d.C);
  dln_ = alloc(N * d.C);
  tmp_ = alloc(N * d.C);
  dqkv_ = alloc(3 * N * d.Cl);
  datt_ = alloc(N * d.Cl);
  datt_stats_ = alloc(B_ * d.Hl * d.S);
  dfc_ = alloc(N * d.Fl);
  if (d.last_stage()) {
    logits_ = alloc(N * d.Vl);
    xent_ = alloc(4 * N);
  }
}

GPTStage::~GPTStage() {
  for (float* q : owned_) ops_.free(q);
  for (SlotActs* a : slots_) delete a;
  delete recompute_acts_;
}

void GPTStage::block_forward(int64_t layer, LayerActs& a, const float* x_in, float* x_out) {
  const GPTDims& d = d_;
  const int64_t N = B_ * d.S;
  BlockParams w = block_params(layout_, params_, layer);
  const bool bias_rank = d.tp_rank == 0;  // row-parallel biases are added once, before the all-reduce
  // attention
  ops_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_in, w.ln1_w, w.ln1_b, N, d.C, d.eps);
  rnd(a.ln1, N * d.C);
  ops_.linear_forward(a.qkv, a.ln1, w.qkv_w, w.qkv_b, N, d.C, 3 * d.Cl);  // column-parallel (by heads)
  rnd(a.qkv, 3 * N * d.Cl);
  attention_core_forward(a);
  ops_.linear_forward(tmp_, a.atty, w.proj_w, bias_rank ? w.proj_b : nullptr, N, d.Cl, d.C);  // row-parallel
  rnd(tmp_, N * d.C);
  reduce_from_tp_region_forward(tp_, tmp_, N * d.C, wire());
  ops_.add(a.x_mid, x_in, tmp_, N * d.C);
  rnd(a.x_mid, N * d.C);
  // MLP
  ops_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.x_mid, w.ln2_w, w.ln2_b, N, d.C, d.eps);
  rnd(a.ln2, N * d.C);
  ops_.linear_forward(a.fc1, a.ln2, w.fc1_w, w.fc1_b, N, d.C, d.Fl);  // column-parallel
  rnd(a.fc1, N * d.Fl);
  ops_.gelu_forward(a.gelu, a.fc1, N * d.Fl);
  rnd(a.gelu, N * d.Fl);
  ops_.linear_forward(tmp_, a.gelu, w.fc2_w, bias_rank ? w.fc2_b : nullptr, N, d.Fl, d.C);  // row-parallel
  rnd(tmp_, N * d.C);
  reduce_from_tp_region_forward(tp_, tmp_, N * d.C, wire());
  ops_.add(x_out, a.x_mid, tmp_, N * d.C);
  rnd(x_out, N * d.C);
}

// Scores, softmax and the weighted sum of values: what selective recompute reruns in backward.
void GPTStage::attention_core_forward(LayerActs& a) {
  const GPTDims& d = d_;
  ops_.attention_forward(a.atty, a.lse, a.qkv, B_, d.S, d.Hl, d.D);  // lse stays fp32
  rnd(a.atty, B_ * d.S * d.Cl);
}

// dres: d block output on entry, d block input on exit.
void GPTStage::block_backward(int64_t layer, LayerActs& a, const float* x_in, float* dres) {
  const GPTDims& d = d_;
  const int64_t N = B_ * d.S;
  BlockParams w = block_params(layout_, params_, layer);
  BlockParams gw = block_params(layout_, grads_, layer);
  // MLP
  ops_.linear_backward(dfc_, gw.fc2_w, gw.fc2_b, dres, a.gelu, w.fc2_w, N, d.Fl, d.C, false);
  rnd(dfc_, N * d.Fl);
  ops_.gelu_backward(dfc_, dfc_, a.fc1, N * d.Fl);
  rnd(dfc_, N * d.Fl);
  ops_.linear_backward(dln_, gw.fc1_w, gw.fc1_b, dfc_, a.ln2, w.fc1_w, N, d.C, d.Fl, false);
  rnd(dln_, N * d.C);
  copy_to_tp_region_backward(tp_, dln_, N * d.C, wire());
  ops_.layernorm_backward(dres, gw.ln2_w, gw.ln2_b, dln_, a.x_mid, w.ln2_w, a.ln2_mean, a.ln2_rstd, N, d.C);
  rnd(dres, N * d.C);
  // attention
  if (opt_.recompute == Recompute::Selective) attention_core_forward(a);
  ops_.linear_backward(datt_, gw.proj_w, gw.proj_b, dres, a.atty, w.proj_w, N, d.Cl, d.C, false);
  rnd(datt_, N * d.Cl);
  ops_.attention_backward(dqkv_, datt_stats_, datt_, a.qkv, a.atty, a.lse, B_, d.S, d.Hl, d.D);
  rnd(dqkv_, 3 * N * d.Cl);
  ops_.linear_backward(dln_, gw.qkv_w, gw.qkv_b, dqkv_, a.ln1, w.qkv_w, N, d.C, 3 * d.Cl, false);
  rnd(dln_, N * d.C);
  copy_to_tp_region_backward(tp_, dln_, N * d.C, wire());
  ops_.layernorm_backward(dres, gw.ln1_w, gw.ln1_b, dln_, x_in, w.ln1_w, a.ln1_mean, a.ln1_rstd, N, d.C);
  rnd(dres, N * d.C);
}

void GPTStage::forward(int slot, const int32_t* tokens, const float* hidden_in) {
  const GPTDims& d = d_;
  const int64_t N = B_ * d.S;
  SlotActs& a = *slots_.at(size_t(slot));
  if (d.first_stage()) {
    ops_.copy(reinterpret_cast<float*>(a.tokens), reinterpret_cast<const float*>(tokens), size_t(N));
    // vocab-parallel embedding: rows outside this rank's shard give 0, summed over TP (g)
    ops_.embedding_forward(a.x_in, a.tokens, p("wte.weight"), N, d.C, d.v0, d.Vl);
    reduce_from_tp_region_forward(tp_, a.x_in, N * d.C, wire());
    ops_.add_position_embedding(a.x_in, p("wpe.weight"), B_, d.S, d.C);
  } else {
    ops_.copy(a.x_in, hidden_in, size_t(N * d.C));
  }
  rnd(a.x_in, N * d.C);
  const float* x = a.x_in;
  for (size_t i = 0; i < a.layers.size(); ++i) {
    LayerActs& la = opt_.recompute == Recompute::Full ? *recompute_acts_ : a.layers[i];
    block_forward(d.layer_begin + int64_t(i), la, x, a.layers[i].x_out);
    x = a.layers[i].x_out;
  }
  if (d.last_stage()) {
    ops_.layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, x, p("ln_f.weight"), p("ln_f.bias"), N, d.C, d.eps);
    rnd(a.lnf, N * d.C);
  }
  if (logits_slot_ == slot) logits_slot_ = -1;
}

const float* GPTStage::output(int slot) const {
  const SlotActs& a = *slots_.at(size_t(slot));
  return a.layers.empty() ? a.x_in : a.layers.back().x_out;
}

double GPTStage::loss(int slot, const int32_t* targets, float dloss_scale, bool want_grad) {
  const GPTDims& d = d_;
  TPT_CHECK(d.last_stage());
  const int64_t N = B_ * d.S;
  SlotActs& a = *slots_.at(size_t(slot));
  if (targets != a.targets)
    ops_.copy(reinterpret_cast<float*>(a.targets), reinterpret_cast<const float*>(targets), size_t(N));
  a.dloss_scale = dloss_scale;
  // LM head tied to the word embedding, vocab-parallel: logits (N, Vl) of this rank's vocabulary rows.
  ops_.linear_forward(logits_, a.lnf, p("wte.weight"), nullptr, N, d.C, d.Vl);
  rnd(logits_, N * d.Vl);  // cross-entropy itself runs in fp32 on the stored logits
  float* row_max = xent_;
  float* target_logit = xent_ + N;
  float* sum_exp = xent_ + 2 * N;  // adjacent to target_logit: one all-reduce for both
  float* losses = xent_ + 3 * N;
  ops_.xent_local_max(row_max, target_logit, logits_, a.targets, N, d.Vl, d.v0, d.V);
  if (tp_.size() > 1) tp_.all_reduce(row_max, N, ReduceOp::Max);
  ops_.xent_local_sumexp(sum_exp, logits_, row_max, N, d.Vl, d.v0, d.V);
  if (tp_.size() > 1) tp_.all_reduce(target_logit, 2 * N, ReduceOp::Sum);
  ops_.xent_backward_inplace(logits_, losses, row_max, sum_exp, target_logit, a.targets, N, d.Vl, d.v0,
                             d.V, dloss_scale, want_grad);
  if (want_grad) rnd(logits_, N * d.Vl);
  logits_slot_ = want_grad ? slot : -1;
  std::vector<float> host(static_cast<size_t>(N));
  ops_.to_host(host.data(), losses, size_t(N));
  double sum = 0;
  for (float l : host) sum += l;
  return sum;
}

void GPTStage::backward(int slot, const float* doutput, const std::function<void(int64_t layer)>& layer_done) {
  const GPTDims& d = d_;
  const int64_t N = B_ * d.S;
  SlotActs& a = *slots_.at(size_t(slot));
  if (d.last_stage()) {
    if (logits_slot_ != slot) loss(slot, a.targets, a.dloss_scale, true);  // recompute (e.g. GPipe)
    // LM head backward: d lnf = dlogits @ wte_local, summed over TP (f); d wte += dlogits^T lnf
    ops_.linear_backward(dln_, g("wte.weight"), nullptr, logits_, a.lnf, p("wte.weight"), N, d.C, d.Vl, false);
    logits_slot_ = -1;
    rnd(dln_, N * d.C);
    copy_to_tp_region_backward(tp_, dln_, N * d.C, wire());
    const float* x = a.layers.empty() ? a.x_in : a.layers.back().x_out;
    ops_.zero(dres_, size_t(N * d.C));
    ops_.layernorm_backward(dres_, g("ln_f.weight"), g("ln_f.bias"), dln_, x, p("ln_f.weight"), a.lnf_mean,
                            a.lnf_rstd, N, d.C);
    rnd(dres_, N * d.C);
  } else {
    ops_.copy(dres_, doutput, size_t(N * d.C));
  }
  for (size_t i = a.layers.size(); i-- > 0;) {
    const float* x_in = i == 0 ? a.x_in : a.layers[i - 1].x_out;
    const int64_t layer = d.layer_begin + int64_t(i);
    if (opt_.recompute == Recompute::Full) {  // rebuild the layer's activations from its input
      block_forward(layer, *recompute_acts_, x_in, recompute_acts_->x_out);
      block_backward(layer, *recompute_acts_, x_in, dres_);
    } else {
      block_backward(layer, a.layers[i], x_in, dres_);
    }
    if (layer_done) layer_done(layer);
  }
  if (d.first_stage()) {
    ops_.embedding_backward(g("wte.weight"), a.tokens, dres_, N, d.C, d.v0, d.Vl);
    ops_.position_embedding_backward(g("wpe.weight"), dres_, B_, d.S, d.C);
  }
}

const float* GPTStage::input_grad() const { return dres_; }

}  // namespace tpt
