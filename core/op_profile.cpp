#include "core/op_profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/error.h"

namespace tpt {

// ---- the Ops base class's marks: the wall clock (the CPU backend's work is done when a call returns)

int64_t Ops::mark() {
  using clock = std::chrono::steady_clock;
  wall_marks_.push_back(std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count());
  return int64_t(wall_marks_.size()) - 1;
}

double Ops::mark_ms(int64_t id) {
  TPT_CHECK(id >= 0 && id < int64_t(wall_marks_.size()));
  return wall_marks_[size_t(id)] - wall_marks_[0];
}

void Ops::clear_marks() { wall_marks_.clear(); }

GradStats Ops::grad_stats(CBuf grads, const std::vector<TensorSegment>& segments) {
  GradStats r;
  for (const TensorSegment& t : segments) {
    if (t.flag) r.sum_squares += sum_squares(grads + t.offset, t.n);
    r.nonfinite = r.nonfinite || has_nonfinite(grads + t.offset, t.n);
  }
  return r;
}

void Ops::adamw_segments(const AdamWBuffers& b, const std::vector<TensorSegment>& segments, const AdamWParams& a,
                         float grad_scale) {
  // the backends step remainders and 16-bit states themselves (core/cpu, core/cuda)
  TPT_CHECK(!b.remainders && b.master.f32() && b.m.f32() && b.v.f32());
  for (const TensorSegment& t : segments)
    adamw(b.master.f32() + (b.master_sharded ? t.local : t.offset), b.grads + t.offset, b.m.f32() + t.local,
          b.v.f32() + t.local, t.n,
          a, t.flag, b.compute ? b.compute + t.offset : Buf{}, grad_scale);
}

void Ops::adamw_store_scaled(const AdamWBuffers&, const std::vector<TensorSegment>&, const AdamWParams&, float,
                             const float*) {
  internal_error(name() + " backend: fp16 optimizer states are not built");
}

BackendWorkspace Ops::reserve_workspace(const BackendWorkspace&, const AttentionShape&) { return {}; }

// ---- OpProfile

OpProfile::OpProfile(Ops& backend, std::function<double()> host_clock_us)
    : backend_(backend), host_clock_us_(std::move(host_clock_us)) {}

int64_t OpProfile::begin() {
  const int64_t m = backend_.mark();
  if (m == 0) anchor_us_ = host_clock_us_();
  return m;
}

void OpProfile::end(int64_t begin_mark, std::string_view name, double flops, double bytes) {
  pending_.push_back({std::string(name), begin_mark, backend_.mark(), flops, bytes});
}

std::vector<OpProfile::Timed> OpProfile::flush(bool count) {
  std::vector<Timed> out;
  out.reserve(pending_.size());
  for (const Pending& p : pending_) {
    const double t0 = backend_.mark_ms(p.m0), t1 = backend_.mark_ms(p.m1);
    out.push_back({p.name, anchor_us_ + 1000.0 * t0, anchor_us_ + 1000.0 * t1});
    if (!count) continue;
    auto it = std::find_if(totals_.begin(), totals_.end(), [&](const Total& t) { return t.name == p.name; });
    if (it == totals_.end()) it = totals_.insert(totals_.end(), Total{p.name});
    ++it->calls;
    it->ms += t1 - t0;
    it->flops += p.flops;
    it->bytes += p.bytes;
  }
  pending_.clear();
  backend_.clear_marks();
  return out;
}

void OpProfile::count_iteration(double wall_ms) {
  ++iterations_;
  wall_ms_ += wall_ms;
}

std::string OpProfile::table() const {
  if (iterations_ == 0) return "op profile: no iteration was profiled (the first one is warm-up)\n";
  std::vector<Total> rows = totals_;
  std::sort(rows.begin(), rows.end(), [](const Total& a, const Total& b) { return a.ms > b.ms; });
  double all = 0;
  for (const Total& r : rows) all += r.ms;
  const double n = double(iterations_);
  std::string s;
  char line[256];
  std::snprintf(line, sizeof(line), "%-44s %9s %10s %7s %10s %9s\n", "op", "calls/it", "ms/it", "share",
                "TFLOP/s", "GB/s");
  s += line;
  for (const Total& r : rows) {
    const double sec = r.ms / 1000.0;
    char tf[32] = "", gb[32] = "";
    if (r.flops > 0 && sec > 0) std::snprintf(tf, sizeof(tf), "%.2f", r.flops / sec / 1e12);
    if (r.bytes > 0 && sec > 0) std::snprintf(gb, sizeof(gb), "%.1f", r.bytes / sec / 1e9);
    std::snprintf(line, sizeof(line), "%-44s %9.1f %10.3f %6.1f%% %10s %9s\n", r.name.c_str(), double(r.calls) / n,
                  r.ms / n, all > 0 ? 100.0 * r.ms / all : 0.0, tf, gb);
    s += line;
  }
  std::snprintf(line, sizeof(line),
                "%-44s %9s %10.3f   (iteration wall time %.3f ms; the rest is host work, waiting and gaps)\n",
                "all ops", "", all / n, wall_ms_ / n);
  s += line;
  return s;
}

// ---- ProfiledOps: every call forwarded to the backend inside a span

namespace {

int64_t segments_numel(const std::vector<TensorSegment>& segments) {
  int64_t n = 0;
  for (const TensorSegment& t : segments) n += t.n;
  return n;
}

class ProfiledOps final : public Ops {
 public:
  ProfiledOps(Ops& inner, OpProfile& profile, LinearNamer linear_name)
      : in_(inner), prof_(profile), linear_name_(std::move(linear_name)) {}

  std::string name() const override { return in_.name(); }
  void* alloc_bytes(size_t bytes) override { return in_.alloc_bytes(bytes); }
  void free(void* p) override { in_.free(p); }
  void* alloc_host(size_t bytes) override { return in_.alloc_host(bytes); }
  void free_host(void* p) override { in_.free_host(p); }
  int64_t allocated_bytes() const override { return in_.allocated_bytes(); }
  int64_t peak_allocated_bytes() const override { return in_.peak_allocated_bytes(); }
  BackendWorkspace reserve_workspace(const BackendWorkspace& planned, const AttentionShape& attention) override {
    return in_.reserve_workspace(planned, attention);
  }
  int64_t allocator_calls() const override { return in_.allocator_calls(); }
  int64_t mark() override { return in_.mark(); }
  double mark_ms(int64_t id) override { return in_.mark_ms(id); }
  void clear_marks() override { in_.clear_marks(); }

  void zero(Buf p, int64_t n) override {
    timed("zero", 0, double(dtype_size(n, p.t)), [&] { in_.zero(p, n); });
  }
  void copy(Buf dst, CBuf src, int64_t n) override {
    timed("copy", 0, 2.0 * double(dtype_size(n, src.t)), [&] { in_.copy(dst, src, n); });
  }
  void to_host(void* host, CBuf dev, int64_t n) override {
    timed("to host", 0, double(dtype_size(n, dev.t)), [&] { in_.to_host(host, dev, n); });
  }
  void to_device(Buf dev, const void* host, int64_t n) override {
    timed("to device", 0, double(dtype_size(n, dev.t)), [&] { in_.to_device(dev, host, n); });
  }
  void master_copy(Buf dst, const float* master, int64_t n) override {
    timed("master copy", 0, double(4 * n + dtype_size(n, dst.t)), [&] { in_.master_copy(dst, master, n); });
  }
  void convert(Buf dst, CBuf src, int64_t n) override {
    timed("convert", 0, double(dtype_size(n, src.t) + dtype_size(n, dst.t)), [&] { in_.convert(dst, src, n); });
  }

  void linear_forward(Buf out, CBuf inp, CBuf w, CBuf bias, int64_t N, int64_t I, int64_t O, Buf gelu_pre) override {
    const std::string name = "linear fwd " + linear_name_(I, O) + (gelu_pre ? " +GELU" : "");
    timed(name, 2.0 * N * I * O, 0, [&] { in_.linear_forward(out, inp, w, bias, N, I, O, gelu_pre); });
  }
  void linear_backward(Buf dinp, Buf dw, Buf dbias, CBuf dout, CBuf inp, CBuf w, int64_t N, int64_t I, int64_t O,
                       bool accumulate_dinp, CBuf gelu_pre) override {
    // the split backward's halves (ZB-H1: B without dw, W without dinp) are named apart
    const std::string name = "linear bwd " + linear_name_(I, O) + (gelu_pre && dinp ? " +dGELU" : "") +
                             (!dw ? " dX" : !dinp ? " dW" : "");
    timed(name, ((dinp ? 2.0 : 0.0) + (dw ? 2.0 : 0.0)) * N * I * O, 0,
          [&] { in_.linear_backward(dinp, dw, dbias, dout, inp, w, N, I, O, accumulate_dinp, gelu_pre); });
  }

  void layernorm_forward(Buf out, float* mean, float* rstd, CBuf inp, CBuf w, CBuf b, int64_t N, int64_t C,
                         float eps) override {
    timed("layernorm fwd", 0, 2.0 * double(dtype_size(N * C, inp.t)),
          [&] { in_.layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps); });
  }
  void residual_layernorm_forward(Buf res, Buf out, float* mean, float* rstd, CBuf a, CBuf b, CBuf w, CBuf bias,
                                  int64_t N, int64_t C, float eps) override {
    timed("residual + layernorm fwd", 0, 4.0 * double(dtype_size(N * C, a.t)),
          [&] { in_.residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C, eps); });
  }
  void layernorm_backward(Buf dinp, Buf dw, Buf db, CBuf dout, CBuf inp, CBuf w, const float* mean,
                          const float* rstd, int64_t N, int64_t C) override {
    timed("layernorm bwd", 0, 4.0 * double(dtype_size(N * C, inp.t)),
          [&] { in_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); });
  }

  void rmsnorm_forward(Buf out, float* rstd, CBuf inp, CBuf w, int64_t N, int64_t C, float eps) override {
    timed("rmsnorm fwd", 0, 2.0 * double(dtype_size(N * C, inp.t)),
          [&] { in_.rmsnorm_forward(out, rstd, inp, w, N, C, eps); });
  }
  void residual_rmsnorm_forward(Buf res, Buf out, float* rstd, CBuf a, CBuf b, CBuf w, int64_t N, int64_t C,
                                float eps) override {
    timed("residual + rmsnorm fwd", 0, 4.0 * double(dtype_size(N * C, a.t)),
          [&] { in_.residual_rmsnorm_forward(res, out, rstd, a, b, w, N, C, eps); });
  }
  void rmsnorm_backward(Buf dinp, Buf dw, CBuf dout, CBuf inp, CBuf w, const float* rstd, int64_t N,
                        int64_t C) override {
    // reads dout, inp, dinp; writes dinp
    timed("rmsnorm bwd", 0, 4.0 * double(dtype_size(N * C, inp.t)),
          [&] { in_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); });
  }

  // causal: half of the 4 B H T^2 D of the two products forward (H query heads, whatever KV);
  // backward recomputes the scores and has three more products (2.5 times forward)
  void attention_forward(Buf out, float* lse, CBuf qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                         int64_t D) override {
    timed("attention fwd", 2.0 * B * H * T * T * D, 0,
          [&] { in_.attention_forward(out, lse, qkv, B, T, H, KV, D); });
  }
  void attention_backward(Buf dqkv, float* scratch, CBuf dout, CBuf qkv, CBuf out, const float* lse, int64_t B,
                          int64_t T, int64_t H, int64_t KV, int64_t D) override {
    timed("attention bwd", 5.0 * B * H * T * T * D, 0,
          [&] { in_.attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, D); });
  }  // a ring block: 2 T T D multiply-adds per head at most (a full block), half on the diagonal
  void attention_block_forward(float* out, float* lse, CBuf qkv, CBuf kv, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t D, const RingBlock& blk) override {
    timed("ring attention fwd", 2.0 * B * H * T * T * D, 0,
          [&] { in_.attention_block_forward(out, lse, qkv, kv, B, T, H, KV, D, blk); });
  }
  void attention_block_backward(float* dq, float* dkv, CBuf dout, CBuf out, const float* lse, CBuf qkv, CBuf kv,
                                int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, const RingBlock& blk) override {
    timed("ring attention bwd", 5.0 * B * H * T * T * D, 0,
          [&] { in_.attention_block_backward(dq, dkv, dout, out, lse, qkv, kv, B, T, H, KV, D, blk); });
  }
  void copy_rows(Buf dst, int64_t dst_stride, CBuf src, int64_t src_stride, int64_t rows, int64_t cols) override {
    timed("copy rows", 0, double(dtype_size(rows * cols, src.t) + dtype_size(rows * cols, dst.t)),
          [&] { in_.copy_rows(dst, dst_stride, src, src_stride, rows, cols); });
  }

  void qkv_regroup(Buf out, CBuf in, int64_t N, int64_t G, int64_t Q, int64_t D, bool to_heads) override {
    timed("qkv regroup", 0, 2.0 * double(dtype_size(N * G * (Q + 2) * D, in.t)),
          [&] { in_.qkv_regroup(out, in, N, G, Q, D, to_heads); });
  }
  // read and written in place: the rotated channels of the query and key heads
  void rope(Buf qkv, const float* inv_freq, const int32_t* positions, int64_t N, int64_t S, int64_t H, int64_t KV,
            int64_t D, int64_t rot, bool interleaved, bool inverse) override {
    timed(inverse ? "rope bwd" : "rope fwd", 0, 2.0 * double(dtype_size(N * (H + KV) * rot, qkv.t)),
          [&] { in_.rope(qkv, inv_freq, positions, N, S, H, KV, D, rot, interleaved, inverse); });
  }

  void gelu_forward(Buf out, CBuf inp, int64_t n) override {
    timed("gelu fwd", 0, 2.0 * double(dtype_size(n, inp.t)), [&] { in_.gelu_forward(out, inp, n); });
  }
  void gelu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t n) override {
    timed("gelu bwd", 0, 3.0 * double(dtype_size(n, inp.t)), [&] { in_.gelu_backward(dinp, dout, inp, n); });
  }
  // reads (N, 2F), writes (N, F); backward reads dout (N, F) and inp (N, 2F), writes (N, 2F)
  void swiglu_forward(Buf out, CBuf inp, int64_t N, int64_t F) override {
    timed("swiglu fwd", 0, 3.0 * double(dtype_size(N * F, inp.t)), [&] { in_.swiglu_forward(out, inp, N, F); });
  }
  void swiglu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t N, int64_t F) override {
    timed("swiglu bwd", 0, 5.0 * double(dtype_size(N * F, inp.t)),
          [&] { in_.swiglu_backward(dinp, dout, inp, N, F); });
  }
  void add(Buf out, CBuf a, CBuf b, int64_t n) override {
    timed("residual add", 0, 3.0 * double(dtype_size(n, a.t)), [&] { in_.add(out, a, b, n); });
  }
  void accumulate(Buf y, CBuf x, int64_t n) override {
    timed("accumulate", 0, 3.0 * double(dtype_size(n, x.t)), [&] { in_.accumulate(y, x, n); });
  }
  void sum_parts(Buf out, CBuf parts, int k, int64_t n) override {
    timed("tp sum (16-bit parts)", 0, double(k + 1) * double(dtype_size(n, parts.t)),
          [&] { in_.sum_parts(out, parts, k, n); });
  }
  void scale(Buf x, float s, int64_t n) override {
    timed("scale gradients", 0, 2.0 * double(dtype_size(n, x.t)), [&] { in_.scale(x, s, n); });
  }
  void fp8_quantize(uint8_t* out, CBuf inp, int64_t n, Fp8Type t, const float* scale, float* amax) override {
    timed(out ? "fp8 quantize" : "fp8 amax", 0, double(dtype_size(n, inp.t) + (out ? n : 0)),
          [&] { in_.fp8_quantize(out, inp, n, t, scale, amax); });
  }
  void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, CBuf inp, int64_t rows, int64_t cols, Fp8Type t,
                          const float* scale, float* amax) override {
    const int64_t n = rows * cols;
    timed("fp8 cast transpose", 0, double(dtype_size(n, inp.t) + (out ? n : 0) + (out_t ? n : 0)),
          [&] { in_.fp8_cast_transpose(out, out_t, inp, rows, cols, t, scale, amax); });
  }
  void fp8_current_scales(float* scale, float* scale_inv, const float* amax, const Fp8Type* t, int n,
                          int margin) override {
    timed("fp8 scales", 0, 12.0 * n, [&] { in_.fp8_current_scales(scale, scale_inv, amax, t, n, margin); });
  }
  void fp8_transpose(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols) override {
    timed("fp8 transpose", 0, 2.0 * double(rows * cols), [&] { in_.fp8_transpose(out, in, rows, cols); });
  }
  void fp8_block_amax(float* amax, CBuf inp, int64_t at, int64_t n, int64_t cols, int64_t br, int64_t bc) override {
    timed("fp8 block amax", 0, double(dtype_size(n, inp.t)), [&] { in_.fp8_block_amax(amax, inp, at, n, cols, br, bc); });
  }
  void fp8_quantize_given_blocks(uint8_t* out, CBuf inp, int64_t at, int64_t n, int64_t cols, int64_t br, int64_t bc,
                                 Fp8Type t, const float* scale_inv) override {
    timed("fp8 quantize given blocks", 0, double(dtype_size(n, inp.t) + n),
          [&] { in_.fp8_quantize_given_blocks(out, inp, at, n, cols, br, bc, t, scale_inv); });
  }
  void fp8_quantize_blocks(uint8_t* out, CBuf inp, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Type t,
                           int margin, float* scale_inv, bool transposed) override {
    timed("fp8 quantize blocks", 0, double(dtype_size(rows * cols, inp.t) + rows * cols),
          [&] { in_.fp8_quantize_blocks(out, inp, rows, cols, br, bc, t, margin, scale_inv, transposed); });
  }

  void fp8_linear_forward(Buf out, Fp8Operand inp, Fp8Operand w, CBuf bias, int64_t N, int64_t I, int64_t O,
                          Buf gelu_pre) override {
    timed("fp8 linear fwd " + linear_name_(I, O) + (gelu_pre ? " +GELU" : ""), 2.0 * N * I * O, 0,
          [&] { in_.fp8_linear_forward(out, inp, w, bias, N, I, O, gelu_pre); });
  }
  void fp8_linear_backward(Buf dinp, Buf dw, Fp8Operand dout, Fp8Operand inp, Fp8Operand w, int64_t N, int64_t I,
                           int64_t O, bool accumulate_dinp, CBuf gelu_pre) override {
    const std::string name = "fp8 linear bwd " + linear_name_(I, O) + (gelu_pre && dinp ? " +dGELU" : "") +
                             (!dw ? " dX" : !dinp ? " dW" : "");
    timed(name, ((dinp ? 2.0 : 0.0) + (dw ? 2.0 : 0.0)) * N * I * O, 0,
          [&] { in_.fp8_linear_backward(dinp, dw, dout, inp, w, N, I, O, accumulate_dinp, gelu_pre); });
  }

  void gather_rows(Buf out, CBuf inp, const int32_t* idx, const float* scale, int64_t R, int64_t C) override {
    timed("moe permute", 0, 2.0 * double(dtype_size(R * C, out.t)), [&] { in_.gather_rows(out, inp, idx, scale, R, C); });
  }
  void combine_rows(Buf out, CBuf inp, const int32_t* idx, const float* w, int64_t N, int64_t K, int64_t C,
                    bool accumulate) override {
    timed("moe unpermute", 0, double(K + 1 + int(accumulate)) * double(dtype_size(N * C, out.t)),
          [&] { in_.combine_rows(out, inp, idx, w, N, K, C, accumulate); });
  }
  void row_dots(float* out, CBuf a, CBuf b, const int32_t* idx, int64_t N, int64_t K, int64_t C) override {
    timed("moe probs grad", 2.0 * double(N * K * C), double(K + 1) * double(dtype_size(N * C, a.t)),
          [&] { in_.row_dots(out, a, b, idx, N, K, C); });
  }

  void embedding_forward(Buf out, const int32_t* tokens, CBuf wte, int64_t N, int64_t C, int64_t v0,
                         int64_t rows) override {
    timed("embedding fwd", 0, 2.0 * double(dtype_size(N * C, out.t)),
          [&] { in_.embedding_forward(out, tokens, wte, N, C, v0, rows); });
  }
  void embedding_backward(Buf dwte, const int32_t* tokens, CBuf dout, int64_t N, int64_t C, int64_t v0,
                          int64_t rows) override {
    timed("embedding bwd", 0, double(dtype_size(N * C, dout.t)) + 8.0 * double(N * C),
          [&] { in_.embedding_backward(dwte, tokens, dout, N, C, v0, rows); });
  }
  void add_position_embedding(Buf out, CBuf wpe, int64_t B, int64_t T, int64_t C) override {
    timed("position embedding fwd", 0, 2.0 * double(dtype_size(B * T * C, out.t)),
          [&] { in_.add_position_embedding(out, wpe, B, T, C); });
  }
  void position_embedding_backward(Buf dwpe, CBuf dout, int64_t B, int64_t T, int64_t C) override {
    timed("position embedding bwd", 0, double(dtype_size(B * T * C, dout.t)),
          [&] { in_.position_embedding_backward(dwpe, dout, B, T, C); });
  }
  void bias_backward(Buf dbias, CBuf dout, int64_t N, int64_t C) override {
    timed("bias bwd", 0, double(dtype_size(N * C, dout.t)), [&] { in_.bias_backward(dbias, dout, N, C); });
  }

  void xent_local_max(float* row_max, float* target_logit, CBuf logits, const int32_t* targets, int64_t N,
                      int64_t Vl, int64_t v0, int64_t valid_vocab) override {
    timed("cross-entropy max", 0, double(dtype_size(N * Vl, logits.t)),
          [&] { in_.xent_local_max(row_max, target_logit, logits, targets, N, Vl, v0, valid_vocab); });
  }
  void xent_local_sumexp(float* sum_exp, CBuf logits, const float* row_max, int64_t N, int64_t Vl, int64_t v0,
                         int64_t valid_vocab) override {
    timed("cross-entropy sum-exp", 0, double(dtype_size(N * Vl, logits.t)),
          [&] { in_.xent_local_sumexp(sum_exp, logits, row_max, N, Vl, v0, valid_vocab); });
  }
  void xent_loss_grad(Buf logits, float* losses, const float* row_max, const float* sum_exp,
                      const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                      int64_t valid_vocab, float dloss_scale, bool want_grad, const float* row_weight) override {
    timed(want_grad ? "cross-entropy loss + dlogits" : "cross-entropy loss", 0,
          (want_grad ? 2.0 : 0.0) * double(dtype_size(N * Vl, logits.t)), [&] {
            in_.xent_loss_grad(logits, losses, row_max, sum_exp, target_logit, targets, N, Vl, v0, valid_vocab,
                               dloss_scale, want_grad, row_weight);
          });
  }

  bool has_nonfinite(CBuf x, int64_t n) override {
    bool r = false;
    timed("nan/inf check", 0, double(dtype_size(n, x.t)), [&] { r = in_.has_nonfinite(x, n); });
    return r;
  }
  double sum_squares(CBuf x, int64_t n) override {
    double r = 0;
    timed("gradient norm", 0, double(dtype_size(n, x.t)), [&] { r = in_.sum_squares(x, n); });
    return r;
  }
  void adamw(float* p, CBuf g, float* m, float* v, int64_t n, const AdamWParams& a, bool decay,
             Buf compute, float grad_scale) override {
    // reads p, g, m, v; writes p, m, v and the compute copy
    const double bytes = 24.0 * double(n) + double(dtype_size(n, g.t)) + (compute ? double(dtype_size(n, compute.t)) : 0.0);
    timed("adamw", 0, bytes, [&] { in_.adamw(p, g, m, v, n, a, decay, compute, grad_scale); });
  }
  GradStats grad_stats(CBuf grads, const std::vector<TensorSegment>& segments) override {
    GradStats r;
    timed("gradient norm", 0, double(dtype_size(segments_numel(segments), grads.t)),
          [&] { r = in_.grad_stats(grads, segments); });
    return r;
  }
  void adamw_segments(const AdamWBuffers& b, const std::vector<TensorSegment>& segments, const AdamWParams& a,
                      float grad_scale) override {
    const double n = double(segments_numel(segments));
    // remainders: the master's 2 + 2 bytes read and written in place of 4 + 4, the compute copy read
    // too; 16-bit moments: 2 + 2 bytes each instead of 4 + 4; bf16 gradients 2 bytes instead of 4
    // fp16 master weights: 2 + 2 bytes; scaled states: the moments only read here (written by the second pass)
    const double moments = double((b.scaled() ? 1 : 2) * (dtype_size(1, b.m.t) + dtype_size(1, b.v.t))) - 16.0 +
                           double(dtype_size(1, b.grads.t)) - 4.0 +
                           (b.master.t == DType::F16 ? -4.0 : 0.0);
    const double bytes = (b.remainders ? 28.0 * n
                                       : 28.0 * n + (b.compute ? double(dtype_size(1, b.compute.t)) * n : 0.0)) +
                         moments * n;
    timed("adamw", 0, bytes, [&] { in_.adamw_segments(b, segments, a, grad_scale); });
  }
  void adamw_store_scaled(const AdamWBuffers& b, const std::vector<TensorSegment>& segments, const AdamWParams& a,
                          float grad_scale, const float* new_scales) override {
    // every state and the gradient read again, the moments (and an fp16 master with its compute copy) written
    double per = double(dtype_size(1, b.grads.t) + dtype_size(1, b.m.t) + dtype_size(1, b.v.t));
    per += b.remainders ? 4.0 : double(dtype_size(1, b.master.t));
    per += double(dtype_size(1, b.m.t) + dtype_size(1, b.v.t));  // the moments written here
    if (b.master.t == DType::F16) per += 2.0 + (b.compute ? double(dtype_size(1, b.compute.t)) : 0.0);
    timed("adamw (fp16 states)", 0, per * double(segments_numel(segments)),
          [&] { in_.adamw_store_scaled(b, segments, a, grad_scale, new_scales); });
  }

 private:
  template <class F>
  void timed(std::string_view name, double flops, double bytes, F&& f) {
    const int64_t m0 = prof_.begin();
    f();
    prof_.end(m0, name, flops, bytes);
  }
  Ops& in_;
  OpProfile& prof_;
  LinearNamer linear_name_;
};

}  // namespace

std::unique_ptr<Ops> make_profiled_ops(Ops& inner, OpProfile& profile, LinearNamer linear_name) {
  return std::make_unique<ProfiledOps>(inner, profile, std::move(linear_name));
}

}  // namespace tpt
