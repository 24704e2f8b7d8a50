// cuBLASLt GEMMs of the CUDA backend in row-major terms. Every distinct problem (shape, strides,
// transposes, types, epilogue and its auxiliary settings, pointer alignments) gets its descriptors
// and the heuristic's best algorithm once; later calls reuse them. One workspace, one stream.
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

// What cuBLASLt does besides the product (row-major C is M x N; all in fp32 before C's rounding):
enum class Epilogue {
  None,
  Bias,      // C[i][j] = acc + bias[j]                 (bias: N elements of C's dtype, read)
  GeluAux,   // pre = acc (+ bias[j] if bias), aux[i][j] = pre, C[i][j] = gelu(pre)
             //                                         (aux: M x N of C's dtype, written, row stride aux_ld)
  DGelu,     // C[i][j] = acc * gelu'(aux[i][j])        (aux: M x N of C's dtype, read; beta must be 0)
  BiasGrad,  // bias[i] = sum over k of op(A)[i][k]     (bias: M floats, overwritten; C fp32)
};

struct EpilogueArgs {
  Epilogue kind = Epilogue::None;
  const void* bias = nullptr;  // Bias, GeluAux (optional): read; BiasGrad: written
  void* aux = nullptr;         // GeluAux: written; DGelu: read
  int64_t aux_ld = 0;          // elements; cuBLASLt wants a multiple of 8
};

// FP8 operands (Ops::fp8_linear_*, core/cuda/fp8_gemm.cu): E4M3 or E5M2 codes, each read as its value times
// a scale_inv on the device: one fp32 for the tensor, or cuBLASLt's block scales (CUDA 12.9+, Hopper) for
// an operand stored row-major as (R, K), K its reduction:
//   Vec128: one per 1 x 128 run along K, at [k / 128][r] with rows padded to a multiple of 4
//           (scale_inv[(k / 128) * round_up(R, 4) + r]);
//   Blk128: one per 128 x 128 block, at [r / 128][k / 128] with the K blocks padded to a multiple of 4.
// Hopper's FP8 GEMMs take both operands K-major: our A not transposed, our B transposed (stored (N, K)).
enum class Fp8Scaling { Tensor, Vec128, Blk128 };
struct Fp8Args {
  bool a_e5m2 = false, b_e5m2 = false;
  const float* a_scale_inv = nullptr;
  const float* b_scale_inv = nullptr;
  Fp8Scaling a_scaling = Fp8Scaling::Tensor, b_scaling = Fp8Scaling::Tensor;
  bool fast_accum = false;  // the forward's (Transformer Engine); the gradients' GEMMs accumulate in fp32
};

// Process-wide counts of GEMMs with an epilogue, by Epilogue: run by cuBLASLt (fused) or handed
// back to the caller's separate kernels (fell back). For reports; never reset.
constexpr int kEpilogueKinds = 5;
struct EpilogueStats {
  int64_t fused[kEpilogueKinds] = {}, fell_back[kEpilogueKinds] = {};
};
EpilogueStats epilogue_stats();

class LtGemm {
 public:
  LtGemm(bool tf32, cudaStream_t stream);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Row-major C (M x N, row stride ldc) = alpha * op(A) (M x K) * op(B) (K x N) + beta * C, for each
  // of `batch` members (C advancing by sc elements). A and B hold `ab` values (F32, BF16 or F16 bit
  // patterns, as stored); C holds `ct` values (written rounded to ct; read for beta != 0);
  // accumulation and epilogues in fp32 (TF32 products for F32 inputs if enabled).
  // Returns false, having done nothing, when cuBLASLt offers no algorithm for this epilogue (or its
  // auxiliary settings break cuBLASLt's rules); the caller then does the epilogue's work itself.
  // Without an epilogue it always succeeds (or throws). With fp8, A and B hold FP8 codes (ab is not
  // read) and the call returns false where cuBLASLt has no FP8 algorithm for it (shapes, alignments,
  // the GPU): the caller then computes it another way.
  bool run(int64_t M, int64_t N, int64_t K, const Operand& A, const Operand& B, void* C, DType ct, int64_t ldc,
           int64_t sc, int64_t batch, float alpha, float beta, DType ab, const EpilogueArgs& epilogue = {},
           const Fp8Args* fp8 = nullptr);

  struct Key {
    int op_a, op_b;  // cuBLASLt's (column-major) view
    int64_t m, n, k, lda, ldb, ldc, batch, sa, sb, sc;
    int ab, ab_b, ct, compute, epilogue;  // ab_b: cuBLASLt's B's type (FP8 pairs may differ)
    int scaling_a, scaling_b, fast_accum;  // FP8: cuBLASLt's scale modes (-1: not FP8)
    int64_t aux_ld;
    int align_a, align_b, align_c, align_bias, align_aux;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan;

 private:
  Plan& plan(const Key& key, const EpilogueArgs& e, const Fp8Args* fp8);

  bool tf32_;
  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

}  // namespace tpt::cuda
