// Column sums of an (N, C) array in a fixed order (deterministic, no atomics): the bias gradients
// (kernels.cu add_column_sums) and the norms' weight gradients (norm_kernels.cu). Device templates for
// the CUDA backend's translation units.
#pragma once
#include <algorithm>

#include "core/cuda/cuda_util.h"
#include "core/cuda/device_util.h"
#include "core/gpu_workspace.h"

namespace tpt::cuda {

// Columns in blocks of 32 (threadIdx.x), rows in chunks (blockIdx.y) walked by blockDim.y threads;
// each block writes K partial sums per column for its chunk, and a second kernel adds the chunks
// in order. f(n, c, v) gives the K values of element (n, c).

constexpr int kColRows = 8;  // blockDim.y of the partial-sum kernel

template <int K, class F>
__global__ void column_partials_kernel(float* partial, int64_t N, int64_t C, int64_t rows_per_chunk, F f) {
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  float acc[K];
  for (int k = 0; k < K; ++k) acc[k] = 0.0f;
  if (c < C) {
    const int64_t n0 = chunk * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
    for (int64_t n = n0 + threadIdx.y; n < n1; n += kColRows) {
      float v[K];
      f(n, c, v);
      for (int k = 0; k < K; ++k) acc[k] += v[k];
    }
  }
  __shared__ float sm[K][kColRows][33];
  for (int k = 0; k < K; ++k) sm[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int k = 0; k < K; ++k) {
      float s = 0.0f;
      for (int y = 0; y < kColRows; ++y) s += sm[k][y][threadIdx.x];
      partial[(chunk * K + k) * C + c] = s;
    }
  }
}

// out_k (C) += sum over chunks of partial (chunks, K, C) (weight gradients: fp32 or bf16, GradPtr)
template <int K>
__global__ void column_finish_kernel(GradPtr out0, GradPtr out1, const float* partial, int64_t chunks, int64_t C) {
  TPT_GRID_LOOP(c, C) {
    float s[K];
    for (int k = 0; k < K; ++k) s[k] = 0.0f;
    for (int64_t j = 0; j < chunks; ++j)
      for (int k = 0; k < K; ++k) s[k] += partial[(j * K + k) * C + c];
    out0.add(c, s[0]);
    if (K > 1) out1.add(c, s[K - 1]);
  }
}

template <int K, class F>
void column_sums(GradPtr out0, GradPtr out1, int64_t N, int64_t C, F f, DeviceBuffer& scratch, cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  // the chunking (and so the scratch) the plan counts: core/gpu_workspace.h
  const int64_t col_blocks = (C + 31) / 32, chunks = column_sum_chunks(N, C);
  const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  float* partial = scratch.as<float>(size_t(column_sums_scratch_bytes(N, C, K) / 4));
  column_partials_kernel<K><<<dim3(unsigned(col_blocks), unsigned(chunks)), dim3(32, kColRows), 0, s>>>(
      partial, N, C, rows_per_chunk, f);
  TPT_CUDA_LAUNCHED();
  column_finish_kernel<K><<<blocks_for(C), kThreads, 0, s>>>(out0, out1, partial, chunks, C);
  TPT_CUDA_LAUNCHED();
}

}  // namespace tpt::cuda
