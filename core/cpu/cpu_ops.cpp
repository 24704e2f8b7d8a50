// CPU backend: GEMMs through OpenBLAS sgemm, everything else as OpenMP loops that touch each
// tensor once. Accumulations over rows (LayerNorm/bias gradients, norms) use per-thread partials.
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

#include "core/error.h"
#include "core/ops.h"

namespace tpt {
namespace {

// Column sums of x (N, C) added into out (C), parallel over column blocks.
void add_column_sums(float* out, const float* x, int64_t N, int64_t C) {
  constexpr int64_t kBlock = 256;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
    int64_t c1 = std::min(C, c0 + kBlock);
    float acc[kBlock] = {0};
    for (int64_t n = 0; n < N; ++n) {
      const float* row = x + n * C;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
    }
    for (int64_t c = c0; c < c1; ++c) out[c] += acc[c - c0];
  }
}

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int threads) : threads_(std::max(1, threads)) {
    omp_set_num_threads(threads_);
    openblas_set_num_threads(threads_);
  }
  std::string name() const override { return "cpu (OpenBLAS, " + std::to_string(threads_) + " threads)"; }

  float* alloc(size_t n) override {
    size_t bytes = std::max<size_t>(64, (n * sizeof(float) + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, bytes);
    if (!p) internal_error("out of host memory allocating " + std::to_string(bytes) + " bytes");
    std::memset(p, 0, bytes);
    {
      std::lock_guard<std::mutex> lock(alloc_mutex_);
      alloc_sizes_[p] = bytes;
      allocated_ += int64_t(bytes);
      peak_ = std::max(peak_, allocated_);
    }
    return static_cast<float*>(p);
  }
  void free(float* p) override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lock(alloc_mutex_);
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
  void zero(float* p, size_t n) override { std::memset(p, 0, n * sizeof(float)); }
  void copy(float* dst, const float* src, size_t n) override { std::memcpy(dst, src, n * sizeof(float)); }
  void to_host(float* host, const float* dev, size_t n) override { copy(host, dev, n); }
  void to_device(float* dev, const float* host, size_t n) override { copy(dev, host, n); }

  void linear_forward(float* out, const float* inp, const float* w, const float* bias, int64_t N,
                      int64_t I, int64_t O) override {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * O, bias, O * sizeof(float));
      beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, O, I, 1.0f, inp, I, w, I, beta, out, O);
  }

  void linear_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int64_t N, int64_t I, int64_t O, bool accumulate_dinp) override {
    if (dinp)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, I, O, 1.0f, dout, O, w, I,
                  accumulate_dinp ? 1.0f : 0.0f, dinp, I);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, N, 1.0f, dout, O, inp, I, 1.0f, dw, I);
    if (dbias) add_column_sums(dbias, dout, N, O);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int64_t N, int64_t C, float eps) override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C;
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += x[c];
      float m = float(s / C);
      double v = 0;
      for (int64_t c = 0; c < C; ++c) {
        float d = x[c] - m;
        v += double(d) * d;
      }
      float r = float(1.0 / std::sqrt(v / C + eps));
      float* y = out + n * C;
      for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * r * w[c] + b[c];
      mean[n] = m;
      rstd[n] = r;
    }
  }

  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int64_t N,
                          int64_t C) override {
    int nt = threads_;
    std::vector<float> part(size_t(nt) * 2 * C, 0.0f);
#pragma omp parallel num_threads(nt)
    {
      float* pdw = part.data() + size_t(omp_get_thread_num()) * 2 * C;
      float* pdb = pdw + C;
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const float* x = inp + n * C;
        const float* dy = dout + n * C;
        float m = mean[n], r = rstd[n];
        double sum_dn = 0, sum_dn_n = 0;
        for (int64_t c = 0; c < C; ++c) {
          float nc = (x[c] - m) * r;
          float dn = dy[c] * w[c];
          sum_dn += dn;
          sum_dn_n += double(dn) * nc;
        }
        float mean_dn = float(sum_dn / C), mean_dn_n = float(sum_dn_n / C);
        float* dx = dinp + n * C;
        for (int64_t c = 0; c < C; ++c) {
          float nc = (x[c] - m) * r;
          float dn = dy[c] * w[c];
          dx[c] += (dn - mean_dn - nc * mean_dn_n) * r;
          pdw[c] += dy[c] * nc;
          pdb[c] += dy[c];
        }
      }
    }
    for (int t = 0; t < nt; ++t) {
      const float* pdw = part.data() + size_t(t) * 2 * C;
      for (int64_t c = 0; c < C; ++c) {
        dw[c] += pdw[c];
        db[c] += pdw[C + c];
      }
    }
  }

  // A query row at a time: its scores live in a row buffer of this thread, never a T x T matrix.
  void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                         int64_t D) override {
    const float scale = 1.0f / std::sqrt(float(D));
    const int64_t row = 3 * H * D;  // stride between tokens in qkv
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const float* base = qkv + b * T * row;
        std::vector<float> p(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
          const float* q = base + t * row + h * D;
          float mx = -std::numeric_limits<float>::infinity();
          for (int64_t s = 0; s <= t; ++s) {
            const float* k = base + s * row + H * D + h * D;
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
            const float* v = base + s * row + 2 * H * D + h * D;
            const float ps = p[size_t(s)] * inv;
            for (int64_t d = 0; d < D; ++d) o[d] += ps * v[d];
          }
        }
      }
  }

  // Rebuilds each query row's probabilities from its scores and lse (in a row buffer); the softmax
  // backward's sum(p * dp) comes from the rebuilt row, so `out` and the scratch are not needed here.
  void attention_backward(float* dqkv, float*, const float* dout, const float* qkv, const float*,
                          const float* lse, int64_t B, int64_t T, int64_t H, int64_t D) override {
    const float scale = 1.0f / std::sqrt(float(D));
    const int64_t row = 3 * H * D;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const float* base = qkv + b * T * row;
        float* dbase = dqkv + b * T * row;
        for (int64_t t = 0; t < T; ++t) {  // zero this head's slice of dq, dk, dv
          for (int64_t w = 0; w < 3; ++w) std::memset(dbase + t * row + w * H * D + h * D, 0, D * sizeof(float));
        }
        std::vector<float> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
          const float* q = base + t * row + h * D;
          const float* dy = dout + (b * T + t) * H * D + h * D;
          const float lse_t = lse[(b * H + h) * T + t];
          // the probabilities, renormalised so that they sum to one as in forward (then the scores'
          // gradients of a row sum to ~0 and the key bias, whose exact gradient is 0, stays put)
          float sum = 0;
          for (int64_t s = 0; s <= t; ++s) {
            const float* k = base + s * row + H * D + h * D;
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
            const float* v = base + s * row + 2 * H * D + h * D;
            float* dv = dbase + s * row + 2 * H * D + h * D;
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
            const float* k = base + s * row + H * D + h * D;
            float* dk = dbase + s * row + H * D + h * D;
            for (int64_t d = 0; d < D; ++d) {
              dq[d] += ds * k[d];
              dk[d] += ds * q[d];
            }
          }
        }
      }
  }

  void gelu_forward(float* out, const float* inp, int64_t n) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = gelu(inp[i]);
  }
  void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dinp[i] = dout[i] * gelu_grad(inp[i]);
  }
  void add(float* out, const float* a, const float* b, int64_t n) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }
  void accumulate(float* y, const float* x, int64_t n) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }
  void scale(float* x, float s, int64_t n) override {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N, int64_t C,
                         int64_t v0, int64_t rows) override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      int64_t r = int64_t(tokens[n]) - v0;
      if (r >= 0 && r < rows) std::memcpy(out + n * C, wte + r * C, C * sizeof(float));
      else std::memset(out + n * C, 0, C * sizeof(float));
    }
  }
  void embedding_backward(float* dwte, const int32_t* tokens, const float* dout, int64_t N, int64_t C,
                          int64_t v0, int64_t rows) override {
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
  void add_position_embedding(float* out, const float* wpe, int64_t B, int64_t T, int64_t C) override {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        float* o = out + (b * T + t) * C;
        const float* p = wpe + t * C;
        for (int64_t c = 0; c < C; ++c) o[c] += p[c];
      }
  }
  void position_embedding_backward(float* dwpe, const float* dout, int64_t B, int64_t T,
                                   int64_t C) override {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < B; ++b) {
        const float* d = dout + (b * T + t) * C;
        float* g = dwpe + t * C;
        for (int64_t c = 0; c < C; ++c) g[c] += d[c];
      }
  }

  void xent_local_max(float* row_max, float* target_logit, const float* logits, const int32_t* targets,
                      int64_t N, int64_t Vl, int64_t v0, int64_t valid_vocab) override {
    int64_t nvalid = std::clamp<int64_t>(valid_vocab - v0, 0, Vl);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* l = logits + n * Vl;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < nvalid; ++j) mx = std::max(mx, l[j]);
      row_max[n] = mx;
      int64_t j = int64_t(targets[n]) - v0;
      target_logit[n] = (j >= 0 && j < nvalid) ? l[j] : 0.0f;
    }
  }
  void xent_local_sumexp(float* sum_exp, float* logits, const float* row_max, int64_t N, int64_t Vl,
                         int64_t v0, int64_t valid_vocab) override {
    int64_t nvalid = std::clamp<int64_t>(valid_vocab - v0, 0, Vl);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* l = logits + n * Vl;
      const float mx = row_max[n];
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < nvalid; ++j) {
        l[j] = fast_exp(l[j] - mx);
        s += l[j];
      }
      for (int64_t j = nvalid; j < Vl; ++j) l[j] = 0.0f;
      sum_exp[n] = s;
    }
  }
  void xent_backward_inplace(float* exps, float* losses, const float* row_max, const float* sum_exp,
                             const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl,
                             int64_t v0, int64_t valid_vocab, float dloss_scale, bool want_grad) override {
    int64_t nvalid = std::clamp<int64_t>(valid_vocab - v0, 0, Vl);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float mx = row_max[n], se = sum_exp[n];
      losses[n] = std::log(se) + mx - target_logit[n];
      if (!want_grad) continue;
      float* l = exps + n * Vl;
      const float inv = dloss_scale / se;
#pragma omp simd
      for (int64_t j = 0; j < Vl; ++j) l[j] *= inv;  // padding stays 0
      int64_t t = int64_t(targets[n]) - v0;
      if (t >= 0 && t < nvalid) l[t] -= dloss_scale;
    }
  }

  void round_to(float* x, int64_t n, DType t) override {
    if (t == DType::F32) return;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] = tpt::round_to(x[i], t);
  }
  bool has_nonfinite(const float* x, int64_t n) override {
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
    for (int64_t i = 0; i < n; ++i) bad |= !std::isfinite(x[i]);
    return bad != 0;
  }
  void pack_half(uint16_t* dst, const float* src, int64_t n, DType t) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = t == DType::BF16 ? fp32_to_bf16(src[i]) : fp32_to_fp16(src[i]);
  }
  void unpack_half(float* dst, const uint16_t* src, int64_t n, DType t) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = t == DType::BF16 ? bf16_to_fp32(src[i]) : fp16_to_fp32(src[i]);
  }

  double sum_squares(const float* x, int64_t n) override {
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
    return s;
  }
  void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a,
             bool decay, float* compute, DType t) override {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      adamw_update(p[i], g[i], m[i], v[i], a, decay);
      if (compute) compute[i] = tpt::round_to(p[i], t);
    }
  }

 private:
  int threads_;
  // allocation accounting: bytes of each live allocation (as rounded by alloc)
  mutable std::mutex alloc_mutex_;
  std::unordered_map<const void*, size_t> alloc_sizes_;
  int64_t allocated_ = 0, peak_ = 0;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(int threads) { return std::make_unique<CpuOps>(threads); }

}  // namespace tpt
