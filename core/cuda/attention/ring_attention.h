// Launchers of context parallelism's ring attention blocks and the strided row copy on the GPU
// (core/cuda/attention/ring_attention.cu); arguments and semantics as the Ops methods of the same
// name (core/ops.h attention_block_forward / attention_block_backward / copy_rows).
#pragma once
#include <cstdint>

#include "core/cuda/cuda_util.h"
#include "core/ops.h"

namespace tpt::cuda {

// Head dims up to kRingMaxD (a warp per query row, kRingMaxD / 32 channels per lane).
constexpr int64_t kRingMaxD = 256;
void ring_block_forward(float* out, float* lse, CBuf qkv, CBuf kv, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t D, const RingBlock& blk, cudaStream_t s);
// dk, dv add by atomics (fp32): not bitwise reproducible between runs
void ring_block_backward(float* dq, float* dkv, CBuf dout, CBuf out, const float* lse, CBuf qkv, CBuf kv, int64_t B,
                         int64_t T, int64_t H, int64_t KV, int64_t D, const RingBlock& blk, cudaStream_t s);
void copy_rows(Buf dst, int64_t dst_stride, CBuf src, int64_t src_stride, int64_t rows, int64_t cols, cudaStream_t s);

}  // namespace tpt::cuda
