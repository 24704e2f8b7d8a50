// Launchers of context parallelism's ring attention blocks and the strided row copy on the GPU
// (core/cuda/attention/ring_attention.cu); arguments and semantics as the Ops methods of the same
// name (core/ops.h attention_block_forward / attention_block_backward / copy_rows).
#pragma once
#include <cstdint>

#include "core/cuda/cuda_util.h"
#include "core/ops.h"

namespace tpt::cuda {

// Head dims up to kRingMaxD (a warp per row, kRingMaxD / 32 channels per lane).
constexpr int64_t kRingMaxD = 256;
void ring_block_forward(float* out, float* lse, CBuf qkv, CBuf kv, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t D, const RingBlock& blk, cudaStream_t s);
// dq, dk, dv added into (fp32) by two kernels without atomics: bitwise repeatable
void ring_block_backward(float* dq, float* dkv, CBuf dout, CBuf out, const float* lse, CBuf qkv, CBuf kv, int64_t B,
                         int64_t T, int64_t H, int64_t KV, int64_t D, const RingBlock& blk, cudaStream_t s);
// The cuDNN ring path's fp32 steps (core/cuda/attention/cudnn_attention.h ring_forward / backward), a
// fixed order of additions (no atomics). ring_merge_rows: out rows [t0, t0 + n) of (B, T, H D) and
// their lse (B, H, T) merged (write: replaced) with one call's o (B, n, H D) and stats (B, H, n) by
// the online-softmax rule. ring_add_rows: dst (B, rows of `n`, batch stride dst_batch) += src (B, n)
// packed.
void ring_merge_rows(float* out, float* lse, CBuf o, const float* stats, int64_t B, int64_t T, int64_t H, int64_t D,
                     int64_t t0, int64_t n, bool write, cudaStream_t s);
void ring_add_rows(float* dst, int64_t dst_batch, CBuf src, int64_t B, int64_t n, cudaStream_t s);
void copy_rows(Buf dst, int64_t dst_stride, CBuf src, int64_t src_stride, int64_t rows, int64_t cols, cudaStream_t s);

}  // namespace tpt::cuda
