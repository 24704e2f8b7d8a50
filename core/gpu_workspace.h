// The CUDA backend's own device buffers (core/cuda), outside alloc_bytes: cuBLASLt's workspace,
// cuDNN's attention workspace, the reductions' scratch and the bias-gradient epilogue's output. Their
// sizes are functions of the run's shapes, in one place: the backend reserves them at start-up
// (Ops::reserve_workspace) and the plan counts them (plan/memory.h gpu_backend_workspace). Pure
// C++ (no CUDA): the plan runs anywhere.
#pragma once
#include <algorithm>
#include <cstdint>

namespace tpt {

// cuBLASLt's workspace of the CUDA backend (core/cuda/gemm.cu; NVIDIA's recommendation for Hopper).
inline constexpr int64_t kGemmWorkspaceBytes = int64_t(32) << 20;

// A growable device buffer of the backend (core/cuda/cuda_util.h DeviceBuffer) holds at least 1 MiB
// once it holds anything: what `bytes` of it take.
inline constexpr int64_t kMinDeviceBufferBytes = int64_t(1) << 20;
inline int64_t device_buffer_bytes(int64_t bytes) { return bytes > 0 ? std::max(bytes, kMinDeviceBufferBytes) : 0; }

// Column sums of an (N, C) array (core/cuda/column_sums.cuh: the bias gradients and the norms'
// weight gradients): the row chunks the pass splits N into, and its scratch, K partial sums per
// chunk and column in fp32.
inline int64_t column_sum_chunks(int64_t N, int64_t C);
inline int64_t column_sums_scratch_bytes(int64_t N, int64_t C, int K);

// The multi-tensor optimizer kernels (core/cuda/optimizer_kernels.cu): elements per block, segments
// per launch's table, and the gradient-norm reduction's scratch (two doubles per block and two for
// the result) for `elements` elements in `segments` segments: at most one partly filled block per
// table besides the full ones.
inline constexpr int64_t kMultiTensorChunk = 256 * 16;
inline constexpr int64_t kReduceBlocks = 1024;  // blocks of the single-tensor reductions (sum_squares)
inline int64_t grad_stats_scratch_bytes(int64_t elements, int64_t segments);
inline int64_t sum_squares_scratch_bytes();

// The word-embedding gradient's radix sort of N token ids (core/cuda/vocab_kernels.cu): four arrays
// of N uint32 (keys and values, in and out) at 256-byte boundaries, and a bound of CUB's temporary
// storage (its own copy of keys and values, histograms and look-back state; the backend asks CUB for
// the exact figure and takes the larger).
inline int64_t embedding_sort_arrays_bytes(int64_t N);
inline int64_t embedding_sort_temp_bound(int64_t N);

// cuDNN's fused attention (cudnn-frontend's SDPA graphs, core/cuda/attention/cudnn_attention.cpp) for a
// causal (B, H, T, D) problem with KV key / value heads, as cudnn-frontend sizes it
// (node/scaled_dot_product_flash_attention.h): the backward's softmax sums (B H T fp32), and
//   deterministic:     the dP workspace of the ordered algorithm, B H T T 16-bit values with T
//                      rounded up to cuDNN's tiles (64 query rows, 128 key columns); with grouped
//                      keys (KV < H) also dK and dV for every query head before their sum over the
//                      group, two (B, H, T, D) 16-bit tensors (cuDNN 9.19 on an H200 asked exactly
//                      this for B 1, H 32, KV 8, T 4096, D 128: 1088.5 MiB);
//   non-deterministic: the fp32 dQ accumulator (B H T D) its atomics add into (with grouped keys
//                      not yet seen on a GPU).
// The forward needs no workspace of its own; forward and backward share one buffer. The backend
// queries the built graphs at start-up and warns if they ask for more than this.
inline int64_t cudnn_attention_workspace_bytes(int64_t B, int64_t H, int64_t KV, int64_t T, int64_t D,
                                               bool deterministic);

// Context parallelism's ring blocks through cuDNN (CudnnAttention::ring_*): each block is up to four
// (query chunk, key chunk) pairs of c = T / 2 tokens, run as SDPA calls of up to `rows` = T query
// rows (core/cuda/attention/ring_calls.h: a block's pairs as one call where they form one rectangle)
// whose results are staged and then merged / added in fp32 by our kernels. The staging buffer,
// 256-byte aligned parts, holds the larger of the forward's (the call's O (B, rows, H D) 16-bit and
// stats (B, H, rows) fp32) and the backward's (dQ (B, rows, H D) and dK|dV (B, rows, 2 KV D), 16-bit,
// and a query chunk's stats fp32, packed as cuDNN before 9.26 wants them). cuDNN's own workspace is
// cudnn_attention_workspace_bytes(B, H, KV, Sq, D, deterministic) of the calls' query rows Sq (the
// unmasked calls' as the causal's): T where the backward's calls are merged, c where they are not.
inline int64_t cudnn_ring_staging_bytes(int64_t B, int64_t rows, int64_t H, int64_t KV, int64_t D);

// The cuBLASLt FP8 GEMMs' workspace (core/cuda/fp8_gemm.h) for the largest input, weight and output
// gradient (elements: bytes of codes) and their most block scales (0 without blockwise scaling) of a
// stage's FP8 GEMMs (model/fp8_linear.h Fp8ScratchSizes), 256-byte aligned parts:
//   T0  a transposed weight or output gradient   max(w, dout) bytes  } for operands given without their
//   T1  a transposed input                       inp bytes           } t_codes (none in training: 0, 0, 0)
//   S0, S1  the two operands' block scales in cuBLASLt's layouts: rows padded to 4, at most 4 x blocks fp32;
//           or a tensor scale copied to a 16-byte aligned address (cuBLASLt's call refuses others)
struct Fp8WorkspaceParts {
  int64_t t0 = 0, t1 = 0, s0 = 0, s1 = 0, total = 0;  // offsets, and the bytes of all
};
inline Fp8WorkspaceParts cuda_fp8_workspace(int64_t inp, int64_t w, int64_t dout, int64_t max_blocks) {
  auto up = [](int64_t n) { return (std::max<int64_t>(n, 0) + 255) / 256 * 256; };
  Fp8WorkspaceParts p;
  p.t1 = up(std::max(w, dout));
  p.s0 = p.t1 + up(inp);
  p.s1 = p.s0 + up(std::max<int64_t>(16 * max_blocks, 16));
  p.total = p.s1 + up(std::max<int64_t>(16 * max_blocks, 16));
  return p;
}

// ---- definitions

inline int64_t column_sum_chunks(int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return 0;
  // enough chunks of >= 64 rows to fill the GPU with blocks of 32 columns, few enough that the
  // finishing pass (one thread per column adding the chunks) stays short
  const int64_t col_blocks = (C + 31) / 32;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>((N + 63) / 64, std::max<int64_t>(1, 2048 / col_blocks)));
  const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  return (N + rows_per_chunk - 1) / rows_per_chunk;
}

inline int64_t column_sums_scratch_bytes(int64_t N, int64_t C, int K) { return column_sum_chunks(N, C) * K * C * 4; }

inline int64_t grad_stats_scratch_bytes(int64_t elements, int64_t segments) {
  if (elements <= 0 || segments <= 0) return 0;
  const int64_t blocks = (elements + kMultiTensorChunk - 1) / kMultiTensorChunk + segments;
  return (2 * blocks + 2) * 8;
}

inline int64_t sum_squares_scratch_bytes() { return (kReduceBlocks + 1) * 8; }

inline int64_t embedding_sort_arrays_bytes(int64_t N) { return 4 * ((N * 4 + 255) / 256 * 256); }

inline int64_t embedding_sort_temp_bound(int64_t N) { return 2 * ((N * 4 + 255) / 256 * 256) + (int64_t(1) << 20); }

inline int64_t cudnn_attention_workspace_bytes(int64_t B, int64_t H, int64_t KV, int64_t T, int64_t D,
                                               bool deterministic) {
  if (B <= 0 || H <= 0 || T <= 0) return 0;
  const int64_t softmax_sum = B * H * T * 4;
  if (!deterministic) return softmax_sum + B * H * T * D * 4;
  const int64_t tq = (T + 63) / 64 * 64, tk = (T + 127) / 128 * 128;
  return softmax_sum + B * H * tq * tk * 2 + (KV < H ? 2 * B * H * T * D * 2 : 0);
}

inline int64_t cudnn_ring_staging_bytes(int64_t B, int64_t rows, int64_t H, int64_t KV, int64_t D) {
  if (B <= 0 || rows <= 0 || H <= 0) return 0;
  auto up = [](int64_t n) { return (n + 255) / 256 * 256; };
  const int64_t o = up(B * rows * H * D * 2), stats = up(B * H * rows * 4);
  return std::max(o + stats, o + up(B * rows * 2 * KV * D * 2) + stats);
}

}  // namespace tpt
