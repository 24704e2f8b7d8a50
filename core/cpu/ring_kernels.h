// The CPU backend's fp32 kernels of context parallelism's ring attention blocks (core/ops.h
// attention_block_forward / attention_block_backward); CpuOps stages 16-bit operands around them.
#pragma once
#include <cstdint>

#include "core/ops.h"

namespace tpt::cpu {

// out (B, T, H D), lse (B, H, T) merged with the block of qkv's queries against kv (B, T, 2 KV D)
void ring_block_forward(float* out, float* lse, const float* qkv, const float* kv, int64_t B, int64_t T, int64_t H,
                        int64_t KV, int64_t D, const RingBlock& blk);
// dq (B, T, H D) +=, dkv (B, T, 2 KV D) += from dout, out (B, T, H D) and the final lse (B, H, T)
void ring_block_backward(float* dq, float* dkv, const float* dout, const float* out, const float* lse,
                         const float* qkv, const float* kv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                         const RingBlock& blk);

}  // namespace tpt::cpu
