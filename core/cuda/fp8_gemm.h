// The CUDA backend's FP8 GEMMs (Ops::fp8_linear_forward / fp8_linear_backward; docs/FP8.md "GEMM path"):
// cuBLASLt's FP8 matmul where the GPU, the toolkit and the shapes allow it, else the CPU backend's
// emulation on the GPU (each operand decoded to fp32, then the fp32 GEMM).
//
// cuBLASLt's FP8 on Hopper takes both operands K-major (core/cuda/gemm.h Fp8Args). The forward's
// operands are stored that way; the input gradient reads the weight transposed (its kept columnwise
// copy, Fp8Operand::t_codes) and the weight gradient the output gradient and the input transposed (their
// columnwise codes, made in their casts as Transformer Engine does: Ops::fp8_cast_transpose); an operand
// given without its transposed codes is transposed into the workspace first. Block scales
// are copied into cuBLASLt's layouts (rows padded to 4). The forward accumulates as cuBLASLt's fast FP8
// mode does with tensor scales (Transformer Engine's default), the gradients' GEMMs and every blockwise
// GEMM in fp32 ("split accumulation"). Outputs, epilogues and roundings as Ops::linear_forward /
// linear_backward: bias and GELU through cuBLASLt's epilogues where it has them, else our kernels on the
// fp32 products.
#pragma once
#include <cstdint>

#include "core/cuda/cuda_util.h"
#include "core/cuda/gemm.h"
#include "core/ops.h"

namespace tpt::cuda {

// Blockwise scaling's block length (model/fp8_linear.h kFp8Block): cuBLASLt's VEC128 / BLK128x128.
constexpr int64_t kFp8BlockLen = 128;

// Process-wide counts of FP8 GEMMs run by cuBLASLt's FP8 matmul and by the fallback (reports, tests).
struct Fp8GemmStats {
  int64_t fp8 = 0, fallback = 0;
};
Fp8GemmStats fp8_gemm_stats();

class Fp8Gemms {
 public:
  Fp8Gemms(LtGemm& gemm, cudaStream_t stream, bool epilogues, int64_t* allocator_calls)
      : gemm_(gemm), stream_(stream), epilogues_(epilogues), work_(allocator_calls), fallback_(allocator_calls) {}

  void forward(Buf out, const Fp8Operand& inp, const Fp8Operand& w, CBuf bias, int64_t N, int64_t I, int64_t O,
               Buf gelu_pre);
  void backward(Buf dinp, Buf dw, const Fp8Operand& dout, const Fp8Operand& inp, const Fp8Operand& w, int64_t N,
                int64_t I, int64_t O, bool accumulate_dinp, CBuf gelu_pre);

  // The workspace (transposed codes, block scales; core/gpu_workspace.h cuda_fp8_workspace_bytes) is
  // reserved at start-up; the fallback's fp32 operands and products are not planned.
  void reserve(int64_t bytes) { work_.reserve(size_t(bytes)); }
  int64_t workspace_bytes() const { return int64_t(work_.capacity()); }
  int64_t fallback_bytes() const { return int64_t(fallback_.capacity()); }

  struct Gemm;  // one GEMM: its FP8 form and its fallback's (fp8_gemm.cu)

 private:
  bool run_fp8(const Gemm& g, void* C, DType ct, float beta, const EpilogueArgs& e = {});
  // the fallback into C (fp32, beta as cuBLASLt's) or, with C null, into fp32 scratch it returns
  float* run_fallback(const Gemm& g, float* C, float beta);
  float* scratch(int64_t n) { return fallback_.as<float>(size_t(n)); }  // for FP8 products in fp32

  LtGemm& gemm_;
  cudaStream_t stream_;
  bool epilogues_;
  DeviceBuffer work_, fallback_;
};

}  // namespace tpt::cuda
