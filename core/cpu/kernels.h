// The CPU backend's fp32 kernels that have files of their own (core/ops.h: RMSNorm in
// rmsnorm_kernels.cpp, SwiGLU in swiglu_kernels.cpp, the grouped-query QKV regroup and RoPE in
// qkv_kernels.cpp, the MoE rows in moe_kernels.cpp), as OpenMP loops; CpuOps (cpu_ops.cpp) stages 16-bit operands around them as it
// does for every kernel. The ring-attention blocks are ring_kernels.h's.
#pragma once
#include <cstdint>

namespace tpt::cpu {

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

}  // namespace tpt::cpu
