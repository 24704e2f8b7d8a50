// Launchers of the CUDA backend's kernels (core/cuda/kernels.cu, norm_kernels.cu, vocab_kernels.cu,
// swiglu_kernels.cu, qkv_kernels.cu, optimizer_kernels.cu, attention/attention.cu,
// attention/attention_tc.cu): host functions that enqueue work on stream `s`. Arguments, shapes
// and "=" / "+=" semantics are those of the Ops methods of the same name (core/ops.h); the
// per-element math is core/math.h and core/dtype.h. Compute-dtype tensors are Buf / CBuf: the
// kernels are instantiated for their storage type (fp32, bf16 or fp16 bits), compute in fp32 and
// round once where they store. The compute-dtype arguments of one call have one dtype unless a
// comment says otherwise.
#pragma once
#include <cstdint>

#include "core/cuda/cuda_util.h"
#include "core/dtype.h"
#include "core/math.h"
#include "core/ops.h"

namespace tpt::cuda {

// ---- element-wise (kernels.cu) ----
void gelu_forward(Buf out, CBuf inp, int64_t n, cudaStream_t s);
// dinp = dout * gelu'(inp). dout may also be fp32 with dinp and inp 16-bit (the fp32 product of
// linear_backward's GELU fallback, rounded once here).
void gelu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t n, cudaStream_t s);
void add(Buf out, CBuf a, CBuf b, int64_t n, cudaStream_t s);
void accumulate(Buf y, CBuf x, int64_t n, cudaStream_t s);
void accumulate_f32(Buf y, const float* x, int64_t n, cudaStream_t s);  // y += x (fp32), rounded once
// a weight gradient g (fp32, or bf16: added in fp32, rounded once) += the fp32 values x
void accumulate_grad(Buf g, const float* x, int64_t n, cudaStream_t s);
void sum_parts(Buf out, CBuf parts, int k, int64_t n, cudaStream_t s);
void scale(Buf x, float a, int64_t n, cudaStream_t s);  // fp32, or the bf16 gradient buffer
// Ops::fp8_quantize (core/cuda/fp8_kernels.cu)
void fp8_quantize(uint8_t* out, CBuf in, int64_t n, Fp8Type t, const float* scale, float* amax, cudaStream_t s);
void fp8_current_scales(float* scale, float* scale_inv, const float* amax, const Fp8Type* t, int n, int margin,
                        cudaStream_t s);
// Ops::fp8_cast_transpose: tiles through shared memory, the codes written along rows both ways
void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, CBuf in, int64_t rows, int64_t cols, Fp8Type t,
                        const float* scale, float* amax, cudaStream_t s);
// Ops::fp8_quantize_blocks: each block's amax, power-of-two scale and codes (1 x 128 blocks a half warp
// each, 128 x 1 transposed blocks from a warp's 128 x 32 tile, other blocks one thread block each)
void fp8_quantize_blocks(uint8_t* out, CBuf in, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols,
                         Fp8Type t, int margin, float* scale_inv, bool transposed, cudaStream_t s);
// Ops::fp8_block_amax, fp8_quantize_given_blocks (blockwise FP8 parameters' parts)
void fp8_block_amax(float* amax, CBuf in, int64_t at, int64_t n, int64_t cols, int64_t block_rows, int64_t block_cols,
                    cudaStream_t s);
void fp8_quantize_given_blocks(uint8_t* out, CBuf in, int64_t at, int64_t n, int64_t cols, int64_t block_rows,
                               int64_t block_cols, Fp8Type t, const float* scale_inv, cudaStream_t s);
// The FP8 GEMMs' operand preparation (core/cuda/fp8_gemm.cu): out (cols, rows) = the transpose of the
// codes in (rows, cols); a scale grid's relayout, out[j * ld + i] = in[i * si + j * sj] for i < ni,
// j < nj (0 for ni <= i < ld); and the fallback's decoding, out (n fp32) = value * its scale_inv
// (core/ops.h Fp8Operand, as the CPU emulation): of its codes, or (transposed) of its t_codes, out then
// (cols, rows).
void fp8_transpose(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols, cudaStream_t s);
void fp8_relayout_scales(float* out, const float* in, int64_t ni, int64_t nj, int64_t si, int64_t sj, int64_t ld,
                         cudaStream_t s);
void fp8_dequantize(float* out, const Fp8Operand& x, int64_t n, bool transposed, cudaStream_t s);
// out (N, C) = acc (N, C fp32) + bias (C; may be null), rounded once to out's dtype
void bias_store(Buf out, const float* acc, CBuf bias, int64_t N, int64_t C, cudaStream_t s);
// dst = src converted (any pair of dtypes; equal dtypes are a copy)
void convert(Buf dst, CBuf src, int64_t n, cudaStream_t s);
// out (N, C) = row (C) in every row.
void broadcast_rows(Buf out, CBuf row, int64_t N, int64_t C, cudaStream_t s);
// The fused fc1 without its GEMM epilogue: pre = acc (N, C, fp32 products) + bias (C, may be null)
// in fp32; gelu_pre = pre and out = gelu(pre), both stored rounded. acc may alias gelu_pre when
// that is fp32.
void bias_gelu_forward(Buf out, Buf gelu_pre, const float* acc, CBuf bias, int64_t N, int64_t C, cudaStream_t s);
// out (C) += column sums of x (N, C), in a fixed order (deterministic).
void add_column_sums(Buf out, CBuf x, int64_t N, int64_t C, DeviceBuffer& scratch, cudaStream_t s);

// ---- Mixture-of-Experts rows (moe_kernels.cu): core/ops.h gather_rows, combine_rows, row_dots; the
// index and weight arrays are on the device
void gather_rows(Buf out, CBuf in, const int32_t* idx, const float* scale, int64_t R, int64_t C, cudaStream_t s);
void combine_rows(Buf out, CBuf in, const int32_t* idx, const float* w, int64_t N, int64_t K, int64_t C,
                  bool accumulate, cudaStream_t s);
void row_dots(float* out, CBuf a, CBuf b, const int32_t* idx, int64_t N, int64_t K, int64_t C, cudaStream_t s);

// ---- rows (norm_kernels.cu) ----
void layernorm_forward(Buf out, float* mean, float* rstd, CBuf inp, CBuf w, CBuf b, int64_t N, int64_t C, float eps,
                       cudaStream_t s);
// res = a + b (rounded), out = LN(res as stored): one pass. res may alias a.
void residual_layernorm_forward(Buf res, Buf out, float* mean, float* rstd, CBuf a, CBuf b, CBuf w, CBuf bias,
                                int64_t N, int64_t C, float eps, cudaStream_t s);
void layernorm_backward(Buf dinp, Buf dw, Buf db, CBuf dout, CBuf inp, CBuf w, const float* mean,
                        const float* rstd, int64_t N, int64_t C, DeviceBuffer& scratch, cudaStream_t s);
// RMSNorm: out = inp * rstd * w (rstd (N) fp32); the residual form as residual_layernorm_forward;
// backward: dinp +=, dw += (fixed-order column partial sums, as layernorm_backward; dw may be null).
void rmsnorm_forward(Buf out, float* rstd, CBuf inp, CBuf w, int64_t N, int64_t C, float eps, cudaStream_t s);
void residual_rmsnorm_forward(Buf res, Buf out, float* rstd, CBuf a, CBuf b, CBuf w, int64_t N, int64_t C, float eps,
                              cudaStream_t s);
void rmsnorm_backward(Buf dinp, Buf dw, CBuf dout, CBuf inp, CBuf w, const float* rstd, int64_t N, int64_t C,
                      DeviceBuffer& scratch, cudaStream_t s);

// ---- SwiGLU (swiglu_kernels.cu), the QKV regroup and RoPE (qkv_kernels.cu) ----
// SwiGLU: inp (N, 2F) rows [gate | up] -> out (N, F) = silu(gate) * up; backward dinp (N, 2F) =
// [dout * up * silu'(gate) | dout * silu(gate)] (=).
void swiglu_forward(Buf out, CBuf inp, int64_t N, int64_t F, cudaStream_t s);
void swiglu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t N, int64_t F, cudaStream_t s);
// The grouped (N, G, Q + 2, D) <-> heads (N, (G Q + 2 G) D) permutation of the QKV activations (raw
// element copies; out must not overlap in).
void qkv_regroup(Buf out, CBuf in, int64_t N, int64_t G, int64_t Q, int64_t D, bool to_heads, cudaStream_t s);
// RoPE in place on the query and key heads of qkv (N, (H + 2 KV) D): a thread per rotated pair.
void rope(Buf qkv, const float* inv_freq, const int32_t* positions, int64_t N, int64_t S, int64_t H, int64_t KV,
          int64_t D, int64_t rot, bool interleaved, bool inverse, cudaStream_t s);

// ---- embeddings ----
// Copies rows as stored (out.t == wte.t).
void embedding_forward(Buf out, const int32_t* tokens, CBuf wte, int64_t N, int64_t C, int64_t v0, int64_t rows,
                       cudaStream_t s);
// Deterministic: token positions sorted by row (stable radix sort), then each row's gradients summed
// in position order -- the CPU backend's order, so the sums agree bit for bit.
void embedding_backward(Buf dwte, const int32_t* tokens, CBuf dout, int64_t N, int64_t C, int64_t v0,
                        int64_t rows, DeviceBuffer& scratch, cudaStream_t s);
void add_position_embedding(Buf out, CBuf wpe, int64_t B, int64_t T, int64_t C, cudaStream_t s);
void position_embedding_backward(Buf dwpe, CBuf dout, int64_t B, int64_t T, int64_t C, cudaStream_t s);

// ---- vocab-parallel cross-entropy (a block per row; the logits in their dtype) ----
void xent_local_max(float* row_max, float* target_logit, CBuf logits, const int32_t* targets, int64_t N,
                    int64_t Vl, int64_t v0, int64_t valid_vocab, cudaStream_t s);
void xent_local_sumexp(float* sum_exp, CBuf logits, const float* row_max, int64_t N, int64_t Vl, int64_t v0,
                       int64_t valid_vocab, cudaStream_t s);
void xent_loss_grad(Buf logits, float* losses, const float* row_max, const float* sum_exp,
                    const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                    int64_t valid_vocab, float dloss_scale, bool want_grad, const float* row_weight, cudaStream_t s);

// ---- the optimizer step (optimizer_kernels.cu) ----
void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a, bool decay, Buf compute,
           float grad_scale, cudaStream_t s);
// dst = the compute copy of fp32 master weights (Ops::master_copy)
void master_copy(Buf dst, const float* master, int64_t n, cudaStream_t s);
// Multi-tensor: one launch per table of up to 512 segments (the table is the kernel's argument).
// new_scales: null for Ops::adamw_segments, the new scales for Ops::adamw_store_scaled.
void adamw_segments(const AdamWBuffers& b, const TensorSegment* segs, int count, const AdamWParams& a,
                    float grad_scale, const float* new_scales, cudaStream_t s);
// Reductions to the host (synchronize the stream); `pinned` is page-locked host memory for the
// result (grad_stats: 2 doubles, read in one copy).
GradStats grad_stats(CBuf x, const TensorSegment* segs, int count, DeviceBuffer& scratch, double* pinned,
                     cudaStream_t s);
double sum_squares(CBuf x, int64_t n, DeviceBuffer& scratch, double* pinned, cudaStream_t s);
bool has_nonfinite(CBuf x, int64_t n, DeviceBuffer& scratch, int* pinned, cudaStream_t s);

// ---- attention (attention/attention.cu) ----
// Flash-style causal attention (D <= 128) on the CUDA cores, in fp32 arithmetic on any storage
// dtype: the Ops methods attention_forward / backward. Never materialises a T x T matrix.
// qkv (B, T, (H + 2 KV) D): H query heads, then KV key heads, then KV value heads (query head h
// uses key / value head h / (H / KV); KV = H is (B, T, 3, H, D)).
// Forward: out (B, T, H*D), lse (B, H, T) the log-sum-exp of each query's scaled scores.
// Backward: dqkv (B, T, (H + 2 KV) D) = , from out and lse; delta (B, H, T) fp32 scratch. The
// block that owns a key / value head's rows walks the H / KV query heads of its group in order.
// Deterministic (no atomics).
void flash_attention_forward(Buf out, float* lse, CBuf qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                             cudaStream_t s);
void flash_attention_backward(Buf dqkv, float* delta, CBuf dout, CBuf qkv, CBuf out, const float* lse, int64_t B,
                              int64_t T, int64_t H, int64_t KV, int64_t D, cudaStream_t s);
// delta (B, H, T) = per head and position, dout . out (the softmax backward's row term), in fp32.
void attention_row_dots(float* delta, CBuf dout, CBuf out, int64_t B, int64_t T, int64_t H, int64_t D,
                        cudaStream_t s);
// The same on the tensor cores (attention/attention_tc.cu) for bf16 / fp16 tensors: q, k, v and dout are
// read as stored, the probabilities and their gradient are rounded to the 16-bit type before their
// products, out and dqkv stored rounded. Only where tc_attention_supported(D, t) (D in {32, 64,
// 128} and the device grants the shared memory) and tc_attention_aligned(qkv, dout).
bool tc_attention_supported(int64_t D, DType t);
bool tc_attention_aligned(CBuf qkv, CBuf dout);
void tc_flash_attention_forward(Buf out, float* lse, CBuf qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                cudaStream_t s);
void tc_flash_attention_backward(Buf dqkv, float* delta, CBuf dout, CBuf qkv, CBuf out, const float* lse,
                                 int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, cudaStream_t s);
// The naive reference the tests hold the flash kernels to (fp32 tensors): the same outputs through
// a (B, H, T, T) probability buffer `probs` (forward fills it; backward reads it and overwrites
// `dscores`, same size).
void reference_attention_forward(float* out, float* lse, float* probs, const float* qkv, int64_t B, int64_t T,
                                 int64_t H, int64_t KV, int64_t D, cudaStream_t s);
void reference_attention_backward(float* dqkv, float* dscores, const float* dout, const float* qkv,
                                  const float* probs, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                  cudaStream_t s);

}  // namespace tpt::cuda
