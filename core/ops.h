// The backend interface (DESIGN "Backends"): every kernel the model and optimizer need, on
// pointers that live on the backend's device. Model code is written once against it; core/cpu
// implements it with OpenBLAS + OpenMP, core/cuda (later) with cuBLASLt + custom kernels.
// Shapes in comments: N = rows (tokens), C = features. Gradients marked "+=" accumulate.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/math.h"

namespace tpt {

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;

  // Memory on the device.
  virtual float* alloc(size_t n) = 0;  // zeroed
  virtual void free(float* p) = 0;
  virtual void zero(float* p, size_t n) = 0;
  virtual void copy(float* dst, const float* src, size_t n) = 0;  // device to device
  virtual void to_host(float* host, const float* dev, size_t n) = 0;
  virtual void to_device(float* dev, const float* host, size_t n) = 0;

  // out (N, O) = inp (N, I) @ w(O, I)^T + bias(O) [bias may be null]
  virtual void linear_forward(float* out, const float* inp, const float* w, const float* bias,
                              int64_t N, int64_t I, int64_t O) = 0;
  // dinp (N, I) = / += dout (N, O) @ w (O, I)  (accumulate_dinp chooses);  dw (O, I) += dout^T @ inp;
  // dbias (O) += column sums of dout [dbias may be null]
  virtual void linear_backward(float* dinp, float* dw, float* dbias, const float* dout,
                               const float* inp, const float* w, int64_t N, int64_t I, int64_t O,
                               bool accumulate_dinp) = 0;

  // out (N, C) = LN(inp) * w + b; stores mean (N), rstd (N).
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* w, const float* b, int64_t N, int64_t C, float eps) = 0;
  // dinp (N, C) += ; dw, db (C) +=
  virtual void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                  const float* inp, const float* w, const float* mean,
                                  const float* rstd, int64_t N, int64_t C) = 0;

  // Causal attention, flash-style: nothing of size T x T outlives a call. qkv (B, T, 3, H, D) (q, k,
  // v of H local heads), out (B, T, H*D); lse (B, H, T) the log-sum-exp of each query's scaled
  // scores over the keys it sees, which is all backward needs to rebuild the probabilities.
  virtual void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                                 int64_t H, int64_t D) = 0;
  // dqkv (B, T, 3, H, D) = ; from the forward's qkv, out and lse; scratch (B, H, T)
  virtual void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                  const float* out, const float* lse, int64_t B, int64_t T, int64_t H,
                                  int64_t D) = 0;

  virtual void gelu_forward(float* out, const float* inp, int64_t n) = 0;
  // dinp = dout * gelu'(inp)
  virtual void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) = 0;

  // out = a + b
  virtual void add(float* out, const float* a, const float* b, int64_t n) = 0;
  // y += x
  virtual void accumulate(float* y, const float* x, int64_t n) = 0;
  virtual void scale(float* x, float s, int64_t n) = 0;

  // Vocab-parallel embedding: out (N, C) = wte rows for tokens in [v0, v0 + rows), 0 elsewhere.
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N,
                                 int64_t C, int64_t v0, int64_t rows) = 0;
  // dwte (rows, C) += dout rows of tokens in range
  virtual void embedding_backward(float* dwte, const int32_t* tokens, const float* dout, int64_t N,
                                  int64_t C, int64_t v0, int64_t rows) = 0;
  // out (B, T, C) += wpe (T, C) broadcast over B
  virtual void add_position_embedding(float* out, const float* wpe, int64_t B, int64_t T,
                                      int64_t C) = 0;
  // dwpe (T, C) += sum over B of dout (B, T, C)
  virtual void position_embedding_backward(float* dwpe, const float* dout, int64_t B, int64_t T,
                                           int64_t C) = 0;

  // Vocab-parallel cross-entropy on a logits shard (N, Vl) whose column j is vocabulary id v0 + j;
  // ids >= valid_vocab are padding and masked out. Step 1: row maxima over valid columns (-inf if
  // none) and the target logit if the target lies in this shard (else 0).
  virtual void xent_local_max(float* row_max, float* target_logit, const float* logits,
                              const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                              int64_t valid_vocab) = 0;
  // Step 2 (after max is reduced over TP): sum_exp (N) = sum over valid columns exp(l - max); the
  // logits are overwritten in place by exp(l - max) (0 on padding), which step 3 reuses.
  virtual void xent_local_sumexp(float* sum_exp, float* logits, const float* row_max, int64_t N,
                                 int64_t Vl, int64_t v0, int64_t valid_vocab) = 0;
  // Step 3 (after sum_exp, target_logit reduced): losses (N) = log(sum_exp) + max - target; if
  // want_grad, the exps of step 2 are overwritten in place by dlogits = (softmax - onehot) *
  // dloss_scale (0 on padding).
  virtual void xent_backward_inplace(float* exps, float* losses, const float* row_max,
                                     const float* sum_exp, const float* target_logit,
                                     const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                                     int64_t valid_vocab, float dloss_scale, bool want_grad) = 0;

  // Mixed precision. Rounds x in place to dtype t (storage of a bf16/fp16 tensor; no-op for F32).
  virtual void round_to(float* x, int64_t n, DType t) = 0;
  // Whether x holds an inf or a nan.
  virtual bool has_nonfinite(const float* x, int64_t n) = 0;
  // 16-bit wire format of pipeline messages: dst (n) = src rounded to t, and back.
  virtual void pack_half(uint16_t* dst, const float* src, int64_t n, DType t) = 0;
  virtual void unpack_half(float* dst, const uint16_t* src, int64_t n, DType t) = 0;

  // sum of squares of x (n), in double.
  virtual double sum_squares(const float* x, int64_t n) = 0;
  // AdamW over a contiguous range; decay applies weight decay to the whole range. compute (n), if
  // not null, receives the updated p rounded to t: the compute copy of bf16/fp16 runs, in the same pass.
  virtual void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a,
                     bool decay, float* compute, DType t) = 0;

  // Allocation accounting (tptrain plan's check against model/memory.h): bytes currently held by
  // alloc() as the allocator rounds them, and the most held at once since the backend was made.
  virtual int64_t allocated_bytes() const = 0;
  virtual int64_t peak_allocated_bytes() const = 0;
};

// CPU backend with `threads` OpenMP/OpenBLAS threads.
std::unique_ptr<Ops> make_cpu_ops(int threads);

}  // namespace tpt
