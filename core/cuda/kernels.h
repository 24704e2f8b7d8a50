// Launchers of the CUDA backend's kernels (core/cuda/kernels.cu, attention.cu): host functions that
// enqueue work on stream `s`. Arguments, shapes and "=" / "+=" semantics are those of the Ops
// methods of the same name (core/ops.h); the per-element math is core/math.h and core/dtype.h.
#pragma once
#include <cstdint>

#include "core/cuda/cuda_util.h"
#include "core/dtype.h"
#include "core/math.h"

namespace tpt::cuda {

// ---- element-wise (kernels.cu) ----
void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t s);
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n, cudaStream_t s);
void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t s);
void accumulate(float* y, const float* x, int64_t n, cudaStream_t s);
void scale(float* x, float a, int64_t n, cudaStream_t s);
void round_to(float* x, int64_t n, DType t, cudaStream_t s);
void pack_half(uint16_t* dst, const float* src, int64_t n, DType t, cudaStream_t s);
void unpack_half(float* dst, const uint16_t* src, int64_t n, DType t, cudaStream_t s);
void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a, bool decay,
           float* compute, DType t, cudaStream_t s);

// out (N, C) = row (C) in every row.
void broadcast_rows(float* out, const float* row, int64_t N, int64_t C, cudaStream_t s);
// out (C) += column sums of x (N, C), in a fixed order (deterministic).
void add_column_sums(float* out, const float* x, int64_t N, int64_t C, DeviceBuffer& scratch, cudaStream_t s);

// ---- rows ----
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int64_t N, int64_t C, float eps, cudaStream_t s);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C, DeviceBuffer& scratch,
                        cudaStream_t s);

// ---- embeddings ----
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N, int64_t C, int64_t v0,
                       int64_t rows, cudaStream_t s);
// Deterministic: token positions sorted by row (stable radix sort), then each row's gradients summed
// in position order -- the CPU backend's order, so the sums agree bit for bit.
void embedding_backward(float* dwte, const int32_t* tokens, const float* dout, int64_t N, int64_t C, int64_t v0,
                        int64_t rows, DeviceBuffer& scratch, cudaStream_t s);
void add_position_embedding(float* out, const float* wpe, int64_t B, int64_t T, int64_t C, cudaStream_t s);
void position_embedding_backward(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C, cudaStream_t s);

// ---- vocab-parallel cross-entropy ----
void xent_local_max(float* row_max, float* target_logit, const float* logits, const int32_t* targets, int64_t N,
                    int64_t Vl, int64_t v0, int64_t valid_vocab, cudaStream_t s);
void xent_local_sumexp(float* sum_exp, float* logits, const float* row_max, int64_t N, int64_t Vl, int64_t v0,
                       int64_t valid_vocab, cudaStream_t s);
void xent_backward_inplace(float* exps, float* losses, const float* row_max, const float* sum_exp,
                           const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                           int64_t valid_vocab, float dloss_scale, bool want_grad, cudaStream_t s);

// ---- reductions to the host (synchronize the stream) ----
// `pinned` is page-locked host memory for the result.
double sum_squares(const float* x, int64_t n, DeviceBuffer& scratch, double* pinned, cudaStream_t s);
bool has_nonfinite(const float* x, int64_t n, DeviceBuffer& scratch, int* pinned, cudaStream_t s);

// ---- attention (attention.cu) ----
// Flash-style causal attention (fp32, D <= 128): the Ops methods attention_forward / backward.
// Never materialises a T x T matrix. Forward: out (B, T, H*D), lse (B, H, T) the log-sum-exp of
// each query's scaled scores. Backward: dqkv (B, T, 3, H, D) = , from out and lse; delta (B, H, T)
// scratch. Deterministic (no atomics).
void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                             cudaStream_t s);
void flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t H, int64_t D, cudaStream_t s);
// delta (B, H, T) = per head and position, dout . out (the softmax backward's row term).
void attention_row_dots(float* delta, const float* dout, const float* out, int64_t B, int64_t T, int64_t H, int64_t D,
                        cudaStream_t s);
// The same on the tensor cores (attention_tc.cu) for bf16 / fp16 runs: q, k, v, out and dout hold
// values of type t (exact as 16-bit), the probabilities and their gradient are rounded to t before
// their products. Only where tc_attention_supported(D, t): D in {32, 64, 128}.
bool tc_attention_supported(int64_t D, DType t);
void tc_flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                                DType t, cudaStream_t s);
void tc_flash_attention_backward(float* dqkv, float* delta, const float* dout, const float* qkv, const float* out,
                                 const float* lse, int64_t B, int64_t T, int64_t H, int64_t D, DType t,
                                 cudaStream_t s);
// The naive reference the tests hold the flash kernels to: the same outputs through a (B, H, T, T)
// probability buffer `probs` (forward fills it; backward reads it and overwrites `dscores`, same size).
void reference_attention_forward(float* out, float* lse, float* probs, const float* qkv, int64_t B, int64_t T,
                                 int64_t H, int64_t D, cudaStream_t s);
void reference_attention_backward(float* dqkv, float* dscores, const float* dout, const float* qkv,
                                  const float* probs, int64_t B, int64_t T, int64_t H, int64_t D, cudaStream_t s);

}  // namespace tpt::cuda
