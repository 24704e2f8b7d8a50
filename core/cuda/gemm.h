// cuBLASLt GEMMs of the CUDA backend in row-major terms. Every distinct problem (shape, strides,
// transposes, types, epilogue, pointer alignments) gets its descriptors and the heuristic's best
// algorithm once; later calls reuse them. One workspace, one stream.
#pragma once
#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "core/cuda/cuda_util.h"
#include "core/dtype.h"

namespace tpt::cuda {

// One operand: stored row-major with leading dimension `ld` (elements); `trans` when stored as the
// transpose of what the product uses; `stride` (elements) between the members of a batch.
struct Operand {
  const void* p = nullptr;
  int64_t ld = 0;
  bool trans = false;
  int64_t stride = 0;
};

enum class Epilogue {
  None,
  Bias,      // C[i][j] += bias[j]                  (bias: N floats, read)
  BiasGrad,  // bias[i] = sum over k of op(A)[i][k]  (bias: M floats, overwritten)
};

class LtGemm {
 public:
  LtGemm(bool tf32, cudaStream_t stream);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Row-major C (M x N, row stride ldc) = alpha * op(A) (M x K) * op(B) (K x N) + beta * C, for each
  // of `batch` members (C advancing by sc elements). A and B hold `ab` values (F32, BF16 or F16 bit
  // patterns); C is fp32; accumulation is fp32 (TF32 products for F32 inputs if enabled).
  // Returns false, having done nothing, when cuBLASLt offers no algorithm for this epilogue; the
  // caller then does the epilogue's work itself. Without an epilogue it always succeeds (or throws).
  bool run(int64_t M, int64_t N, int64_t K, const Operand& A, const Operand& B, float* C, int64_t ldc, int64_t sc,
           int64_t batch, float alpha, float beta, DType ab, Epilogue epilogue = Epilogue::None,
           float* bias = nullptr);

  struct Key {
    int op_a, op_b;  // cuBLASLt's (column-major) view
    int64_t m, n, k, lda, ldb, ldc, batch, sa, sb, sc;
    int ab, compute, epilogue;
    int align_a, align_b, align_c, align_bias;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan;

 private:
  Plan& plan(const Key& key, const float* bias);

  bool tf32_;
  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

}  // namespace tpt::cuda
