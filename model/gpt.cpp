// Forward and backward of one pipeline stage of the GPT on one TP rank, micro-batch by
// micro-batch. Shapes: N = B*S tokens of the micro-batch; Cl, Fl, Vl the local (TP-sharded) widths;
// Nt = d.local_tokens(N) the tokens this rank holds in the LayerNorm / residual regions: N, or with
// sequence parallelism (Korthikanti et al. 2022, as Megatron) its block of N/tp consecutive tokens of
// the flattened (B, S) micro-batch. Sequence parallelism changes only what those regions hold and the
// TP mappings around the GEMMs (gather_tokens, input_grad_to_tokens, row_parallel_output and their
// conjugates): the GEMMs and the attention see all N tokens as before.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/block.h"
#include "model/stage_bytes.h"
#include "parallel/context_parallel.h"
#include "parallel/tensor_parallel.h"

namespace tpt {

using namespace stage_bytes;

// Compute-dtype tensors are Bufs; norm statistics and the log-sum-exp are fp32.
// The LayerNorm outputs are kept as this rank's tokens (Nt, C); with sequence parallelism the GEMMs'
// gathered (N, C) copy lives in scratch and is gathered again in backward (as Megatron does), which
// keeps 2 (N - Nt) C fewer values per layer than keeping it.
struct GPTStage::LayerActs : BlockActs {  // model/block.h
  Buf x_out;                          // (Nt, C) block output
};

// What a split backward's B (BackwardPart::Input) leaves for its W (backward_weight), per layer: the
// output gradient dY of each of the layer's linear layers on all N tokens (N, out), in the compute
// dtype, indexed by layer-spec part (null for the norms): attn.qkv's from the attention backward
// through RoPE and the regroup, attn.proj's and mlp.fc2's the residual gradient (with sequence
// parallelism all-gathered), mlp.fc1's fc2's input gradient through the activation's derivative; in
// an FP8 layer with FP8 weight gradients (GPTDims::fp8_stashes_codes) dY's columnwise FP8 codes
// instead, made by B's cast (Fp8Linear::backward's dout_stash), and B adds the biases' gradients.
// W's other operand, the GEMM's input X, stays in the slot's activations (LayerActs).
struct GPTStage::LayerStash {
  std::vector<Buf> dy;
  std::vector<Fp8SavedInput> dy_q;
};

struct GPTStage::SlotActs {
  int32_t* tokens = nullptr;   // (B, S) first stage
  int32_t* targets = nullptr;  // (B, S) last stage
  int32_t* positions = nullptr;    // d.position_ids: the tokens' positions, (Nt) this rank's on the first
                                   // stage (learned positions), or (N) all on every stage (RoPE)
  float* loss_weights = nullptr;   // (B, S) last stage, d.loss_mask
  Buf x_in;                    // (Nt, C) stage input (embeddings or received hidden)
  std::vector<LayerActs> layers;
  Buf lnf;             // last stage (Nt, C)
  NormStats lnf_stats;  // last stage (Nt)
  float dloss_scale = 0.0f;
  std::vector<LayerStash> stash;  // per layer, with StageOptions::split_backward
  bool weight_pending = false;    // B ran (BackwardPart::Input), W (backward_weight) not yet
};

std::string linear_name(const GPTDims& d, int64_t in, int64_t out) {
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> parts;
  for (const LinearSpec* l : d.layer.linears()) parts.push_back({{l->in, l->out}, l->name});
  parts.push_back({{d.C, d.Vl}, "lm_head"});
  std::string name;
  for (const auto& [shape, part] : parts)
    if (shape == std::pair<int64_t, int64_t>{in, out}) name += (name.empty() ? "" : "|") + part;
  return name.empty() ? std::to_string(in) + "->" + std::to_string(out) : name;
}


Buf GPTStage::alloc(int64_t n) {
  Buf b = ops_.alloc(n, opt_.dtype);
  owned_.push_back(b.p);
  return b;
}

float* GPTStage::alloc_f32(int64_t n) {
  float* p = ops_.alloc(size_t(n));
  owned_.push_back(p);
  return p;
}

CBuf GPTStage::p_opt(const std::string& name) const {
  const ParamInfo* info = layout_.find(name);
  if (info && info->group.fp8) return fp8_param(*info);
  return info ? params_ + info->offset : CBuf{};
}

Buf GPTStage::g_opt(const std::string& name) const {
  const ParamInfo* info = layout_.find(name);
  return info ? grads_ + info->offset : Buf{};
}

CBuf GPTStage::p(const std::string& name) const {
  TPT_CHECK(layout_.find(name) != nullptr);
  return p_opt(name);
}

Buf GPTStage::g(const std::string& name) const {
  const ParamInfo* info = layout_.find(name);
  TPT_CHECK(info != nullptr);
  return grads_ + info->offset;
}

GPTStage::GPTStage(const GPTDims& d, const ParamLayout& layout, Ops& ops, Comm& tp, CBuf params, Buf grads,
                   int64_t micro_batch, int slots, StageOptions options)
    : d_(d), layout_(layout), ops_(ops), tp_(tp), params_(params), grads_(grads), B_(micro_batch), opt_(options) {
  TPT_CHECK(params.t == opt_.dtype);
  const int64_t N = B_ * d.S, Nt = d.local_tokens(N);
  TPT_CHECK(Nt * d.tp == N || !d.sequence_parallel);
  // A split backward's W needs every layer's GEMM inputs after B; full recompute keeps only each
  // layer's input, so W would have to rerun the layer's forward a second time.
  if (opt_.split_backward && opt_.recompute == Recompute::Full)
    input_error("training.recompute: full cannot be used with parallel.pipeline_schedule: zb-h1 (its split "
                "backward computes the weight gradients after the input gradients, from activations that full "
                "recompute does not keep); use none or selective");
  // Allocation order and sizes are what activation_bytes_per_microbatch / scratch_bytes count; the
  // shared scratch is carved from one region in shared_scratch_tensors' order (shared_scratch_bytes):
  // the caller's (StageOptions::shared_scratch), else the stage's own.
  const int64_t shared_bytes = shared_scratch_bytes(d, B_, opt_.recompute, opt_.dtype);
  char* shared = static_cast<char*>(opt_.shared_scratch);
  if (!shared) {
    shared = static_cast<char*>(ops_.alloc_bytes(size_t(shared_bytes)));
    owned_.push_back(shared);
  }
  // where a tensor comes from: carved from a region (the shared scratch, a pooled slot) or its own allocation
  struct Region {
    char* base = nullptr;
    int64_t used = 0;
    void* carve(int64_t bytes) {
      void* q = base + used;
      used += carve_bytes(bytes);
      return q;
    }
  };
  Region sc{shared, 0};
  // a compute-dtype / fp32 tensor of a region (null: allocated on its own)
  auto buf = [&](Region* r, int64_t n) { return r ? Buf(r->carve(tb(n, opt_.dtype)), opt_.dtype) : alloc(n); };
  auto f32 = [&](Region* r, int64_t n) { return r ? static_cast<float*>(r->carve(fb(n))) : alloc_f32(n); };
  auto norm_stats = [&](int64_t n, Region* r) {  // stats_per_token fp32 rows
    NormStats st;
    if (!d.norm.rms) st.mean = f32(r, n);
    st.rstd = f32(r, n);
    return st;
  };
  auto attention_core = [&](LayerActs& la, Region* r) {
    la.atty = buf(r, N * d.Cl);
    la.lse = f32(r, B_ * d.Hl * d.S);
  };
  // an input's FP8 codes (rows, I) saved for its weight gradient (Fp8SavedInput): the codes, their
  // scales; a norm's with sequence parallelism this rank's Nt tokens' (a shard, gathered in backward)
  auto fp8_saved = [&](Region* r, int64_t rows, int64_t I) {
    const int64_t codes = fp8_saved_code_bytes(rows, I), floats = fp8_saved_scale_floats(d.fp8_blockwise, rows, I);
    Fp8SavedInput q;
    q.shard = rows < N;
    if (r) {
      q.codes = static_cast<uint8_t*>(r->carve(codes));
    } else {
      q.codes = static_cast<uint8_t*>(ops_.alloc_bytes(size_t(codes)));
      owned_.push_back(q.codes);
    }
    q.scale_inv = f32(r, floats);
    return q;
  };
  // ln1 / ln2 of the layer at hand: with the layernorm recompute module (keeps_norms), or where the
  // layer saves their FP8 codes instead (GPTDims::fp8_saved_inputs)
  Buf shared_norm{}, mlp_fc1{}, mlp_act{};  // and the mlp module's reruns (GPTDims::mlp_rerun)
  Fp8SavedInput mlp_act_q{};
  auto layer_acts = [&](const LayerActs* shared_core, int64_t layer, Region* r) {  // layer_tensor_bytes
    const bool moe = layer >= 0 && d.moe.is_moe(layer);  // -1: full recompute's
    const GPTDims::Fp8Saved q = d.fp8_saved_inputs(layer, opt_.recompute);
    LayerActs la;
    if (q.ln1) la.ln1 = shared_norm, la.ln1_q = fp8_saved(r, Nt, d.C);
    else la.ln1 = shared_norm.p && !d.keeps_norms(opt_.recompute) ? shared_norm : buf(r, Nt * d.C);
    la.ln1_stats = norm_stats(Nt, r);
    la.qkv = buf(r, N * d.qkv_width);
    if (d.qk_norm) {
      la.qk_in = buf(r, qk_norm_rows(d, N) * d.D);
      la.qk_stats = norm_stats(qk_norm_rows(d, N), r);
    }
    if (shared_core) la.atty = shared_core->atty, la.lse = shared_core->lse;
    else attention_core(la, r);
    la.x_mid = buf(r, Nt * d.C);
    if (q.ln2) la.ln2 = shared_norm, la.ln2_q = fp8_saved(r, Nt, d.C);
    else la.ln2 = shared_norm.p && !d.keeps_norms(opt_.recompute) ? shared_norm : buf(r, Nt * d.C);
    la.ln2_stats = norm_stats(Nt, r);
    if (!moe) {  // an MoE layer's MLP keeps its rows in moe_
      const bool keep = d.keeps_mlp(opt_.recompute, layer);  // else the mlp module's shared reruns
      la.fc1 = keep ? buf(r, N * d.fc1_width) : mlp_fc1;
      // GELU: recomputed in backward (recompute_activation); SwiGLU's saved in FP8: only its codes kept
      if (q.act) la.gelu = dact_, la.act_q = keep ? fp8_saved(r, N, d.Fl) : mlp_act_q;
      else la.gelu = !d.mlp.swiglu ? dact_ : keep ? buf(r, N * d.Fl) : mlp_act;
    }
    la.x_out = buf(r, Nt * d.C);
    return la;
  };
  // the shared scratch (shared_scratch_tensors)
  dln_ = buf(&sc, N * d.C);
  tmp_ = buf(&sc, N * d.C);
  dqkv_ = buf(&sc, N * d.qkv_width);
  datt_ = buf(&sc, N * d.Cl);
  datt_stats_ = f32(&sc, B_ * d.Hl * d.S);
  dfc_ = buf(&sc, N * d.fc1_width);
  dact_ = buf(&sc, N * d.Fl);
  if (d.grouped_qkv) qkv_tmp_ = buf(&sc, N * d.qkv_width);
  if (d.qk_norm) qk_din_ = buf(&sc, N * d.Cl);
  LayerActs shared_core{};
  if (opt_.recompute == Recompute::Selective) attention_core(shared_core, &sc);
  if (shares_norm_scratch(d, opt_.recompute)) shared_norm = buf(&sc, Nt * d.C);
  if (const GPTDims::MlpRerun m = d.mlp_rerun(opt_.recompute); m.any)  // in shared_scratch_tensors' order
    mlp_fc1 = buf(&sc, N * d.fc1_width), mlp_act = m.act16 ? buf(&sc, N * d.Fl) : Buf{},
    mlp_act_q = m.act8 ? fp8_saved(&sc, N, d.Fl) : Fp8SavedInput{};
  if (opt_.recompute == Recompute::Full) recompute_acts_ = new LayerActs(layer_acts(nullptr, -1, &sc));
  if (const int64_t bytes = tp_gather_bytes(N * d.C, opt_.dtype, d.tp)) wire_ = TPWire{&ops_, Buf(sc.carve(bytes), opt_.dtype)};
  TPT_CHECK(sc.used == shared_bytes);
  if (opt_.fp8) {  // the codes of the largest input, weight and output gradient of the four linear GEMMs
    fp8_begin_ = std::max(d.layer_begin, opt_.fp8_layer_begin);
    fp8_end_ = std::max(fp8_begin_, std::min(d.layer_end, opt_.fp8_layer_end));
    if (fp8_end_ > fp8_begin_) {
      const Fp8ScratchSizes f = fp8_scratch_sizes(d, B_);
      const int64_t G = fp8_gemms_per_layer(d);
      fp8_ = std::make_unique<Fp8State>(ops_, opt_.fp8_options, f, G * (fp8_end_ - fp8_begin_),
                                        fp8_weights(d, fp8_begin_, fp8_end_));
      // current scaling: an expert's GEMM inputs are its rows on this rank, parts of one tensor only over
      // its expert-TP group (EP, DP and CP ranks quantize other rows, of other experts too)
      Comm* etp = d.moe.etp > 1 ? opt_.fp8_options.amax_groups[0] : nullptr;
      for (int64_t l = fp8_begin_; l < fp8_end_; ++l)
        for (int64_t s = kFp8GemmsPerLayer; s < G; ++s) fp8_->set_amax_groups((l - fp8_begin_) * G + s, etp, nullptr);
      init_fp8_params();
    }
  }
  if (d.saves_fp8_inputs(opt_.recompute)) {  // saved FP8 inputs: made by the layers' FP8 GEMMs, as sized
    TPT_CHECK(opt_.fp8 && opt_.fp8_options.wgrad && opt_.fp8_options.blockwise == d.fp8_blockwise);
    for (int64_t l = d.layer_begin; l < d.layer_end; ++l) {
      const GPTDims::Fp8Saved q = d.fp8_saved_inputs(l, opt_.recompute);
      TPT_CHECK(!(q.ln1 || q.ln2 || q.act) || fp8_slot(l, 0) != nullptr);
    }
  }
  // sequence parallelism: the FP8 layers' QKV and fc1 inputs gathered over TP as codes (into the
  // input's codes scratch in forward, a saved shard into tmp_ in backward)
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l)
    TPT_CHECK(!d.fp8_gathers_codes(l) || (fp8_slot(l, 0) != nullptr && (!d.fp8_blockwise || Nt % kFp8Block == 0)));
  fp8_gather_.gather = [this](uint8_t* full, const uint8_t* shard, int64_t n) {
    gather_from_sequence_parallel_region_codes(tp_, full, shard, n);
  };
  fp8_gather_.Nt = Nt, fp8_gather_.rank = d.tp_rank, fp8_gather_.scratch = static_cast<uint8_t*>(tmp_.p);
  if (d.cp > 1) {  // scratch_bytes counts its buffers
    TPT_CHECK(opt_.cp != nullptr && opt_.cp->size() == d.cp && opt_.cp->rank() == d.cp_rank);
    ring_ = std::make_unique<RingAttention>(ops_, *opt_.cp, B_, d.S, d.Hl, d.kv_heads, d.D, opt_.dtype);
  }
  // the slots (slot_tensor_bytes): each tensor its own allocation, or carved from the slot's part of the pool
  const bool pooled = opt_.slot_pool != nullptr;
  TPT_CHECK(!pooled || (opt_.slot_stride >= pooled_slot_bytes(d, B_, opt_.recompute, opt_.dtype) &&
                        opt_.slot_stride % kScratchAlign == 0 && !opt_.split_backward));
  std::vector<char*> moe_regions;  // pooled: each slot's MoE rows follow its dense tensors (MoEMLP carves them)
  for (int s = 0; s < slots; ++s) {
    auto* a = new SlotActs;
    slots_.push_back(a);
    Region pool{static_cast<char*>(opt_.slot_pool) + s * opt_.slot_stride, 0};
    Region* r = pooled ? &pool : nullptr;
    a->tokens = reinterpret_cast<int32_t*>(f32(r, N));
    a->targets = reinterpret_cast<int32_t*>(f32(r, N));
    if (d.position_ids) a->positions = reinterpret_cast<int32_t*>(f32(r, positions_count(d, N)));
    if (d.loss_mask) a->loss_weights = f32(r, N);
    a->x_in = buf(r, Nt * d.C);
    for (int64_t l = d.layer_begin; l < d.layer_end; ++l) {
      if (opt_.recompute == Recompute::Full) {  // only the layer's output (= next layer's input) is kept
        LayerActs la{};
        la.x_out = buf(r, Nt * d.C);
        a->layers.push_back(la);
      } else {
        a->layers.push_back(layer_acts(opt_.recompute == Recompute::Selective ? &shared_core : nullptr, l, r));
      }
    }
    if (d.last_stage()) {
      a->lnf = buf(r, Nt * d.C);
      a->lnf_stats = norm_stats(Nt, r);
    }
    if (pooled && moe_layer_count(d) > 0 && !moe_shares_rows(d.moe, opt_.recompute)) moe_regions.push_back(pool.base + pool.used);
    TPT_CHECK(pool.used <= opt_.slot_stride);
    if (opt_.split_backward)  // weight_grad_stash_bytes
      for (int64_t l = d.layer_begin; l < d.layer_end; ++l) {
        LayerStash& st = a->stash.emplace_back();
        for (const LayerPart& part : d.spec(l).parts) {
          const bool s = part.is_linear && stashed(part.linear), q = s && d.fp8_stashes_codes(l);
          st.dy.push_back(s && !q ? alloc(N * part.linear.out) : Buf{});
          st.dy_q.push_back(q ? fp8_saved(nullptr, N, part.linear.out) : Fp8SavedInput{});
        }
      }
  }
  dres_ = alloc(Nt * d.C);
  if (d.rot) {
    TPT_CHECK(int64_t(d.inv_freq.size()) == d.rot / 2);
    inv_freq_ = alloc_f32(rope_inv_freq_floats(d));
    ops_.to_device(inv_freq_, d.inv_freq.data(), d.rot / 2);
  }
  if (d.last_stage()) {
    logits_ = alloc(N * d.Vl);
    xent_ = alloc_f32(4 * N);
  }
  if (moe_layer_count(d) > 0)  // its scratch after its layers' rows (scratch_bytes counts both)
    moe_ = std::make_unique<MoEMLP>(d, ops_, opt_.dtype, Nt, B_, d.local_token_begin(N), slots, opt_.ep, opt_.ep_host,
                                    d.moe.etp > 1 ? &tp_ : nullptr, opt_.tp_host, opt_.cp_host, opt_.dp_host,
                                    opt_.recompute, moe_regions, opt_.moe_pool);
}

MoEParams<CBuf> GPTStage::moe_params(int64_t layer) const {
  const std::string pre = "h." + std::to_string(layer) + ".mlp.";
  return {p(pre + "router.weight"),
          p(pre + "experts.fc1.weight"),
          p_opt(pre + "experts.fc1.bias"),
          p(pre + "experts.fc2.weight"),
          p_opt(pre + "experts.fc2.bias"),
          p_opt(pre + "shared_experts.fc1.weight"),
          p_opt(pre + "shared_experts.fc1.bias"),
          p_opt(pre + "shared_experts.fc2.weight"),
          p_opt(pre + "shared_experts.fc2.bias"),
          p_opt(pre + "shared_experts.gate.weight")};
}

MoEParams<Buf> GPTStage::moe_grads(int64_t layer) const {
  const std::string pre = "h." + std::to_string(layer) + ".mlp.";
  return {g(pre + "router.weight"),
          g(pre + "experts.fc1.weight"),
          g_opt(pre + "experts.fc1.bias"),
          g(pre + "experts.fc2.weight"),
          g_opt(pre + "experts.fc2.bias"),
          g_opt(pre + "shared_experts.fc1.weight"),
          g_opt(pre + "shared_experts.fc1.bias"),
          g_opt(pre + "shared_experts.fc2.weight"),
          g_opt(pre + "shared_experts.fc2.bias"),
          g_opt(pre + "shared_experts.gate.weight")};
}

// The TP mappings around an MoE layer's shared expert: the dense MLP's (its scratch: tmp_ for the
// gathered tokens and gradients, dln_ for the reduce-scattered output); in an FP8 layer its GEMMs' FP8
// state (the shared expert's and the experts' slots)
MoETPMappings GPTStage::moe_mappings(int64_t layer) {
  MoETPMappings m;
  if (fp8_slot(layer, 0)) m.fp8 = [this, layer](int64_t slot) { return fp8_slot(layer, slot); };
  m.N = B_ * d_.S;
  m.bias_in_gemm = row_bias_in_gemm();
  m.gather_tokens = [this](CBuf x) { return gather_tokens(x, tmp_); };
  m.row_parallel_output = [this](Buf partial, CBuf bias) { return row_parallel_output(partial, dln_, bias); };
  // sequence parallelism in an FP8 layer: the shared expert's fc1 input gathered as codes, and its fc2's
  // output gradient (GPTDims::fp8_gathers_dout_codes; the MoE MLP's backward is whole, also in B)
  m.fp8_gather = fp8_gather(layer);
  m.dout_codes = d_.fp8_gathers_dout_codes(layer);
  m.row_parallel_output_grad = [this, codes = m.dout_codes](CBuf dy, Buf dbias) {
    const RowGrad r = row_parallel_output_grad(dy, codes ? Buf{} : tmp_, dbias);
    return std::pair<CBuf, Buf>{r.dout, r.dbias};
  };
  m.input_grad_to_tokens = [this](Buf dfull) { return input_grad_to_tokens(dfull, tmp_); };
  return m;
}

GPTStage::~GPTStage() {
  for (void* q : owned_) ops_.free(q);
  for (SlotActs* a : slots_) delete a;
  delete recompute_acts_;
}

// ---- the TP mappings around the GEMMs (parallel/tensor_parallel.h), for both layouts of the
// LayerNorm / residual regions: all N tokens (copy_to / reduce_from_tp_region: all-reduces of the
// (N, C) tensors) or, with sequence parallelism, this rank's Nt tokens (all-gather before each
// column-parallel GEMM, reduce-scatter after each row-parallel one, and the conjugates in backward).

CBuf GPTStage::gather_tokens(CBuf x, Buf full) {
  if (!d_.sequence_parallel) return x;
  gather_from_sequence_parallel_region_forward(tp_, full, x, d_.local_tokens(B_ * d_.S) * d_.C, wire());
  return full;
}

CBuf GPTStage::input_grad_to_tokens(Buf dfull, Buf shard) {
  if (!d_.sequence_parallel) {
    copy_to_tp_region_backward(tp_, dfull, B_ * d_.S * d_.C, wire());
    return dfull;
  }
  gather_from_sequence_parallel_region_backward(tp_, shard, dfull, d_.local_tokens(B_ * d_.S) * d_.C, wire());
  return shard;
}

CBuf GPTStage::row_parallel_output(Buf partial, Buf shard, CBuf bias) {
  if (!d_.sequence_parallel) {  // the bias, if any, was added in tp_rank 0's GEMM (row_bias_in_gemm)
    reduce_from_tp_region_forward(tp_, partial, B_ * d_.S * d_.C, wire());
    return partial;
  }
  const int64_t Nt = d_.local_tokens(B_ * d_.S);
  reduce_scatter_to_sequence_parallel_region_forward(tp_, shard, partial, Nt * d_.C, wire());
  // out (Nt, C) += bias (C) on every rank (Megatron): Ops' position-embedding add with one position
  if (bias) ops_.add_position_embedding(shard, bias, Nt, 1, d_.C);
  return shard;
}

GPTStage::RowGrad GPTStage::row_parallel_output_grad(CBuf dout, Buf full, Buf dbias) {
  if (!d_.sequence_parallel) return {dout, dbias};
  const int64_t Nt = d_.local_tokens(B_ * d_.S);
  if (full) reduce_scatter_to_sequence_parallel_region_backward(tp_, full, dout, Nt * d_.C, wire());
  if (dbias) ops_.bias_backward(dbias, dout, Nt, d_.C);  // column sums of this rank's rows
  return {full ? CBuf(full) : dout, nullptr};
}

namespace {
// The runs of consecutive positions among the tokens [t0, t0 + n) of the flattened (B, S)
// micro-batch: f(row, pos, seqs, len) for rows [row, row + seqs * len) (counted from t0) holding
// seqs sequences' positions pos .. pos + len - 1 -- the end of a sequence begun before t0, the whole
// sequences, the start of one that goes on after t0 + n. All tokens (t0 = 0, n = B*S): one run.
template <class F>
void for_each_position_run(int64_t t0, int64_t n, int64_t S, F&& f) {
  const int64_t end = t0 + n;
  int64_t t = t0;
  if (t % S != 0 && t < end) {
    const int64_t len = std::min(S - t % S, end - t);
    f(t - t0, t % S, int64_t{1}, len);
    t += len;
  }
  if (const int64_t whole = (end - t) / S) {
    f(t - t0, int64_t{0}, whole, S);
    t += whole * S;
  }
  if (t < end) f(t - t0, int64_t{0}, int64_t{1}, end - t);
}
}  // namespace

void GPTStage::add_positions(Buf out) {
  const int64_t N = B_ * d_.S, C = d_.C;
  const CBuf wpe = p("wpe.weight");
  for_each_position_run(d_.local_token_begin(N), d_.local_tokens(N), d_.S,
                        [&](int64_t row, int64_t pos, int64_t seqs, int64_t len) {
                          ops_.add_position_embedding(out + row * C, wpe + pos * C, seqs, len, C);
                        });
}

void GPTStage::positions_backward(CBuf dout) {
  const int64_t N = B_ * d_.S, C = d_.C;
  Buf dwpe = g("wpe.weight");
  for_each_position_run(d_.local_token_begin(N), d_.local_tokens(N), d_.S,
                        [&](int64_t row, int64_t pos, int64_t seqs, int64_t len) {
                          ops_.position_embedding_backward(dwpe + pos * C, dout + row * C, seqs, len, C);
                        });
}

const int32_t* GPTStage::rope_positions(const SlotActs& a) const { return d_.rot ? a.positions : nullptr; }

BlockShape GPTStage::block_shape(const int32_t* positions) const {
  const int64_t N = B_ * d_.S;
  return {N, d_.local_tokens(N), d_.C, d_.Cl, d_.Fl, d_.S, d_.norm, d_.mlp, d_.qkv_layout(),
          Rope{d_.rot, d_.rope_interleaved, inv_freq_}, positions, QKNorm{d_.qk_norm, d_.norm}};
}

// Every tensor is stored in the compute dtype by the op that writes it (rounded once).
Fp8Linear* GPTStage::fp8_for(int64_t layer, DensePart part) const {
  TPT_CHECK(part == kQkv || part == kProj || part == kFc1 || part == kFc2);
  return fp8_slot(layer, part == kQkv ? 0 : part == kProj ? 1 : part == kFc1 ? 2 : 3);  // fp8_state_entries' slots
}

const Fp8TokenGather* GPTStage::fp8_gather(int64_t layer) const {
  return d_.fp8_gathers_codes(layer) ? &fp8_gather_ : nullptr;
}

Fp8Linear* GPTStage::fp8_slot(int64_t layer, int64_t slot) const {
  if (!fp8_ || layer < fp8_begin_ || layer >= fp8_end_) return nullptr;
  const int64_t G = fp8_gemms_per_layer(d_);
  TPT_CHECK(slot >= 0 && slot < G);
  return fp8_->gemm((layer - fp8_begin_) * G + slot);
}

void GPTStage::block_forward(int64_t layer, LayerActs& a, CBuf x_in, Buf x_out, const int32_t* positions) {
  // the TP mappings; row-parallel biases: added once (tp_rank 0) before the all-reduce, or with
  // sequence parallelism on every rank after the reduce-scatter (row_parallel_output)
  BlockMappings tp;
  tp.gather_tokens = [&](CBuf ln) { return gather_tokens(ln, tmp_); };
  tp.row_parallel_output = [&](Buf partial, CBuf bias) { return row_parallel_output(partial, dln_, bias); };
  tp.bias_in_gemm = row_bias_in_gemm();
  for (DensePart p : {kQkv, kProj, kFc1, kFc2}) tp.fp8[p] = fp8_for(layer, p);
  tp.fp8_gather = fp8_gather(layer);
  if (d_.moe.is_moe(layer))  // the MoE MLP on this rank's tokens (x_out holds y until the residual add)
    tp.mlp = [&](CBuf ln2) {
      moe_->forward(slot_, layer, moe_params(layer), ln2, x_out, moe_mappings(layer), recording_);
      return CBuf(x_out);
    };
  ::tpt::block_forward(ops_, weights(layer), a, x_in, x_out, tmp_, qkv_tmp_,
                       block_shape(positions), [&](BlockActs&) { attention_core_forward(a); }, &tp);
}

void block_forward(Ops& ops, const BlockParams<CBuf>& w, BlockActs& a, CBuf x_in, Buf x_out, Buf tmp, Buf qkv_tmp,
                   const BlockShape& s, const std::function<void(BlockActs&)>& attention_core,
                   const BlockMappings* tp) {
  auto row_output = [&](Buf partial, CBuf bias) { return tp ? tp->row_parallel_output(partial, bias) : CBuf(partial); };
  const bool bias_in_gemm = !tp || tp->bias_in_gemm;
  auto fp8 = [&](DensePart p) { return tp ? tp->fp8[p] : nullptr; };
  // a column-parallel GEMM's input: gathered over TP here, or as FP8 codes in its GEMM (sp)
  auto sp = [&](DensePart p) { return tp && fp8(p) ? tp->fp8_gather : nullptr; };
  auto gather = [&](DensePart p, CBuf ln) { return !tp || sp(p) ? ln : tp->gather_tokens(ln); };
  // attention: QKV (column-parallel by heads or groups) in the attention's heads layout, q and k rotated
  s.norm.forward(ops, a.ln1, a.ln1_stats, x_in, w.weight[kLn1], w.bias[kLn1], s.Nt, s.C);
  const Buf qkv_out = s.qkv.grouped ? qkv_tmp : a.qkv;
  linear_forward(ops, fp8(kQkv), qkv_out, gather(kQkv, a.ln1), w.weight[kQkv], w.bias[kQkv], s.N, s.C, s.qkv.width(),
                 {}, a.ln1_q, sp(kQkv));
  s.qkv.to_heads(ops, a.qkv, qkv_out, s.N);
  if (s.qk_norm) {  // each head's q and k normalised over its D channels (a.atty: scratch until the attention)
    TPT_CHECK(w.q_norm >= 0 && w.k_norm >= 0);
    s.qk_norm.forward(ops, a.qkv, a.qk_in, a.qk_stats, w.weight[size_t(w.q_norm)], w.bias[size_t(w.q_norm)],
                      w.weight[size_t(w.k_norm)], w.bias[size_t(w.k_norm)], a.atty, s.qkv, s.N);
  }
  s.rope.forward(ops, a.qkv, s.positions, s.N, s.S, s.qkv);
  attention_core(a);
  linear_forward(ops, fp8(kProj), tmp, a.atty, w.weight[kProj], bias_in_gemm ? w.bias[kProj] : nullptr, s.N, s.Cl, s.C);  // row-parallel
  CBuf y = row_output(tmp, w.bias[kProj]);  // (Nt, C)
  // residual, then the MLP's norm in the same pass
  s.norm.residual_forward(ops, a.x_mid, a.ln2, a.ln2_stats, x_in, y, w.weight[kLn2], w.bias[kLn2], s.Nt, s.C);
  // MLP: fc1 with its activation (column-parallel), fc2 (row-parallel); or the MoE MLP
  if (tp && tp->mlp) {
    y = tp->mlp(a.ln2);
  } else {
    s.mlp.forward(ops, a.gelu, a.fc1, gather(kFc1, a.ln2), w.weight[kFc1], w.bias[kFc1], s.N, s.C, s.Fl, fp8(kFc1),
                  a.ln2_q, sp(kFc1));
    linear_forward(ops, fp8(kFc2), tmp, a.gelu, w.weight[kFc2], bias_in_gemm ? w.bias[kFc2] : nullptr, s.N, s.Fl, s.C,
                   {}, a.act_q);
    y = row_output(tmp, w.bias[kFc2]);
  }
  ops.add(x_out, a.x_mid, y, s.Nt * s.C);
}

// dres: d block output on entry, d block input on exit (Nt, C).
// With a stash (B of a split backward) each GEMM's backward computes only its input gradient
// (Ops::linear_backward with no dw, dbias) and leaves its output gradient in the stash for
// block_backward_weight, which makes the rest of the same call; the GEMMs' inputs are not read (with
// sequence parallelism the norm outputs are not gathered) until then.
void GPTStage::block_backward(int64_t layer, LayerActs& a, CBuf x_in, Buf dres, const LayerStash* stash,
                              const int32_t* positions) {
  const GPTDims& d = d_;
  const int64_t N = B_ * d.S, Nt = d.local_tokens(N);
  const BlockShape s = block_shape(positions);
  const BlockParams<CBuf> w = weights(layer);
  const BlockParams<Buf> gw = block_params(layout_, d_.spec(layer), grads_, layer);
  const bool split = stash != nullptr;
  // a split backward's stash of GEMM p's output gradient: 16-bit, or FP8 codes B's cast writes
  auto stash16 = [&](DensePart p) { return split ? stash->dy[p] : Buf{}; };
  auto stash8 = [&](DensePart p) { return split ? stash->dy_q[p] : Fp8SavedInput{}; };
  // a row-parallel FP8 GEMM's output gradient gathered as FP8 codes (GPTDims::fp8_gathers_dout_codes):
  // its Fp8TokenGather, else null
  auto dout_gather = [&](DensePart p) {
    return (p == kProj || p == kFc2) && d.fp8_gathers_dout_codes(layer) ? fp8_gather(layer) : nullptr;
  };
  // d of a row-parallel GEMM's output (N, C) for its backward: with sequence parallelism all-gathered
  // (into tmp_, or a 16-bit stash), or left as this rank's tokens where its FP8 GEMM gathers the codes;
  // without sequence parallelism dres itself, or copied into a 16-bit stash (dres changes below)
  auto row_grad = [&](DensePart p, Buf dbias) {
    const Buf stashed = stash16(p);
    if (!stashed) return row_parallel_output_grad(dres, dout_gather(p) ? Buf{} : tmp_, dbias);
    const RowGrad dy = row_parallel_output_grad(dres, stashed, dbias);
    if (!d.sequence_parallel) ops_.copy(stashed, dy.dout, N * d.C);
    return RowGrad{stashed, dy.dbias};
  };
  // one GEMM's backward: the whole call, or with a stash only the input gradient (inp() not called;
  // nor where the input's FP8 codes were saved), with FP8 codes stashed also the bias gradient
  auto gemm_backward = [&](DensePart p, Buf dinp, Buf dw, Buf dbias, CBuf dout, auto&& inp, CBuf wt, int64_t I,
                           int64_t O, const Fp8SavedInput& saved) {
    Fp8Linear* fp8 = fp8_for(layer, p);
    if (const Fp8SavedInput q = stash8(p); split)
      linear_backward(ops_, fp8, dinp, nullptr, q ? dbias : nullptr, dout, CBuf{}, wt, N, I, O, false, {}, {}, nullptr,
                      q ? dout_gather(p) : nullptr, q);
    else
      linear_backward(ops_, fp8, dinp, dw, dbias, dout, saved ? CBuf{} : inp(), wt, N, I, O, false, {}, saved,
                      fp8_gather(layer), dout_gather(p));
  };
  // the layernorm recompute module: each norm's output again from its kept input and statistics
  // (the same op on the same values), before the first read of it
  const bool norms = !d.keeps_norms(opt_.recompute);
  if (norms) s.norm.forward(ops_, a.ln2, a.ln2_stats, a.x_mid, w.weight[kLn2], w.bias[kLn2], Nt, d.C);
  CBuf dln2;  // (Nt, C)
  if (d.moe.is_moe(layer)) {  // the MoE MLP: its whole backward here (also in a split backward's B)
    // the moe recompute module: the layer's MoE MLP again (its kept rows are one set for all layers)
    if (opt_.recompute == Recompute::Selective && d.moe.recompute_moe)
      moe_->recompute(slot_, layer, moe_params(layer), a.ln2, moe_mappings(layer));
    dln2 = moe_->backward(slot_, layer, moe_params(layer), moe_grads(layer), a.ln2, dres, moe_mappings(layer));
  } else {
    // MLP: fc2's input gradient through the activation's derivative (GELU's in the same GEMM)
    if (!d.keeps_mlp(opt_.recompute, layer)) rerun_mlp(layer, a, w, norms);  // the mlp module
    const Buf dfc = stash16(kFc1) ? stash16(kFc1) : dfc_;
    RowGrad dy = row_grad(kFc2, gw.bias[kFc2]);  // (N, C), or (Nt, C)
    if (!split) s.mlp.recompute_activation(ops_, a.gelu, a.fc1, N, d.Fl);  // fc2's weight gradient reads it
    const bool b16 = stash16(kFc2).p != nullptr;  // B with a 16-bit stash: no weight or bias gradient
    s.mlp.backward(ops_, dfc, dact_, split ? nullptr : gw.weight[kFc2], b16 ? nullptr : dy.dbias, dy.dout,
                   a.act_q ? CBuf{} : CBuf(a.gelu), w.weight[kFc2], a.fc1, N, d.Fl, d.C, fp8_for(layer, kFc2),
                   a.act_q, b16 ? nullptr : dout_gather(kFc2), stash8(kFc2));
    gemm_backward(kFc1, dln_, gw.weight[kFc1], gw.bias[kFc1], dfc, [&] { return gather_tokens(a.ln2, tmp_); },  // SP: gathered again
                  w.weight[kFc1], d.C, d.fc1_width, a.ln2_q);
    dln2 = input_grad_to_tokens(dln_, tmp_);
  }
  s.norm.backward(ops_, dres, gw.weight[kLn2], gw.bias[kLn2], dln2, a.x_mid, w.weight[kLn2], a.ln2_stats, Nt, d.C);
  // attention
  if (opt_.recompute == Recompute::Selective) attention_core_forward(a);
  const RowGrad dy = row_grad(kProj, gw.bias[kProj]);
  gemm_backward(kProj, datt_, gw.weight[kProj], dy.dbias, dy.dout, [&] { return CBuf(a.atty); }, w.weight[kProj], d.Cl, d.C,
                Fp8SavedInput{});
  // d QKV GEMM output: the attention's gradient in the heads layout, rotated back, regrouped
  const Buf dqkv = stash16(kQkv) ? stash16(kQkv) : dqkv_;
  const Buf dheads = d.grouped_qkv ? qkv_tmp_ : dqkv;
  if (ring_) ring_->backward(dheads, datt_, a.qkv, a.atty, a.lse);
  else ops_.attention_backward(dheads, datt_stats_, datt_, a.qkv, a.atty, a.lse, B_, d.S, d.Hl, d.kv_heads, d.D);
  s.rope.backward(ops_, dheads, positions, N, d.S, s.qkv);
  if (s.qk_norm)  // the q/k norms' whole backward (also in a split backward's B); datt_ is spent
    s.qk_norm.backward(ops_, dheads, gw.weight[size_t(gw.q_norm)], gw.bias[size_t(gw.q_norm)], gw.weight[size_t(gw.k_norm)],
                       gw.bias[size_t(gw.k_norm)], a.qk_in, w.weight[size_t(w.q_norm)], w.weight[size_t(w.k_norm)],
                       a.qk_stats, datt_, qk_din_, s.qkv, N);
  s.qkv.from_heads(ops_, dqkv, dheads, N);
  if (norms && !split) s.norm.forward(ops_, a.ln1, a.ln1_stats, x_in, w.weight[kLn1], w.bias[kLn1], Nt, d.C);
  gemm_backward(kQkv, dln_, gw.weight[kQkv], gw.bias[kQkv], dqkv, [&] { return gather_tokens(a.ln1, tmp_); }, w.weight[kQkv], d.C,
                d.qkv_width, a.ln1_q);
  CBuf dln1 = input_grad_to_tokens(dln_, tmp_);
  s.norm.backward(ops_, dres, gw.weight[kLn1], gw.bias[kLn1], dln1, x_in, w.weight[kLn1], a.ln1_stats, Nt, d.C);
}

// W of a layer: the weight part of block_backward's four GEMM calls (the same dw, dbias, dout, inp;
// no dinp), in the same order, so B then W adds what the full backward adds. The row-parallel biases'
// gradients are in the GEMMs without sequence parallelism; with it B added them (row_parallel_output_grad),
// as it added every bias gradient of a GEMM whose output gradient it stashed as FP8 codes (W reads those).
// Writes only grads and scratch (tmp_ and the TP wire for the gathers, selective recompute's shared
// attention output).
void GPTStage::block_backward_weight(int64_t layer, LayerActs& a, CBuf x_in, const LayerStash& st) {
  const GPTDims& d = d_;
  const int64_t N = B_ * d.S, Nt = d.local_tokens(N);
  const bool norms = !d.keeps_norms(opt_.recompute);  // the layernorm recompute module (as in B)
  const BlockParams<CBuf> w = weights(layer);
  const BlockParams<Buf> gw = block_params(layout_, d_.spec(layer), grads_, layer);
  // GEMM p's weight gradient from its stashed output gradient (its bias gradient too where B left it)
  auto weight_grad = [&](DensePart p, CBuf inp, int64_t I, int64_t O, const Fp8SavedInput& saved) {
    const Fp8SavedInput& q = st.dy_q[p];
    const Buf dbias = q || (d.sequence_parallel && (p == kProj || p == kFc2)) ? nullptr : gw.bias[p];
    linear_backward(ops_, fp8_for(layer, p), Buf{}, gw.weight[p], dbias, st.dy[p], inp, w.weight[p], N, I, O, false, {},
                    saved, fp8_gather(layer), nullptr, q);
  };
  if (!d.moe.is_moe(layer)) {  // MLP (an MoE layer's finished in B)
    const bool kept = d.keeps_mlp(opt_.recompute, layer);  // else the mlp module (again: B's is gone), ln2 first
    if (!kept) rerun_mlp(layer, a, w, false);
    d.mlp.recompute_activation(ops_, a.gelu, a.fc1, N, d.Fl);
    weight_grad(kFc2, a.act_q ? CBuf{} : CBuf(a.gelu), d.Fl, d.C, a.act_q);
    if (norms && kept) d.norm.forward(ops_, a.ln2, a.ln2_stats, a.x_mid, w.weight[kLn2], w.bias[kLn2], Nt, d.C);
    // sequence parallel: gathered again, as in the full backward; FP8: or its saved codes
    weight_grad(kFc1, a.ln2_q ? CBuf{} : gather_tokens(a.ln2, tmp_), d.C, d.fc1_width, a.ln2_q);
  }
  // attention: selective recompute dropped the attention output (its scratch copy is another
  // layer's or slot's by now); rerun from the kept QKV, the same op on the same values as in B
  if (opt_.recompute == Recompute::Selective) attention_core_forward(a);
  weight_grad(kProj, a.atty, d.Cl, d.C, {});
  if (norms) d.norm.forward(ops_, a.ln1, a.ln1_stats, x_in, w.weight[kLn1], w.bias[kLn1], Nt, d.C);
  weight_grad(kQkv, a.ln1_q ? CBuf{} : gather_tokens(a.ln1, tmp_), d.C, d.qkv_width, a.ln1_q);
}

void GPTStage::forward(int slot, const int32_t* tokens, CBuf hidden_in, const int32_t* positions,
                       const std::function<void(int64_t layer)>& layer_start) {
  const GPTDims& d = d_;
  const int64_t N = B_ * d.S, Nt = d.local_tokens(N);
  SlotActs& a = *slots_.at(size_t(slot));
  TPT_CHECK(!a.weight_pending);  // the slot's activations are W's inputs until backward_weight
  slot_ = slot;
  recording_ = true;
  if (layer_start) layer_start(d.layer_begin - 1);
  if (d.first_stage()) {
    ops_.copy(reinterpret_cast<float*>(a.tokens), reinterpret_cast<const float*>(tokens), N);
    // vocab-parallel embedding of all N tokens: rows outside this rank's shard give 0, summed over TP
    // (g) in place, or with sequence parallelism reduce-scattered to this rank's tokens
    const Buf partial = d.sequence_parallel ? tmp_ : a.x_in;  // (N, C)
    ops_.embedding_forward(partial, a.tokens, p("wte.weight"), N, d.C, d.vocab_begin, d.Vl);
    row_parallel_output(partial, a.x_in, nullptr);  // (Nt, C)
  } else {
    ops_.copy(a.x_in, hidden_in, Nt * d.C);
  }
  // the slot's positions (data.reset_position_ids): learned positions need this rank's tokens' on the
  // first stage, RoPE all tokens' on every stage, until the slot's backward
  if (d.position_ids && (d.rot || d.first_stage())) {
    TPT_CHECK(positions != nullptr);
    const int64_t first = d.learned_positions() ? d.local_token_begin(N) : 0;
    ops_.copy(reinterpret_cast<float*>(a.positions), reinterpret_cast<const float*>(positions + first),
              positions_count(d, N));
  }
  if (d.first_stage() && d.learned_positions()) {
    if (d.position_ids) {  // wpe rows of the given positions: an embedding lookup, then the add
      ops_.embedding_forward(tmp_, a.positions, p("wpe.weight"), Nt, d.C, 0, d.P);
      ops_.add(a.x_in, a.x_in, tmp_, Nt * d.C);
    } else {
      add_positions(a.x_in);
    }
  }
  CBuf x = a.x_in;
  for (size_t i = 0; i < a.layers.size(); ++i) {
    LayerActs& la = opt_.recompute == Recompute::Full ? *recompute_acts_ : a.layers[i];
    if (layer_start) layer_start(d.layer_begin + int64_t(i));
    block_forward(d.layer_begin + int64_t(i), la, x, a.layers[i].x_out, rope_positions(a));
    x = a.layers[i].x_out;
  }
  if (layer_start) layer_start(d.layer_end);
  if (d.last_stage()) d.norm.forward(ops_, a.lnf, a.lnf_stats, x, p("ln_f.weight"), p_opt("ln_f.bias"), Nt, d.C);
  if (logits_slot_ == slot) logits_slot_ = -1;
}

CBuf GPTStage::output(int slot) const {
  const SlotActs& a = *slots_.at(size_t(slot));
  return a.layers.empty() ? a.x_in : a.layers.back().x_out;
}

double GPTStage::loss(int slot, const int32_t* targets, float dloss_scale, bool want_grad, const float* weights) {
  const GPTDims& d = d_;
  TPT_CHECK(d.last_stage());
  const int64_t N = B_ * d.S;
  SlotActs& a = *slots_.at(size_t(slot));
  if (targets != a.targets) ops_.copy(reinterpret_cast<float*>(a.targets), reinterpret_cast<const float*>(targets), N);
  a.dloss_scale = dloss_scale;
  if (d.loss_mask) {
    TPT_CHECK(weights != nullptr);
    if (weights != a.loss_weights) ops_.copy(a.loss_weights, weights, N);
  }
  // LM head (the word embedding, or the untied output layer), vocab-parallel: logits (N, Vl) of this
  // rank's vocabulary rows, in the compute dtype, from the final norm of all N tokens (with sequence
  // parallelism all-gathered); the cross-entropy reads them in three passes (fp32 row statistics).
  CBuf lnf = gather_tokens(a.lnf, tmp_);  // (N, C)
  ops_.linear_forward(logits_, lnf, p(output_weight()), nullptr, N, d.C, d.Vl);
  float* row_max = xent_;
  float* target_logit = xent_ + N;
  float* sum_exp = xent_ + 2 * N;  // adjacent to target_logit: one all-reduce for both
  float* losses = xent_ + 3 * N;
  ops_.xent_local_max(row_max, target_logit, logits_, a.targets, N, d.Vl, d.vocab_begin, d.V);
  vocab_parallel_max(tp_, row_max, N);
  ops_.xent_local_sumexp(sum_exp, logits_, row_max, N, d.Vl, d.vocab_begin, d.V);
  vocab_parallel_sum(tp_, target_logit, 2 * N);
  ops_.xent_loss_grad(logits_, losses, row_max, sum_exp, target_logit, a.targets, N, d.Vl, d.vocab_begin, d.V, dloss_scale,
                      want_grad, a.loss_weights);
  logits_slot_ = want_grad ? slot : -1;
  std::vector<float> host(static_cast<size_t>(N));
  ops_.to_host(host.data(), losses, N);
  double sum = 0;
  for (float l : host) sum += l;
  return sum;
}

void GPTStage::backward(int slot, CBuf doutput, const std::function<void(int64_t layer)>& layer_done,
                        BackwardPart part) {
  const GPTDims& d = d_;
  const int64_t N = B_ * d.S, Nt = d.local_tokens(N);
  SlotActs& a = *slots_.at(size_t(slot));
  bool split = false;
  switch (part) {
    case BackwardPart::Full: break;
    case BackwardPart::Input: split = true; break;
  }
  TPT_CHECK(!a.weight_pending);
  TPT_CHECK(!split || opt_.split_backward);  // Input stashes into the slot's LayerStash
  slot_ = slot;
  recording_ = false;  // full recompute's forwards: the step's balancing losses were counted once
  if (d.last_stage()) {
    if (logits_slot_ != slot) loss(slot, a.targets, a.dloss_scale, true, a.loss_weights);  // recompute (e.g. GPipe)
    // LM head backward: d lnf = dlogits @ W_local, summed over TP (f; with sequence parallelism
    // reduce-scattered to this rank's tokens); d W += dlogits^T lnf (lnf gathered again). Also in
    // a split backward's B: the logits gradient is never stashed.
    CBuf lnf = gather_tokens(a.lnf, tmp_);
    ops_.linear_backward(dln_, g(output_weight()), nullptr, logits_, lnf, p(output_weight()), N, d.C, d.Vl, false);
    logits_slot_ = -1;
    CBuf dlnf = input_grad_to_tokens(dln_, tmp_);  // (Nt, C)
    CBuf x = a.layers.empty() ? a.x_in : a.layers.back().x_out;
    ops_.zero(dres_, Nt * d.C);
    d.norm.backward(ops_, dres_, g("ln_f.weight"), g_opt("ln_f.bias"), dlnf, x, p("ln_f.weight"), a.lnf_stats, Nt, d.C);
  } else {
    ops_.copy(dres_, doutput, Nt * d.C);
  }
  for (size_t i = a.layers.size(); i-- > 0;) {
    CBuf x_in = i == 0 ? a.x_in : a.layers[i - 1].x_out;
    const int64_t layer = d.layer_begin + int64_t(i);
    if (opt_.recompute == Recompute::Full) {  // rebuild the layer's activations from its input
      block_forward(layer, *recompute_acts_, x_in, recompute_acts_->x_out, rope_positions(a));
      block_backward(layer, *recompute_acts_, x_in, dres_, nullptr, rope_positions(a));  // never split (constructor)
    } else {
      block_backward(layer, a.layers[i], x_in, dres_, split ? &a.stash[i] : nullptr, rope_positions(a));
    }
    if (layer_done && !split) layer_done(layer);
  }
  if (d.first_stage()) {
    // the vocab-parallel embedding's gradient from all N tokens (sequence parallel: all-gathered)
    const CBuf demb = row_parallel_output_grad(dres_, tmp_, nullptr).dout;  // (N, C)
    ops_.embedding_backward(g("wte.weight"), a.tokens, demb, N, d.C, d.vocab_begin, d.Vl);
    if (d.learned_positions() && d.position_ids) ops_.embedding_backward(g("wpe.weight"), a.positions, dres_, Nt, d.C, 0, d.P);
    else if (d.learned_positions()) positions_backward(dres_);
  }
  a.weight_pending = split;
}

void GPTStage::backward_weight(int slot, const std::function<void(int64_t layer)>& layer_done) {
  SlotActs& a = *slots_.at(size_t(slot));
  TPT_CHECK(a.weight_pending);  // after the slot's backward with BackwardPart::Input
  for (size_t i = a.layers.size(); i-- > 0;) {
    const int64_t layer = d_.layer_begin + int64_t(i);
    block_backward_weight(layer, a.layers[i], i ? CBuf(a.layers[i - 1].x_out) : CBuf(a.x_in), a.stash[i]);
    if (layer_done) layer_done(layer);
  }
  a.weight_pending = false;
}

CBuf GPTStage::input_grad() const { return dres_; }

}  // namespace tpt
