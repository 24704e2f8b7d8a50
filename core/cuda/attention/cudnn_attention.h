// Causal attention through cuDNN's fused scaled-dot-product attention (flash attention), for the
// CUDA backend's bf16 / fp16 runs: the Ops methods attention_forward / backward (core/ops.h) as
// cuDNN graphs built with the header-only cudnn-frontend. q, k, v are read in place from qkv
// (B, T, (H + 2 KV) D) -- H query heads, then KV key heads, then KV value heads; cuDNN takes K and V
// with fewer heads than Q natively (grouped-query attention) --, out and dout are (B, T, H*D), dq,
// dk, dv are written in place into dqkv: strided (B, H or KV, T, D) views, no transposes. lse (B, H, T) is cuDNN's softmax "stats": the natural-log
// log-sum-exp of each query's scaled scores, as the other backends store it, so a forward here and
// a backward in the own kernels (or the other way round) agree.
//
// Built only when CMake finds the headers of cuDNN 9 and cudnn-frontend (TPTRAIN_CUDNN,
// TPTRAIN_HAVE_CUDNN); without them, or when libcudnn.so.9 cannot be loaded at run time (one
// warning), forward / backward always return false and the caller runs its own kernels. Plain C++ with
// the CUDA runtime API only: the frontend's headers stay inside cudnn_attention.cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/cuda/cuda_util.h"
#include "core/ops.h"

namespace tpt::cuda {

// Whether this build has the cuDNN path.
bool cudnn_attention_built();

// Whether libcudnn.so.9 (TPTRAIN_CUDNN_LIBRARY, if set) could be loaded: cuDNN is opened at run
// time, at the first call of this or the next two (false when not built). Needs no GPU.
bool cudnn_attention_loaded();
// One line for --version and the start-up log, e.g. "cuDNN SDPA (cuDNN 9.19.0 loaded, built with
// 9.19.0; cudnn-frontend 1.32.0)", or "cuDNN not found (<why>; built with ...)"; empty when not
// built. Needs no GPU.
std::string cudnn_attention_version();

// Process-wide counts, never reset: calls run by cuDNN, and calls handed back to the caller (no
// graph for the shape, misaligned pointers, fp32, no usable cuDNN). The tests check the path taken.
struct CudnnAttentionStats {
  int64_t forward = 0, backward = 0, fell_back = 0;
  int64_t ring_forward = 0, ring_backward = 0, ring_fell_back = 0;  // context parallelism's ring blocks
};
CudnnAttentionStats cudnn_attention_stats();

// One per CudaOps: a cuDNN handle bound to `stream` (created at first use), one built graph per
// (B, T, H, KV, D, dtype, direction) kept for the object's life, one workspace for all of them
// (sized by prepare() at start-up; a graph that asks for more grows it, counted in *allocator_calls).
// Calls it hands back: fp32 tensors, head dimensions not a multiple of 8, pointers not 16-byte
// aligned, and shapes whose graph cuDNN refuses (too large a head dimension, a cuDNN too old for
// the GPU, ...): such a shape is remembered, with one warning in the log, and refused at once
// afterwards. If cuDNN cannot make a handle at all (one warning), every call is handed back.
class CudnnAttention {
 public:
  // deterministic: the backward's dQ accumulation in a fixed order (cuDNN's deterministic
  // algorithm: bitwise reproducible, more workspace); false lets cuDNN use atomics.
  CudnnAttention(cudaStream_t stream, bool deterministic, int64_t* allocator_calls = nullptr);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Builds the forward and backward graphs of a shape now (as forward / backward would at their
  // first call) and sizes the workspace for both: at least `at_least` bytes. Returns the workspace
  // each graph asks for (-1: no graph, the own kernels will run it) and what is held now.
  struct Prepared {
    int64_t forward = -1, backward = -1, held = 0;
  };
  Prepared prepare(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType t, int64_t at_least);

  // Enqueue the Ops method's work on the stream and return true; or return false, having done
  // nothing, when cuDNN cannot run this call (above): the caller then runs its own kernels.
  // A graph that fails while it executes throws InternalError with cuDNN's message.
  // Backward writes all of dqkv (=) and needs no scratch.
  bool forward(Buf out, float* lse, CBuf qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);
  bool backward(Buf dqkv, CBuf dout, CBuf qkv, CBuf out, const float* lse, int64_t B, int64_t T, int64_t H,
                int64_t KV, int64_t D);

  // Context parallelism's ring blocks (the Ops methods attention_block_forward / backward, core/ops.h):
  // the block's (query chunk, key chunk) pairs -- c = T / 2 tokens each; a pair is seen whole, causally
  // (the same chunk: cuDNN's causal mask) or not at all (skipped) -- as cuDNN SDPA calls on strided
  // views of qkv and kv, one per block where its pairs form one rectangle (ring_calls.h: the forward's
  // always, the backward's unless deterministic), else one per pair. Forward: the call's O (16-bit)
  // and stats (cuDNN's natural-log log-sum-exp, the interface's lse) into the staging buffer, merged
  // into out / lse in fp32 by ring_merge_rows (the online-softmax rule as the fallback kernel's).
  // Backward: cuDNN's SDPA backward given the final (merged) out and lse -- P = exp(S - lse),
  // D = rowsum(dO o out), so each call's gradients are exact --, its dQ and dK|dV (16-bit) added into
  // dq / dkv in fp32 by ring_add_rows, calls in a fixed order; with `deterministic` cuDNN's ordered
  // algorithm, so the whole block is bitwise reproducible. Same refusals as forward / backward (and T
  // odd), handed back with nothing done; the caller then runs its own kernels.
  Prepared prepare_ring(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType t);
  bool ring_forward(float* out, float* lse, CBuf qkv, CBuf kv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                    const RingBlock& blk);
  bool ring_backward(float* dq, float* dkv, CBuf dout, CBuf out, const float* lse, CBuf qkv, CBuf kv, int64_t B,
                     int64_t T, int64_t H, int64_t KV, int64_t D, const RingBlock& blk);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpt::cuda
