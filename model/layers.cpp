// The interchangeable parts of the model (model/layers.h).
#include "model/layers.h"

#include <cmath>

#include "core/error.h"
#include "model/fp8_linear.h"

namespace tpt {

void Norm::forward(Ops& ops, Buf out, NormStats st, CBuf x, CBuf w, CBuf b, int64_t N, int64_t C) const {
  if (rms) ops.rmsnorm_forward(out, st.rstd, x, w, N, C, eps);
  else ops.layernorm_forward(out, st.mean, st.rstd, x, w, b, N, C, eps);
}

void Norm::residual_forward(Ops& ops, Buf res, Buf out, NormStats st, CBuf a, CBuf y, CBuf w, CBuf b, int64_t N,
                            int64_t C) const {
  if (rms) ops.residual_rmsnorm_forward(res, out, st.rstd, a, y, w, N, C, eps);
  else ops.residual_layernorm_forward(res, out, st.mean, st.rstd, a, y, w, b, N, C, eps);
}

void Norm::backward(Ops& ops, Buf dx, Buf dw, Buf db, CBuf dout, CBuf x, CBuf w, NormStats st, int64_t N,
                    int64_t C) const {
  if (rms) ops.rmsnorm_backward(dx, dw, dout, x, w, st.rstd, N, C);
  else ops.layernorm_backward(dx, dw, db, dout, x, w, st.mean, st.rstd, N, C);
}

void MLPActivation::forward(Ops& ops, Buf act, Buf pre, CBuf x, CBuf w, CBuf b, int64_t N, int64_t C, int64_t Fl,
                            Fp8Linear* fp8, const Fp8SavedInput& save, const Fp8TokenGather* sp) const {
  if (!swiglu) return linear_forward(ops, fp8, act, x, w, b, N, C, Fl, /*gelu_pre=*/pre, save, sp);  // GELU in the GEMM's epilogue
  linear_forward(ops, fp8, pre, x, w, b, N, C, 2 * Fl, {}, save, sp);
  ops.swiglu_forward(act, pre, N, Fl);
}

void MLPActivation::backward(Ops& ops, Buf dpre, Buf dact, Buf dw2, Buf db2, CBuf dout, CBuf act, CBuf w2,
                             CBuf pre, int64_t N, int64_t Fl, int64_t C, Fp8Linear* fp8, const Fp8SavedInput& saved,
                             const Fp8TokenGather* dout_sp, const Fp8SavedInput& dout_stash) const {
  if (!swiglu)
    return linear_backward(ops, fp8, dpre, dw2, db2, dout, act, w2, N, Fl, C, false, /*gelu_pre=*/pre, saved, nullptr,
                           dout_sp, dout_stash);
  linear_backward(ops, fp8, dact, dw2, db2, dout, act, w2, N, Fl, C, false, {}, saved, nullptr, dout_sp, dout_stash);
  ops.swiglu_backward(dpre, dact, pre, N, Fl);
}

void MLPActivation::recompute_activation(Ops& ops, Buf act, CBuf pre, int64_t N, int64_t Fl) const {
  if (!swiglu) ops.gelu_forward(act, pre, N * Fl);
}

void MLPActivation::activation(Ops& ops, Buf act, CBuf pre, int64_t N, int64_t Fl) const {
  if (swiglu) ops.swiglu_forward(act, pre, N, Fl);
  else ops.gelu_forward(act, pre, N * Fl);
}

void MLPActivation::activation_backward(Ops& ops, Buf dpre, CBuf dact, CBuf pre, int64_t N, int64_t Fl) const {
  if (swiglu) ops.swiglu_backward(dpre, dact, pre, N, Fl);
  else ops.gelu_backward(dpre, dact, pre, N * Fl);
}

void QKVLayout::to_heads(Ops& ops, Buf heads, CBuf gemm_out, int64_t N) const {
  if (grouped) ops.qkv_regroup(heads, gemm_out, N, KV, H / KV, D, true);
  else TPT_CHECK(heads.p == gemm_out.p);
}

void QKVLayout::from_heads(Ops& ops, Buf dgemm_out, CBuf dheads, int64_t N) const {
  if (grouped) ops.qkv_regroup(dgemm_out, dheads, N, KV, H / KV, D, false);
  else TPT_CHECK(dgemm_out.p == dheads.p);
}

namespace {
NormStats offset_stats(NormStats st, int64_t rows) {
  return {st.mean ? st.mean + rows : nullptr, st.rstd + rows};
}
}  // namespace

void QKNorm::forward(Ops& ops, Buf qkv, Buf keep, NormStats st, CBuf wq, CBuf bq, CBuf wk, CBuf bk, Buf scratch,
                     const QKVLayout& l, int64_t N) const {
  if (!on) return;
  const int64_t W = l.width(), q = l.H * l.D, k = l.KV * l.D;
  ops.copy_rows(keep, q, qkv, W, N, q);
  ops.copy_rows(keep + N * q, k, qkv + q, W, N, k);
  norm.forward(ops, scratch, st, keep, wq, bq, N * l.H, l.D);
  ops.copy_rows(qkv, W, scratch, q, N, q);
  norm.forward(ops, scratch, offset_stats(st, N * l.H), keep + N * q, wk, bk, N * l.KV, l.D);
  ops.copy_rows(qkv + q, W, scratch, k, N, k);
}

void QKNorm::backward(Ops& ops, Buf dqkv, Buf dwq, Buf dbq, Buf dwk, Buf dbk, CBuf keep, CBuf wq, CBuf wk,
                      NormStats st, Buf dout, Buf din, const QKVLayout& l, int64_t N) const {
  if (!on) return;
  const int64_t W = l.width(), q = l.H * l.D, k = l.KV * l.D;
  ops.copy_rows(dout, q, dqkv, W, N, q);
  ops.zero(din, N * q);
  norm.backward(ops, din, dwq, dbq, dout, keep, wq, st, N * l.H, l.D);
  ops.copy_rows(dqkv, W, din, q, N, q);
  ops.copy_rows(dout, k, dqkv + q, W, N, k);
  ops.zero(din, N * k);
  norm.backward(ops, din, dwk, dbk, dout, keep + N * q, wk, offset_stats(st, N * l.H), N * l.KV, l.D);
  ops.copy_rows(dqkv + q, W, din, k, N, k);
}

void Rope::forward(Ops& ops, Buf qkv, const int32_t* positions, int64_t N, int64_t S, const QKVLayout& l) const {
  if (rot) ops.rope(qkv, inv_freq, positions, N, S, l.H, l.KV, l.D, rot, interleaved, false);
}

void Rope::backward(Ops& ops, Buf dqkv, const int32_t* positions, int64_t N, int64_t S, const QKVLayout& l) const {
  if (rot) ops.rope(dqkv, inv_freq, positions, N, S, l.H, l.KV, l.D, rot, interleaved, true);
}

bool is_gpt2_architecture(const ModelConfig& m) {
  return m.normalization == Normalization::LayerNorm && !m.swiglu &&
         m.position_embedding_type == PositionEmbedding::LearnedAbsolute && !m.group_query_attention &&
         !m.untie_embeddings_and_output_weights && m.add_bias_linear && !m.qk_layernorm &&
         (m.kv_channels == 0 || int64_t(m.kv_channels) * m.num_attention_heads == m.hidden_size);
}

std::string describe_architecture(const ModelConfig& m) {
  const bool gpt2 = is_gpt2_architecture(m);
  auto num = [](double x) {
    std::string t = std::to_string(x);
    t.erase(t.find_last_not_of('0') + 1);
    if (!t.empty() && t.back() == '.') t.pop_back();
    return t;
  };
  std::string s = gpt2 ? "GPT-2 (" : "LLaMA-family options (";
  s += name_of(m.normalization) + ", " + (m.swiglu ? "SwiGLU" : "GELU") + ", ";
  if (m.position_embedding_type == PositionEmbedding::Rope) {
    s += "RoPE base " + num(m.rotary_base) + " on " + std::to_string(rotary_dim(m)) + " of " +
         std::to_string(m.kv_channels) + " channels" + (m.rotary_interleaved ? " interleaved" : "") +
         (m.rope_scaling.enabled() ? " with llama3 scaling x" + num(m.rope_scaling.factor) : "");
  } else {
    s += "learned positions";
  }
  s += m.group_query_attention ? ", grouped-query attention (" + std::to_string(m.num_query_groups) + " KV groups)"
                               : ", multi-head attention";
  if (m.qk_layernorm) s += ", " + name_of(m.normalization) + " of q and k per head";
  s += m.untie_embeddings_and_output_weights ? ", untied output layer" : ", tied embeddings";
  s += m.add_bias_linear ? ", biases)" : m.add_qkv_bias ? ", QKV bias only)" : ", no biases)";
  return s;
}

std::vector<float> rope_inv_freq(const ModelConfig& m) {
  const int64_t rot = rotary_dim(m);
  std::vector<float> out(size_t(rot / 2));
  const RopeScaling& r = m.rope_scaling;
  for (int64_t j = 0; j < rot / 2; ++j) {
    double f = std::pow(m.rotary_base, -2.0 * double(j) / double(rot));
    if (r.enabled()) {  // HF's _compute_llama3_parameters
      const double old_len = double(r.original_max_position_embeddings);
      const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f /= r.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1.0 - smooth) * f / r.factor + smooth * f;
      }
    }
    out[size_t(j)] = float(f);
  }
  return out;
}

}  // namespace tpt
