// Single-process GPT forward with a KV cache. Shapes: n = tokens of this call, C hidden, F ffn
// hidden, H heads of D, P positions, V vocabulary (unpadded), L layers.
#include "model/inference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/math.h"
#include "core/rng.h"
#include "model/block.h"
#include "model/checkpoint_model.h"
#include "model/optimizer.h"  // is_optional_state_name
#include "parallel/checkpoint.h"
#include "parallel/comm.h"

namespace tpt {

InferenceWeights load_inference_weights(const std::string& dir) {
  auto self = make_self_comm();
  // The model's sizes come from the checkpoint itself: a first look at its meta.json ...
  LoadRequest peek;
  peek.dir = dir;
  std::unique_ptr<CheckpointReader> first = CheckpointReader::open(*self, peek);
  if (!first) input_error("no checkpoint in " + dir);
  InferenceWeights w;
  Config cfg;
  cfg.model = checkpoint_model_config(first->meta());
  first.reset();
  w.model = cfg.model;
  w.dims = make_dims(cfg, 1, 0, 1, 0);
  w.layout = make_param_layout(w.dims);
  w.params.assign(size_t(w.layout.total), 0.0f);

  // ... then the load proper: the whole model as one TP = 1, PP = 1 rank, read from whatever boxes
  // the saving layout wrote (the word embedding's padding rows stay zero).
  LoadRequest req;
  req.dir = dir;
  for (const ParamInfo& p : w.layout.params) {
    req.wanted.push_back({p, w.params.data() + p.offset});
    // the shape check covers the whole checkpoint: parameters and their Adam moments (not read)
    for (const char* prefix : {"", "optimizer.state.exp_avg.", "optimizer.state.exp_avg_sq."})
      req.model.push_back({prefix + p.name, p.global_shape});
  }
  // MoE's expert biases (not parameters: no moments), one (E) per MoE layer
  const MoEDims& moe = w.dims.moe;
  if (moe.router.expert_bias) {
    w.expert_bias.resize(size_t(w.dims.L));
    for (int64_t l = 0; l < w.dims.L; ++l) {
      if (!moe.is_moe(l)) continue;
      w.expert_bias[size_t(l)].assign(size_t(moe.E), 0.0f);
      CkptTensor t;
      t.name = "h." + std::to_string(l) + ".mlp.router.expert_bias";
      t.global_shape = t.box_size = t.local_shape = {moe.E};
      t.box_offset = {0};
      t.data = w.expert_bias[size_t(l)].data();
      req.wanted.push_back(t);
      req.model.push_back({t.name, t.global_shape});
    }
  }
  req.optional = is_optional_state_name;  // FP8 delayed scaling's state, fp16 optimizer states' scales: not read
  req.warn_other_files = true;  // the optimizer shards are not read: a damaged one is only a warning
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::open(*self, req);
  if (!reader) input_error("no checkpoint in " + dir);
  for (const CkptTensor& t : req.wanted) reader->read(t);
  w.path = reader->path();
  w.iteration = reader->iteration();
  w.grid = reader->meta().value("grid", nlohmann::json::object());
  return w;
}

GPTInference::GPTInference(const GPTDims& d, const ParamLayout& layout, Ops& ops, const float* params,
                           std::vector<std::vector<float>> expert_bias)
    : d_(d), layout_(layout), ops_(ops), params_(params), expert_bias_(std::move(expert_bias)) {
  TPT_CHECK(d.tp == 1 && d.pp == 1 && d.moe.ep == 1);
  if (d.moe.router.expert_bias)
    for (int64_t l = 0; l < d.L; ++l)
      TPT_CHECK(!d.moe.is_moe(l) || (size_t(l) < expert_bias_.size() && int64_t(expert_bias_[size_t(l)].size()) == d.moe.E));
  k_cache_.assign(size_t(d.L * d.P * d.G * d.D), 0.0f);  // G key/value heads per position
  v_cache_.assign(size_t(d.L * d.P * d.G * d.D), 0.0f);
  router_ = d.moe.router;
  router_.capacity_factor = 0;  // dropless: capacity is a training-time rule (Megatron's too)
  router_.pad_to_capacity = false;
  router_.balancing = MoEBalancing::None;
  router_.aux_coeff = router_.z_coeff = 0;
}

const float* GPTInference::p(const std::string& name) const {
  const ParamInfo* info = layout_.find(name);
  TPT_CHECK(info != nullptr);
  return params_ + info->offset;
}

// The loop order of the CPU backend's attention_forward, so that the cached and the full forward
// agree; qkv holds q, k, v of all heads as the training forward's attention reads them (n, (H + 2 G) D):
// query head h attends with key/value head h / (H / G).
void GPTInference::cached_attention(int64_t l, const float* qkv, float* att, int64_t n) {
  const int64_t H = d_.H, G = d_.G, D = d_.D, P = d_.P, p0 = len_, KD = G * D, row = (H + 2 * G) * D;
  float* kc = k_cache_.data() + l * P * KD;  // (P, G D)
  float* vc = v_cache_.data() + l * P * KD;
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(qkv + i * row + H * D, KD, kc + (p0 + i) * KD);
    std::copy_n(qkv + i * row + H * D + KD, KD, vc + (p0 + i) * KD);
  }
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t t = p0 + i, kv = (h / (H / G)) * D;
      const float* q = qkv + i * row + h * D;
      std::vector<float> pr(size_t(t + 1));
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s <= t; ++s) {
        const float* k = kc + s * KD + kv;
        float dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t e = 0; e < D; ++e) dot += q[e] * k[e];
        pr[size_t(s)] = dot * scale;
        mx = std::max(mx, pr[size_t(s)]);
      }
      float sum = 0;
      for (int64_t s = 0; s <= t; ++s) {
        pr[size_t(s)] = fast_exp(pr[size_t(s)] - mx);
        sum += pr[size_t(s)];
      }
      const float inv = 1.0f / sum;
      for (int64_t s = 0; s <= t; ++s) pr[size_t(s)] *= inv;
      float* o = att + i * H * D + h * D;
      for (int64_t e = 0; e < D; ++e) o[e] = 0.0f;
      for (int64_t s = 0; s <= t; ++s) {
        const float* v = vc + s * KD + kv;
        const float ps = pr[size_t(s)];
        for (int64_t e = 0; e < D; ++e) o[e] += ps * v[e];
      }
    }
}

// docs/MOE.md "One MoE layer" steps 1, 2, 4, 5 and 6 on the call's n tokens, as MoEMLP::forward with EP
// 1 and TP 1: fp32 logits, host routing (the expert bias choosing), the rows gathered expert-major, one GEMM pair per expert, the
// weighted sum back per token, plus the shared expert (times its gate).
void GPTInference::moe_mlp(int64_t l, const float* ln2, float* y, int64_t n) {
  const MoEDims& m = d_.moe;
  const int64_t C = d_.C, E = m.E, k = m.router.k;
  const std::string pre = "h." + std::to_string(l) + ".mlp.";
  auto opt = [&](const std::string& name) {
    const ParamInfo* info = layout_.find(name);
    return info ? CBuf(params_ + info->offset) : CBuf{};
  };
  const MoEParams<CBuf> w{p(pre + "router.weight"),
                          p(pre + "experts.fc1.weight"),
                          opt(pre + "experts.fc1.bias"),
                          p(pre + "experts.fc2.weight"),
                          opt(pre + "experts.fc2.bias"),
                          opt(pre + "shared_experts.fc1.weight"),
                          opt(pre + "shared_experts.fc1.bias"),
                          opt(pre + "shared_experts.fc2.weight"),
                          opt(pre + "shared_experts.fc2.bias"),
                          opt(pre + "shared_experts.gate.weight")};
  auto fit = [](std::vector<float>& v, int64_t floats) {  // the scratch, grown to the largest call
    if (int64_t(v.size()) < floats) v.resize(size_t(floats));
    return v.data();
  };
  // router logits z (n, E) in fp32 (the parameters are fp32 here), routed on the host
  std::vector<float> z(static_cast<size_t>(n * E));
  ops_.linear_forward(z.data(), ln2, w.router, nullptr, n, C, E);
  const Routing r = route(z.data(), n, router_, [](int64_t) { return int64_t{0}; }, 1, 1, [](std::vector<double>&) {},
                          router_.expert_bias ? expert_bias_[size_t(l)].data() : nullptr);
  const MoESendOrder o = moe_send_order(r, E);  // n k rows: every assignment kept
  float* xin = fit(moe_xin_, n * k * C);
  float* out = fit(moe_out_, n * k * C);
  ops_.gather_rows(xin, ln2, o.perm.data(), nullptr, o.n_send, C);
  // the probabilities applied in the experts, as training applies them (model/moe.h)
  moe_ident_.resize(size_t(o.n_send));
  for (int64_t i = 0; i < o.n_send; ++i) moe_ident_[size_t(i)] = int32_t(i);
  moe_zero_.assign(size_t(o.n_send), 0);
  const MoERowWeights pw{o.row_w.data(), fit(moe_wact_, n * k * m.Fel), moe_ident_.data(), moe_zero_.data()};
  moe_experts_forward(ops_, d_, w, o.per_expert, xin, fit(moe_fc1_, n * k * m.fc1_width), fit(moe_act_, n * k * m.Fel),
                      out, {}, &pw);
  ops_.combine_rows(y, out, o.comb.data(), nullptr, n, k, C, false);
  if (!m.Fs) return;
  // the shared expert on every token: y += shared(x), times sigmoid(x . gate) with the gate
  float* sh_act = fit(moe_act_, n * m.Fs);  // the experts' rows are spent: their scratch serves again
  float* sh_y = out;
  d_.mlp.forward(ops_, sh_act, fit(moe_fc1_, n * m.shared_fc1_width), ln2, w.shared_fc1, w.shared_fc1_bias, n, C, m.Fs);
  ops_.linear_forward(sh_y, sh_act, w.shared_fc2, w.shared_fc2_bias, n, m.Fs, C);
  if (!m.shared_gate) return ops_.accumulate(y, sh_y, n * C);
  std::vector<float> gate(static_cast<size_t>(n));
  ops_.linear_forward(gate.data(), ln2, w.gate, nullptr, n, C, 1);
  for (float& g : gate) g = 1.0f / (1.0f + std::exp(-g));
  std::vector<int32_t> identity(static_cast<size_t>(n));
  std::iota(identity.begin(), identity.end(), 0);
  ops_.combine_rows(y, sh_y, identity.data(), gate.data(), n, 1, C, true);
}

void GPTInference::forward(std::span<const int32_t> tokens, std::vector<float>& logits, bool all_positions) {
  const GPTDims& d = d_;
  const int64_t n = int64_t(tokens.size()), C = d.C, F = d.F, P = d.P, QKV = d.qkv_width;
  if (n == 0) internal_error("GPTInference::forward: no tokens");
  if (len_ + n > P)
    input_error("positions " + std::to_string(len_) + ".." + std::to_string(len_ + n - 1) +
                " pass the model's max_position_embeddings " + std::to_string(P));
  for (int32_t t : tokens)
    if (t < 0 || t >= d.V)
      input_error("token " + std::to_string(t) + " is outside the model's vocabulary [0, " + std::to_string(d.V) + ")");
  const int64_t p0 = len_;
  auto buffer = [](int64_t floats) { return std::vector<float>(static_cast<size_t>(floats)); };
  std::vector<float> x = buffer(n * C), x_next = buffer(n * C), x_mid = buffer(n * C), ln1 = buffer(n * C),
                     ln2 = buffer(n * C), stats = buffer(4 * n), qkv = buffer(n * QKV), qkv_tmp = buffer(n * QKV),
                     att = buffer(n * d.Cl), tmp = buffer(n * C), fc = buffer(n * d.fc1_width), act = buffer(n * F),
                     qk = buffer(d.qk_norm ? n * (d.H + d.G) * (d.D + 2) : 0);  // the q/k norms' inputs, statistics
  BlockActs a;
  a.ln1 = ln1.data(), a.ln2 = ln2.data(), a.x_mid = x_mid.data(), a.qkv = qkv.data(), a.atty = att.data();
  a.fc1 = fc.data(), a.gelu = act.data();
  a.ln1_stats = {stats.data(), stats.data() + n}, a.ln2_stats = {stats.data() + 2 * n, stats.data() + 3 * n};
  if (d.qk_norm) {  // keys are normalised (and rotated) before cached_attention caches them
    const int64_t rows = n * (d.H + d.G);
    a.qk_in = qk.data(), a.qk_stats = {qk.data() + rows * d.D, qk.data() + rows * (d.D + 1)};
  }
  std::vector<int32_t> positions(static_cast<size_t>(n));  // RoPE: this call's positions
  std::iota(positions.begin(), positions.end(), int32_t(p0));

  // embeddings: x (n, C) = wte[token] (+ wpe[position] with learned positions)
  ops_.embedding_forward(x.data(), tokens.data(), p("wte.weight"), n, C, 0, d.Vl);
  if (d.learned_positions()) ops_.add_position_embedding(x.data(), p("wpe.weight") + p0 * C, 1, n, C);

  const BlockShape shape{n, n, C, d.Cl, F, n, d.norm, d.mlp, d.qkv_layout(),
                         Rope{d.rot, d.rope_interleaved, d.inv_freq.data()}, positions.data(),
                         QKNorm{d.qk_norm, d.norm}};
  // an MoE layer's MLP through the block's mlp hook; one rank: no token gathering, biases in the GEMMs
  BlockMappings moe;
  moe.gather_tokens = [](CBuf ln) { return ln; };
  moe.row_parallel_output = [](Buf partial, CBuf) { return CBuf(partial); };
  int64_t layer = 0;
  moe.mlp = [&](CBuf ln2) {  // y into tmp: the attention's output there is spent by now
    moe_mlp(layer, ln2.f32(), tmp.data(), n);
    return CBuf(tmp.data());
  };
  for (int64_t l = 0; l < d.L; ++l) {
    layer = l;
    block_forward(ops_, block_params(layout_, d.spec(l), CBuf(params_), l), a, x.data(), x_next.data(), tmp.data(),
                  qkv_tmp.data(), shape, [&](BlockActs&) { cached_attention(l, qkv.data(), att.data(), n); },
                  d.moe.is_moe(l) ? &moe : nullptr);
    std::swap(x, x_next);
  }
  len_ += n;

  // final norm and the LM head (tied or not) over the unpadded vocabulary: logits (rows, V)
  const int64_t rows = all_positions ? n : 1;
  const float* last = x.data() + (n - rows) * C;
  const ParamInfo* lnf_b = layout_.find("ln_f.bias");
  d.norm.forward(ops_, ln1.data(), {stats.data(), stats.data() + n}, last, p("ln_f.weight"),
                 lnf_b ? params_ + lnf_b->offset : nullptr, rows, C);
  logits.resize(size_t(rows * d.V));
  ops_.linear_forward(logits.data(), ln1.data(), p(d.untied ? "lm_head.weight" : "wte.weight"), nullptr, rows, C, d.V);
}

int32_t greedy_token(std::span<const float> logits) {
  TPT_CHECK(!logits.empty());
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;  // strictly greater: ties keep the lowest id
  return int32_t(best);
}

int32_t sample_token(std::span<const float> logits, double temperature, int64_t top_k, uint64_t seed, uint64_t step) {
  if (temperature <= 0) return greedy_token(logits);
  const size_t V = logits.size();
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  size_t k = top_k > 0 ? std::min(V, size_t(top_k)) : V;
  auto before = [&](int32_t a, int32_t b) {  // larger logit first; ties: lower id first
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), before);
  const double top = logits[size_t(ids[0])];
  std::vector<double> cum(k);
  double total = 0;
  for (size_t i = 0; i < k; ++i) {
    total += std::exp((double(logits[size_t(ids[i])]) - top) / temperature);
    cum[i] = total;
  }
  // One uniform in (0, 1] per generated token: Philox at counter `step` under `seed`.
  const Philox4 r = philox4x32_10(stream_id("tptrain.generate"), step, seed);
  const double u = uniform_open0(r.v[0], r.v[1]) * total;
  for (size_t i = 0; i < k; ++i)
    if (u <= cum[i]) return ids[i];
  return ids[k - 1];
}

}  // namespace tpt
