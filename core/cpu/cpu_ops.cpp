// CPU backend: GEMMs through OpenBLAS sgemm, everything else as OpenMP loops that touch each
// tensor once. Accumulations over rows (LayerNorm/bias gradients, norms) use per-thread partials.
// It computes in fp32: a bf16/fp16 tensor is converted into an fp32 staging buffer where a kernel
// reads it, and a result is rounded (nearest even) into its 16-bit storage where the kernel
// stores it -- the values a GPU kernel that converts on load and store computes.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/cpu/kernels.h"
#include "core/cpu/ring_kernels.h"
#include "core/error.h"
#include "core/ops.h"

namespace tpt {
namespace {

using cpu::add_column_sums;
using cpu::load_f32;
using cpu::row_to_f32;
using cpu::store_f32;

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int threads) : threads_(std::max(1, threads)) {
    omp_set_num_threads(threads_);
    openblas_set_num_threads(threads_);
  }
  std::string name() const override { return "cpu (OpenBLAS, " + std::to_string(threads_) + " threads)"; }

  // ---- memory

  void* alloc_bytes(size_t n) override {
    size_t bytes = std::max<size_t>(64, (n + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, bytes);
    if (!p) internal_error("out of host memory allocating " + std::to_string(bytes) + " bytes");
    std::memset(p, 0, bytes);
    {
      std::lock_guard<std::mutex> lock(alloc_mutex_);
      alloc_sizes_[p] = bytes;
      ++allocator_calls_;
      allocated_ += int64_t(bytes);
      peak_ = std::max(peak_, allocated_);
    }
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lock(alloc_mutex_);
      ++allocator_calls_;
      auto it = alloc_sizes_.find(p);
      if (it != alloc_sizes_.end()) {
        allocated_ -= int64_t(it->second);
        alloc_sizes_.erase(it);
      }
    }
    std::free(p);
  }
  int64_t allocated_bytes() const override {
    std::lock_guard<std::mutex> lock(alloc_mutex_);
    return allocated_;
  }
  int64_t peak_allocated_bytes() const override {
    std::lock_guard<std::mutex> lock(alloc_mutex_);
    return peak_;
  }
  int64_t allocator_calls() const override {
    std::lock_guard<std::mutex> lock(alloc_mutex_);
    return allocator_calls_;
  }
  void zero(Buf p, int64_t n) override { std::memset(p.p, 0, size_t(dtype_size(n, p.t))); }
  void copy(Buf dst, CBuf src, int64_t n) override {
    TPT_CHECK(dst.t == src.t);
    if (n > 0 && dst.p != src.p) std::memcpy(dst.p, src.p, size_t(dtype_size(n, src.t)));
  }
  void to_host(void* host, CBuf dev, int64_t n) override { copy(Buf(host, dev.t), dev, n); }
  void to_device(Buf dev, const void* host, int64_t n) override { copy(dev, CBuf(host, dev.t), n); }
  void master_copy(Buf dst, const float* master, int64_t n) override {
    if (dst.t == DType::F32) return copy(dst, CBuf(master), n);
    TPT_CHECK(dst.t == DType::BF16 || dst.t == DType::F16);
    auto* out = static_cast<uint16_t*>(dst.p);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = master_copy_bits(master[i], dst.t);
  }
  void convert(Buf dst, CBuf src, int64_t n) override {
    if (dst.t == src.t) return copy(dst, src, n);
    if (src.t == DType::F32) return store_f32(dst.p, dst.t, src.f32(), n);
    if (dst.t == DType::F32) return load_f32(dst.f32(), src.p, src.t, n);
    float* tmp = stage(0, n);  // bf16 <-> fp16 through fp32
    load_f32(tmp, src.p, src.t, n);
    store_f32(dst.p, dst.t, tmp, n);
  }

  // ---- typed kernels: stage 16-bit operands as fp32, run the fp32 kernel, round the results

  void linear_forward(Buf out, CBuf inp, CBuf w, CBuf bias, int64_t N, int64_t I, int64_t O,
                      Buf gelu_pre) override {
    linear_forward_staged(out, in(inp, N * I, 0), in(w, O * I, 1), bias, N, I, O, gelu_pre);
  }

  void linear_backward(Buf dinp, Buf dw, Buf dbias, CBuf dout, CBuf inp, CBuf w, int64_t N, int64_t I,
                       int64_t O, bool accumulate_dinp, CBuf gelu_pre) override {
    TPT_CHECK(!(gelu_pre && accumulate_dinp));
    const float* dy = in(dout, N * O, 0);
    if (dinp) input_grad_staged(dinp, dy, in(w, O * I, 2), N, I, O, accumulate_dinp, gelu_pre);
    if (dw) weight_grad(dw, dy, in(inp, N * I, 1), N, I, O);
    if (dbias) {
      float* g = grad_in(dbias, O);
      add_column_sums(g, dy, N, O);
      store(dbias, g, O);
    }
  }

  void layernorm_forward(Buf out, float* mean, float* rstd, CBuf inp, CBuf w, CBuf b, int64_t N, int64_t C,
                         float eps) override {
    float* y = out_f32(out, N * C, 0);
    cpu::layernorm_forward(y, mean, rstd, in(inp, N * C, 1), in(w, C, 2), in(b, C, 3), N, C, eps);
    store(out, y, N * C);
  }
  void residual_layernorm_forward(Buf res, Buf out, float* mean, float* rstd, CBuf a, CBuf b, CBuf w, CBuf bias,
                                  int64_t N, int64_t C, float eps) override {
    const int64_t n = N * C;
    float* r = out_f32(res, n, 0);
    add_f32(r, in(a, n, 1), in(b, n, 2), n);
    store(res, r, n);
    const float* stored = in(res, n, 1);  // LayerNorm reads the residual as stored (rounded)
    float* y = out_f32(out, n, 2);
    cpu::layernorm_forward(y, mean, rstd, stored, in(w, C, 3), in(bias, C, 4), N, C, eps);
    store(out, y, n);
  }
  void layernorm_backward(Buf dinp, Buf dw, Buf db, CBuf dout, CBuf inp, CBuf w, const float* mean,
                          const float* rstd, int64_t N, int64_t C) override {
    float* dx = load(dinp, N * C, 0);
    float *gw = grad_in(dw, C), *gb = grad_in(db, C, 1);
    cpu::layernorm_backward(dx, gw, gb, in(dout, N * C, 1), in(inp, N * C, 2), in(w, C, 3), mean, rstd, N, C,
                            threads_);
    store(dinp, dx, N * C);
    store(dw, gw, C);
    store(db, gb, C);
  }

  void rmsnorm_forward(Buf out, float* rstd, CBuf inp, CBuf w, int64_t N, int64_t C, float eps) override {
    float* y = out_f32(out, N * C, 0);
    cpu::rmsnorm_forward(y, rstd, in(inp, N * C, 1), in(w, C, 2), N, C, eps, threads_);
    store(out, y, N * C);
  }
  void residual_rmsnorm_forward(Buf res, Buf out, float* rstd, CBuf a, CBuf b, CBuf w, int64_t N, int64_t C,
                                float eps) override {
    const int64_t n = N * C;
    float* r = out_f32(res, n, 0);
    add_f32(r, in(a, n, 1), in(b, n, 2), n);
    store(res, r, n);
    const float* stored = in(res, n, 1);  // RMSNorm reads the residual as stored (rounded)
    float* y = out_f32(out, n, 2);
    cpu::rmsnorm_forward(y, rstd, stored, in(w, C, 3), N, C, eps, threads_);
    store(out, y, n);
  }
  void rmsnorm_backward(Buf dinp, Buf dw, CBuf dout, CBuf inp, CBuf w, const float* rstd, int64_t N,
                        int64_t C) override {
    float *dx = load(dinp, N * C, 0), *gw = grad_in(dw, C);
    cpu::rmsnorm_backward(dx, gw, in(dout, N * C, 1), in(inp, N * C, 2), in(w, C, 3), rstd, N, C, threads_);
    store(dinp, dx, N * C);
    store(dw, gw, C);
  }

  void attention_forward(Buf out, float* lse, CBuf qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                         int64_t D) override {
    float* y = out_f32(out, B * T * H * D, 0);
    attention_forward_f32(y, lse, in(qkv, B * T * (H + 2 * KV) * D, 1), B, T, H, KV, D);
    store(out, y, B * T * H * D);
  }
  void attention_backward(Buf dqkv, float* scratch, CBuf dout, CBuf qkv, CBuf, const float* lse, int64_t B,
                          int64_t T, int64_t H, int64_t KV, int64_t D) override {
    const int64_t n = B * T * (H + 2 * KV) * D;
    float* dx = out_f32(dqkv, n, 0);
    attention_backward_f32(dx, scratch, in(dout, B * T * H * D, 1), in(qkv, n, 2), nullptr, lse, B, T, H, KV, D);
    store(dqkv, dx, n);
  }
  void attention_block_forward(float* out, float* lse, CBuf qkv, CBuf kv, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t D, const RingBlock& blk) override {
    cpu::ring_block_forward(out, lse, in(qkv, B * T * (H + 2 * KV) * D, 0), in(kv, B * T * 2 * KV * D, 1), B, T, H,
                            KV, D, blk);
  }
  void attention_block_backward(float* dq, float* dkv, CBuf dout, CBuf out, const float* lse, CBuf qkv, CBuf kv,
                                int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, const RingBlock& blk) override {
    const int64_t n = B * T * H * D;
    cpu::ring_block_backward(dq, dkv, in(dout, n, 0), in(out, n, 1), lse, in(qkv, B * T * (H + 2 * KV) * D, 2),
                             in(kv, B * T * 2 * KV * D, 3), B, T, H, KV, D, blk);
  }
  void qkv_regroup(Buf out, CBuf inp, int64_t N, int64_t G, int64_t Q, int64_t D, bool to_heads) override {
    const int64_t n = N * G * (Q + 2) * D;
    float* y = out_f32(out, n, 0);
    cpu::qkv_regroup(y, in(inp, n, 1), N, G, Q, D, to_heads);
    store(out, y, n);
  }
  void rope(Buf qkv, const float* inv_freq, const int32_t* positions, int64_t N, int64_t S, int64_t H, int64_t KV,
            int64_t D, int64_t rot, bool interleaved, bool inverse) override {
    const int64_t n = N * (H + 2 * KV) * D;
    float* x = load(qkv, n, 0);
    cpu::rope(x, inv_freq, positions, N, S, H, KV, D, rot, interleaved, inverse);
    store(qkv, x, n);
  }
  void swiglu_forward(Buf out, CBuf inp, int64_t N, int64_t F) override {
    float* y = out_f32(out, N * F, 0);
    cpu::swiglu_forward(y, in(inp, 2 * N * F, 1), N, F);
    store(out, y, N * F);
  }
  void swiglu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t N, int64_t F) override {
    float* dx = out_f32(dinp, 2 * N * F, 0);
    cpu::swiglu_backward(dx, in(dout, N * F, 1), in(inp, 2 * N * F, 2), N, F);
    store(dinp, dx, 2 * N * F);
  }

  void gelu_forward(Buf out, CBuf inp, int64_t n) override {
    float* y = out_f32(out, n, 0);
    gelu_forward_f32(y, in(inp, n, 1), n);
    store(out, y, n);
  }
  void gelu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t n) override {
    const float* dy = in(dout, n, 1);
    const float* x = in(inp, n, 2);
    float* dx = out_f32(dinp, n, 0);
    gelu_backward_f32(dx, dy, x, n);
    store(dinp, dx, n);
  }
  void add(Buf out, CBuf a, CBuf b, int64_t n) override {
    const float* af = in(a, n, 1);
    const float* bf = in(b, n, 2);
    float* y = out_f32(out, n, 0);
    add_f32(y, af, bf, n);
    store(out, y, n);
  }
  void accumulate(Buf y, CBuf x, int64_t n) override {
    float* yf = load(y, n, 0);
    accumulate_f32(yf, in(x, n, 1), n);
    store(y, yf, n);
  }
  void sum_parts(Buf out, CBuf parts, int k, int64_t n) override {
    float* y = out_f32(out, n, 0);
    load_f32(y, parts.p, parts.t, n);
    for (int r = 1; r < k; ++r) accumulate_f32(y, in(parts + int64_t(r) * n, n, 1), n);
    store(out, y, n);
  }
  void scale(Buf x, float s, int64_t n) override {
    float* f = load(x, n, 0);
    scale_f32(f, s, n);
    store(x, f, n);
  }
  void fp8_quantize(uint8_t* out, CBuf inp, int64_t n, Fp8Type t, const float* scale, float* amax) override {
    cpu::fp8_quantize(out, nullptr, in(inp, n, 0), 1, n, t, out ? *scale : 1.0f, amax);
  }
  void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, CBuf inp, int64_t rows, int64_t cols, Fp8Type t,
                          const float* scale, float* amax) override {
    cpu::fp8_quantize(out, out_t, in(inp, rows * cols, 0), rows, cols, t, out || out_t ? *scale : 1.0f, amax);
  }
  void fp8_current_scales(float* scale, float* scale_inv, const float* amax, const Fp8Type* t, int n,
                          int margin) override {
    TPT_CHECK(n >= 0 && n <= kFp8MaxScales);
    for (int i = 0; i < n; ++i) scale[i] = fp8_scale_from_amax(amax[i], 1.0f, t[i], margin), scale_inv[i] = 1.0f / scale[i];
  }
  void fp8_transpose(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
  void fp8_block_amax(float* amax, CBuf inp, int64_t at, int64_t n, int64_t cols, int64_t br, int64_t bc) override {
    const float* x = in(inp, n, 0);
    const int64_t gc = (cols + bc - 1) / bc;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = at + i, b = e / cols / br * gc + e % cols / bc;
      amax[b] = fp8_amax_step(amax[b], x[i]);
    }
  }
  void fp8_quantize_given_blocks(uint8_t* out, CBuf inp, int64_t at, int64_t n, int64_t cols, int64_t br, int64_t bc,
                                 Fp8Type t, const float* scale_inv) override {
    const float* x = in(inp, n, 0);
    const int64_t gc = (cols + bc - 1) / bc;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = at + i;
      out[i] = fp32_to_fp8(x[i] * (1.0f / scale_inv[e / cols / br * gc + e % cols / bc]), t);
    }
  }
  void fp8_quantize_blocks(uint8_t* out, CBuf inp, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Type t,
                           int margin, float* scale_inv, bool transposed) override {
    cpu::fp8_quantize_blocks(out, in(inp, rows * cols, 0), rows, cols, br, bc, t, margin, scale_inv, transposed);
  }

  // FP8 GEMMs, emulated exactly: the operands decoded (a table of the 256 codes) and multiplied by their
  // scale_inv in fp32, then linear_forward / linear_backward's fp32 GEMMs and roundings.
  void fp8_linear_forward(Buf out, Fp8Operand inp, Fp8Operand w, CBuf bias, int64_t N, int64_t I, int64_t O,
                          Buf gelu_pre) override {
    linear_forward_staged(out, dequantize(inp, N * I, 0), dequantize(w, O * I, 1), bias, N, I, O, gelu_pre);
  }

  void fp8_linear_backward(Buf dinp, Buf dw, Fp8Operand dout, Fp8Operand inp, Fp8Operand w, int64_t N, int64_t I,
                           int64_t O, bool accumulate_dinp, CBuf gelu_pre) override {
    TPT_CHECK(!(gelu_pre && accumulate_dinp));
    // each GEMM reads the layout the GPU's does: the input gradient dout's codes and w's transposed ones,
    // the weight gradient dout's and inp's transposed ones -- each where given
    if (dinp)
      input_grad_staged(dinp, dequantize(dout, N * O, 0), dequantize(row_major(w, O, I, 0), O * I, 2), N, I, O,
                        accumulate_dinp, gelu_pre);
    if (dw)
      weight_grad(dw, dequantize(row_major(dout, N, O, 0), N * O, 0), dequantize(row_major(inp, N, I, 1), N * I, 1),
                  N, I, O);
  }

  void gather_rows(Buf out, CBuf inp, const int32_t* idx, const float* scale, int64_t R, int64_t C) override {
    int64_t rows = 0;  // the input rows read: up to the largest index
    for (int64_t r = 0; r < R; ++r) rows = std::max<int64_t>(rows, int64_t(idx[r]) + 1);
    const float* x = in(inp, rows * C, 1);
    float* y = out_f32(out, R * C, 0);
    cpu::gather_rows(y, x, idx, scale, R, C);
    store(out, y, R * C);
  }
  void combine_rows(Buf out, CBuf inp, const int32_t* idx, const float* w, int64_t N, int64_t K, int64_t C,
                    bool accumulate) override {
    int64_t rows = 0;
    for (int64_t i = 0; i < N * K; ++i) rows = std::max<int64_t>(rows, int64_t(idx[i]) + 1);
    const float* x = in(inp, rows * C, 1);
    float* y = accumulate ? load(out, N * C, 0) : out_f32(out, N * C, 0);
    cpu::combine_rows(y, x, idx, w, N, K, C, accumulate);
    store(out, y, N * C);
  }
  void row_dots(float* out, CBuf a, CBuf b, const int32_t* idx, int64_t N, int64_t K, int64_t C) override {
    int64_t rows = 0;
    for (int64_t i = 0; i < N * K; ++i) rows = std::max<int64_t>(rows, int64_t(idx[i]) + 1);
    cpu::row_dots(out, in(a, N * C, 0), in(b, rows * C, 1), idx, N, K, C);
  }

  void embedding_forward(Buf out, const int32_t* tokens, CBuf wte, int64_t N, int64_t C, int64_t v0,
                         int64_t rows) override {
    TPT_CHECK(out.t == wte.t);  // rows are copied as stored
    const size_t row = size_t(dtype_size(C, out.t));
    char* o = static_cast<char*>(out.p);
    const char* wp = static_cast<const char*>(wte.p);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      int64_t r = int64_t(tokens[n]) - v0;
      if (r >= 0 && r < rows) std::memcpy(o + n * row, wp + r * row, row);
      else std::memset(o + n * row, 0, row);
    }
  }
  void embedding_backward(Buf dwte, const int32_t* tokens, CBuf dout, int64_t N, int64_t C, int64_t v0,
                          int64_t rows) override {
    float* g = grad_in(dwte, rows * C);
    embedding_backward_f32(g, tokens, in(dout, N * C, 0), N, C, v0, rows);
    store(dwte, g, rows * C);
  }
  void add_position_embedding(Buf out, CBuf wpe, int64_t B, int64_t T, int64_t C) override {
    float* y = load(out, B * T * C, 0);
    add_position_embedding_f32(y, in(wpe, T * C, 1), B, T, C);
    store(out, y, B * T * C);
  }
  void position_embedding_backward(Buf dwpe, CBuf dout, int64_t B, int64_t T, int64_t C) override {
    float* g = grad_in(dwpe, T * C);
    position_embedding_backward_f32(g, in(dout, B * T * C, 0), B, T, C);
    store(dwpe, g, T * C);
  }
  void bias_backward(Buf dbias, CBuf dout, int64_t N, int64_t C) override {
    position_embedding_backward(dbias, dout, N, 1, C);
  }

  // ---- cross-entropy: row by row, each row converted into a buffer of its thread

  void xent_local_max(float* row_max, float* target_logit, CBuf logits, const int32_t* targets, int64_t N,
                      int64_t Vl, int64_t v0, int64_t valid_vocab) override {
    const int64_t nvalid = std::clamp<int64_t>(valid_vocab - v0, 0, Vl);
#pragma omp parallel
    {
      std::vector<float> row(size_t(std::max<int64_t>(nvalid, 1)));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        float* l = row.data();
        row_to_f32(l, logits.p, logits.t, n * Vl, nvalid);
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < nvalid; ++j) mx = std::max(mx, l[j]);
        row_max[n] = mx;
        int64_t j = int64_t(targets[n]) - v0;
        target_logit[n] = (j >= 0 && j < nvalid) ? l[j] : 0.0f;
      }
    }
  }
  void xent_local_sumexp(float* sum_exp, CBuf logits, const float* row_max, int64_t N, int64_t Vl, int64_t v0,
                         int64_t valid_vocab) override {
    const int64_t nvalid = std::clamp<int64_t>(valid_vocab - v0, 0, Vl);
#pragma omp parallel
    {
      std::vector<float> row(size_t(std::max<int64_t>(nvalid, 1)));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        float* l = row.data();
        row_to_f32(l, logits.p, logits.t, n * Vl, nvalid);
        const float mx = row_max[n];
        double s = 0;  // fp32 partial sums over 50k exps would be off by ~1e-4 relative
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < nvalid; ++j) s += double(fast_exp(l[j] - mx));
        sum_exp[n] = float(s);
      }
    }
  }
  void xent_loss_grad(Buf logits, float* losses, const float* row_max, const float* sum_exp,
                      const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                      int64_t valid_vocab, float dloss_scale_all, bool want_grad,
                      const float* row_weight) override {
    const int64_t nvalid = std::clamp<int64_t>(valid_vocab - v0, 0, Vl);
#pragma omp parallel
    {
      std::vector<float> row(size_t(std::max<int64_t>(Vl, 1)));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const float mx = row_max[n], se = sum_exp[n];
        const float w = row_weight ? row_weight[n] : 1.0f;
        const float dloss_scale = dloss_scale_all * w;
        losses[n] = w == 0.0f ? 0.0f : w * (std::log(se) + mx - target_logit[n]);
        if (!want_grad) continue;
        float* l = row.data();
        row_to_f32(l, logits.p, logits.t, n * Vl, nvalid);
        const float inv = dloss_scale / se;
#pragma omp simd
        for (int64_t j = 0; j < nvalid; ++j) l[j] = fast_exp(l[j] - mx) * inv;
        for (int64_t j = nvalid; j < Vl; ++j) l[j] = 0.0f;
        int64_t t = int64_t(targets[n]) - v0;
        if (t >= 0 && t < nvalid) l[t] -= dloss_scale;
        if (logits.t == DType::F32) std::memcpy(logits.f32() + n * Vl, l, size_t(Vl) * sizeof(float));
        else if (logits.t == DType::BF16)
          for (int64_t j = 0; j < Vl; ++j) static_cast<uint16_t*>(logits.p)[n * Vl + j] = fp32_to_bf16(l[j]);
        else
          for (int64_t j = 0; j < Vl; ++j) static_cast<uint16_t*>(logits.p)[n * Vl + j] = fp32_to_fp16(l[j]);
      }
    }
  }

  // ---- norms, optimizer

  bool has_nonfinite(CBuf g, int64_t n) override {
    const float* x = in(g, n, 0);
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
    for (int64_t i = 0; i < n; ++i) bad |= !std::isfinite(x[i]);
    return bad != 0;
  }
  double sum_squares(CBuf g, int64_t n) override {
    const float* x = in(g, n, 0);
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
    return s;
  }
  void adamw(float* p, CBuf grads, float* m, float* v, int64_t n, const AdamWParams& a, bool decay,
             Buf compute, float grad_scale) override {
    const float* g = in(grads, n, 0);
    const DType t = compute.t;
    float* c32 = compute.f32();
    uint16_t* c16 = static_cast<uint16_t*>(compute.p);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      adamw_update(p[i], g[i] * grad_scale, m[i], v[i], a, decay);  // g * 1 is g: no clip, no change
      if (!compute) continue;
      if (t == DType::F32) c32[i] = p[i];
      else c16[i] = master_copy_bits(p[i], t);
    }
  }
  void adamw_segments(const AdamWBuffers& b, const std::vector<TensorSegment>& segments, const AdamWParams& a,
                      float grad_scale) override {
    if (!b.remainders && !b.scaled() && b.m.t == DType::F32 && b.v.t == DType::F32)
      return Ops::adamw_segments(b, segments, a, grad_scale);
    if (b.scaled()) std::fill(b.amax, b.amax + 3 * b.tensors, 0.0f);
    adamw_pass(b, segments, a, grad_scale, nullptr);
  }
  void adamw_store_scaled(const AdamWBuffers& b, const std::vector<TensorSegment>& segments, const AdamWParams& a,
                          float grad_scale, const float* new_scales) override {
    TPT_CHECK(b.scaled() && new_scales);
    adamw_pass(b, segments, a, grad_scale, new_scales);
  }

 private:
  // One pass of the optimizer step over 16-bit states or remainders (Ops::adamw_segments,
  // adamw_store_scaled; core/math.h adamw_state_step).
  void adamw_pass(const AdamWBuffers& b, const std::vector<TensorSegment>& segments, const AdamWParams& a,
                  float grad_scale, const float* new_scales) {
    TPT_CHECK(!b.remainders || (b.compute.t == DType::BF16 && !b.master));
    TPT_CHECK(b.master.t != DType::BF16 && (!b.scaled() || (b.scales && b.amax)));
    const AdamWStates st{b.master.p, b.master.t, b.m.p, b.v.p, b.m.t, b.v.t, b.compute.p, b.compute.t,
                         b.remainders, b.scaled() ? b.scales : nullptr, new_scales};
    for (const TensorSegment& t : segments) {
      const int64_t at = b.master_sharded ? t.local : t.offset;
      const float* g = in(b.grads + t.offset, t.n, 0);
      float am = 0.0f, av = 0.0f, ap = 0.0f;
#pragma omp parallel for schedule(static) reduction(max : am, av, ap)
      for (int64_t i = 0; i < t.n; ++i)
        adamw_state_step(st, a, g[i] * grad_scale, t.flag, at + i, t.local + i, t.offset + i, t.tensor, am, av, ap);
      if (new_scales || !b.scaled()) continue;
      float* x = b.amax + 3 * t.tensor;
      x[0] = std::max(x[0], am);
      x[1] = std::max(x[1], av);
      x[2] = std::max(x[2], ap);
    }
  }

  // ---- fp32 staging: a few grow-only buffers, reused by every call (slot k: a kernel's k-th operand)
  float* stage(int slot, int64_t n) {
    auto& s = staging_[size_t(slot)];
    if (s.n < n) {
      s.data.reset(new float[size_t(std::max<int64_t>(n, 1))]);
      s.n = n;
    }
    return s.data.get();
  }
  // x as fp32 for reading: itself, or its conversion in staging slot `slot`
  const float* in(CBuf x, int64_t n, int slot) {
    if (x.t == DType::F32) return x.f32();
    float* s = stage(slot, n);
    load_f32(s, x.p, x.t, n);
    return s;
  }
  // an FP8 operand's n values as fp32 in staging slot `slot`: fp8_to_fp32(code) * scale_inv
  // An operand (rows, cols) of a GEMM that reads it transposed, as the GPU reads it: from its transposed
  // codes where given (transposed back into buffer k here, so that the emulation checks them), else
  // its codes.
  Fp8Operand row_major(Fp8Operand x, int64_t rows, int64_t cols, int k) {
    if (!x.t_codes) return x;
    codes_[k].resize(size_t(rows * cols));
    fp8_transpose(codes_[k].data(), x.t_codes, cols, rows);
    x.codes = codes_[k].data();
    return x;
  }
  std::vector<uint8_t> codes_[2];
  const float* dequantize(const Fp8Operand& x, int64_t n, int slot) {
    float* f = stage(slot, n);
    cpu::fp8_dequantize(f, x, n);
    return f;
  }
  // where a kernel writes y's fp32 result: y itself, or staging that store() then rounds into y
  float* out_f32(Buf y, int64_t n, int slot) { return y.t == DType::F32 ? y.f32() : stage(slot, n); }
  // the same for read-modify-write results (+=): staging starts as y's values
  float* load(Buf y, int64_t n, int slot) {
    if (y.t == DType::F32) return y.f32();
    float* s = stage(slot, n);
    load_f32(s, y.p, y.t, n);
    return s;
  }
  void store(Buf y, const float* f, int64_t n) {
    if (y && y.t != DType::F32) store_f32(y.p, y.t, f, n);
  }
  // a weight gradient (fp32, or bf16: parallel.grad_reduce_in_bf16) for a "+=": itself, or its values
  // in a gradient slot of the staging (5, 6), which store() rounds back once; null stays null
  float* grad_in(Buf g, int64_t n, int k = 0) { return g ? load(g, n, 5 + k) : nullptr; }
  // dw (O, I) += dy^T (O, N) @ x (N, I), accumulated in fp32 and stored once
  void weight_grad(Buf dw, const float* dy, const float* x, int64_t N, int64_t I, int64_t O) {
    float* g = grad_in(dw, O * I);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, N, 1.0f, dy, O, x, I, 1.0f, g, I);
    store(dw, g, O * I);
  }

  // The GEMMs on fp32 operands x (staging slot 0 or the caller's) and w (slot 1), as linear_forward:
  // out = x @ w^T + bias (slot 2), with GELU's epilogue (slots 3, 4), each result rounded once.
  void linear_forward_staged(Buf out, const float* x, const float* wf, CBuf bias, int64_t N, int64_t I, int64_t O,
                             Buf gelu_pre) {
    const float* bf = bias ? in(bias, O, 2) : nullptr;
    if (!gelu_pre) {
      float* y = out_f32(out, N * O, 3);
      linear_forward_f32(y, x, wf, bf, N, I, O);
      store(out, y, N * O);
      return;
    }
    float* pre = out_f32(gelu_pre, N * O, 3);  // the fp32 pre-activation: GELU reads it before it is rounded
    linear_forward_f32(pre, x, wf, bf, N, I, O);
    float* y = out_f32(out, N * O, 4);
    gelu_forward_f32(y, pre, N * O);
    store(gelu_pre, pre, N * O);
    store(out, y, N * O);
  }
  // dinp (N, I) = / += dy @ w (fp32 operands; dinp in slot 3, gelu_pre in slot 4), times gelu'(gelu_pre)
  void input_grad_staged(Buf dinp, const float* dy, const float* wf, int64_t N, int64_t I, int64_t O,
                         bool accumulate_dinp, CBuf gelu_pre) {
    float* dx = accumulate_dinp ? load(dinp, N * I, 3) : out_f32(dinp, N * I, 3);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, I, O, 1.0f, dy, O, wf, I, accumulate_dinp ? 1.0f : 0.0f,
                dx, I);
    if (gelu_pre) {
      const float* pre = in(gelu_pre, N * I, 4);
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < N * I; ++i) dx[i] *= gelu_grad(pre[i]);
    }
    store(dinp, dx, N * I);
  }

  // ---- the fp32 kernels
  void linear_forward_f32(float* out, const float* inp, const float* w, const float* bias, int64_t N,
                      int64_t I, int64_t O) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * O, bias, O * sizeof(float));
      beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, O, I, 1.0f, inp, I, w, I, beta, out, O);
  }

  // A query row at a time: its scores live in a row buffer of this thread, never a T x T matrix.
  // Grouped-query attention reads query head h's key and value in kv head h / (H / KV): offsets
  // H D + kv D and (H + KV) D + kv D of a token's row.
  void attention_forward_f32(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                         int64_t KV, int64_t D) {
    const float scale = 1.0f / std::sqrt(float(D));
    const int64_t row = (H + 2 * KV) * D;  // stride between tokens in qkv
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t koff = H * D + (h / (H / KV)) * D, voff = koff + KV * D;
        const float* base = qkv + b * T * row;
        std::vector<float> p(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
          const float* q = base + t * row + h * D;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t s = 0; s <= t; ++s) {
            const float* k = base + s * row + koff;
            float dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
            p[size_t(s)] = dot * scale;
            mx = std::max(mx, p[size_t(s)]);
          }
          float sum = 0;
          for (int64_t s = 0; s <= t; ++s) {
            p[size_t(s)] = fast_exp(p[size_t(s)] - mx);
            sum += p[size_t(s)];
          }
          lse[(b * H + h) * T + t] = mx + std::log(sum);
          const float inv = 1.0f / sum;
          float* o = out + (b * T + t) * H * D + h * D;
          for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
          for (int64_t s = 0; s <= t; ++s) {
            const float* v = base + s * row + voff;
            const float ps = p[size_t(s)] * inv;
            for (int64_t d = 0; d < D; ++d) o[d] += ps * v[d];
          }
        }
      }
  }

  // Rebuilds each query row's probabilities from its scores and lse (in a row buffer); the softmax
  // backward's sum(p * dp) comes from the rebuilt row, so `out` and the scratch are not needed here.
  // Parallel over (sequence, kv head): the query heads of a group run in turn, so that their key and
  // value gradients add into the group's dk, dv without a race (and in a fixed order).
  void attention_backward_f32(float* dqkv, float*, const float* dout, const float* qkv, const float*,
                          const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
    const float scale = 1.0f / std::sqrt(float(D));
    const int64_t row = (H + 2 * KV) * D, Q = H / KV;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < KV; ++g) {
        const int64_t koff = H * D + g * D, voff = koff + KV * D;
        const float* base = qkv + b * T * row;
        float* dbase = dqkv + b * T * row;
        for (int64_t t = 0; t < T; ++t) {  // zero this group's slices of dq, dk, dv
          std::memset(dbase + t * row + g * Q * D, 0, size_t(Q * D) * sizeof(float));
          std::memset(dbase + t * row + koff, 0, size_t(D) * sizeof(float));
          std::memset(dbase + t * row + voff, 0, size_t(D) * sizeof(float));
        }
        std::vector<float> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
        for (int64_t h = g * Q; h < (g + 1) * Q; ++h)
          for (int64_t t = 0; t < T; ++t) {
            const float* q = base + t * row + h * D;
            const float* dy = dout + (b * T + t) * H * D + h * D;
            const float lse_t = lse[(b * H + h) * T + t];
            // the probabilities, renormalised so that they sum to one as in forward (then the scores'
            // gradients of a row sum to ~0 and the key bias, whose exact gradient is 0, stays put)
            float sum = 0;
            for (int64_t s = 0; s <= t; ++s) {
              const float* k = base + s * row + koff;
              float dot = 0;
#pragma omp simd reduction(+ : dot)
              for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
              p[size_t(s)] = fast_exp(dot * scale - lse_t);
              sum += p[size_t(s)];
            }
            const float inv = 1.0f / sum;
            // dprobs and dv
            float dot_pdp = 0;
            for (int64_t s = 0; s <= t; ++s) {
              const float* v = base + s * row + voff;
              float* dv = dbase + s * row + voff;
              float d_ps = 0;
              const float ps = p[size_t(s)] * inv;
#pragma omp simd reduction(+ : d_ps)
              for (int64_t d = 0; d < D; ++d) {
                d_ps += dy[d] * v[d];
                dv[d] += ps * dy[d];
              }
              p[size_t(s)] = ps;
              dp[size_t(s)] = d_ps;
              dot_pdp += ps * d_ps;
            }
            // softmax backward, then the scores' gradient into dq, dk
            float* dq = dbase + t * row + h * D;
            for (int64_t s = 0; s <= t; ++s) {
              const float ds = p[size_t(s)] * (dp[size_t(s)] - dot_pdp) * scale;
              const float* k = base + s * row + koff;
              float* dk = dbase + s * row + koff;
              for (int64_t d = 0; d < D; ++d) {
                dq[d] += ds * k[d];
                dk[d] += ds * q[d];
              }
            }
          }
      }
  }

  void gelu_forward_f32(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = gelu(inp[i]);
  }
  void gelu_backward_f32(float* dinp, const float* dout, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dinp[i] = dout[i] * gelu_grad(inp[i]);
  }
  void add_f32(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }
  void accumulate_f32(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }
  void scale_f32(float* x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
  }

  void embedding_forward_f32(float* out, const int32_t* tokens, const float* wte, int64_t N, int64_t C,
                         int64_t v0, int64_t rows) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      int64_t r = int64_t(tokens[n]) - v0;
      if (r >= 0 && r < rows) std::memcpy(out + n * C, wte + r * C, C * sizeof(float));
      else std::memset(out + n * C, 0, C * sizeof(float));
    }
  }
  void embedding_backward_f32(float* dwte, const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                          int64_t v0, int64_t rows) {
    // Parallel over feature columns so that repeated tokens never race.
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
      int64_t c1 = std::min(C, c0 + 64);
      for (int64_t n = 0; n < N; ++n) {
        int64_t r = int64_t(tokens[n]) - v0;
        if (r < 0 || r >= rows) continue;
        for (int64_t c = c0; c < c1; ++c) dwte[r * C + c] += dout[n * C + c];
      }
    }
  }
  void add_position_embedding_f32(float* out, const float* wpe, int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        float* o = out + (b * T + t) * C;
        const float* p = wpe + t * C;
        for (int64_t c = 0; c < C; ++c) o[c] += p[c];
      }
  }
  void position_embedding_backward_f32(float* dwpe, const float* dout, int64_t B, int64_t T,
                                   int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < B; ++b) {
        const float* d = dout + (b * T + t) * C;
        float* g = dwpe + t * C;
        for (int64_t c = 0; c < C; ++c) g[c] += d[c];
      }
  }


  int threads_;
  struct Staging {
    std::unique_ptr<float[]> data;
    int64_t n = 0;
  };
  Staging staging_[7];
  // allocation accounting: bytes of each live allocation (as rounded by alloc)
  mutable std::mutex alloc_mutex_;
  std::unordered_map<const void*, size_t> alloc_sizes_;
  int64_t allocated_ = 0, peak_ = 0, allocator_calls_ = 0;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(int threads) { return std::make_unique<CpuOps>(threads); }

}  // namespace tpt
