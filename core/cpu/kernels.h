// The CPU backend's fp32 kernels that have files of their own (core/ops.h: LayerNorm and RMSNorm in
// norm_kernels.cpp, SwiGLU in swiglu_kernels.cpp, the grouped-query QKV regroup and RoPE in
// qkv_kernels.cpp, the MoE rows in moe_kernels.cpp), as OpenMP loops; CpuOps (cpu_ops.cpp) stages 16-bit operands around them as it
// does for every kernel. The ring-attention blocks are ring_kernels.h's.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/ops.h"  // Fp8Operand

namespace tpt::cpu {

// Column sums of x (N, C) added into out (C), parallel over column blocks (convert_kernels.cpp).
void add_column_sums(float* out, const float* x, int64_t N, int64_t C);
// n elements of src (dtype t) as fp32 into dst, and back (rounded to t) (convert_kernels.cpp).
void load_f32(float* dst, const void* src, DType t, int64_t n);
void store_f32(void* dst, DType t, const float* src, int64_t n);
// One row of a tensor of dtype t as fp32 (the cross-entropy's row loops).
inline void row_to_f32(float* dst, const void* src, DType t, int64_t off, int64_t n) {
  if (t == DType::F32) std::memcpy(dst, static_cast<const float*>(src) + off, size_t(n) * sizeof(float));
  else if (t == DType::BF16)
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(static_cast<const uint16_t*>(src)[off + i]);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(static_cast<const uint16_t*>(src)[off + i]);
}

// out (N, C) = (inp - mean) * rstd * w + b; mean, rstd (N)
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                       int64_t C, float eps);
// dinp (N, C) += ; dw, db (C) += (per-thread partials, summed in thread order)
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C, int threads);
// out (N, C) = inp * rstd * w; rstd (N)
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N, int64_t C, float eps,
                     int threads);
// dinp (N, C) += ; dw (C) += (per-thread partials, summed in thread order)
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int64_t N, int64_t C, int threads);
// out (N, F) = silu(gate) * up of inp (N, 2F) rows [gate | up]
void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F);
// dinp (N, 2F) = [dout * up * silu'(gate) | dout * silu(gate)]
void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F);
// grouped (N, G, Q + 2, D) <-> heads (N, (G Q + 2 G) D)
void qkv_regroup(float* out, const float* in, int64_t N, int64_t G, int64_t Q, int64_t D, bool to_heads);
// in place on the query and key heads of qkv (N, (H + 2 KV) D)
void rope(float* qkv, const float* inv_freq, const int32_t* positions, int64_t N, int64_t S, int64_t H, int64_t KV,
          int64_t D, int64_t rot, bool interleaved, bool inverse);
// Mixture-of-Experts rows (moe_kernels.cpp; core/ops.h gather_rows, combine_rows, row_dots)
void gather_rows(float* out, const float* in, const int32_t* idx, const float* scale, int64_t R, int64_t C);
void combine_rows(float* out, const float* in, const int32_t* idx, const float* w, int64_t N, int64_t K, int64_t C,
                  bool accumulate);
void row_dots(float* out, const float* a, const float* b, const int32_t* idx, int64_t N, int64_t K, int64_t C);

// FP8 (fp8_kernels.cpp; core/ops.h fp8_quantize, fp8_cast_transpose, fp8_quantize_blocks): x (rows, cols)'s
// codes with one scale (amax = max(amax, max |x|)) into out and / or transposed into out_t (either may
// be null), or with a power-of-two scale per block (transposed: out is (cols, rows)); an operand
// decoded times its scale_inv(s)
void fp8_quantize(uint8_t* out, uint8_t* out_t, const float* x, int64_t rows, int64_t cols, Fp8Type t, float scale,
                  float* amax);
void fp8_quantize_blocks(uint8_t* out, const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Type t,
                         int margin, float* scale_inv, bool transposed);
void fp8_dequantize(float* out, const Fp8Operand& x, int64_t n);

}  // namespace tpt::cpu
