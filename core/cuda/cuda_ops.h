// The CUDA backend (DESIGN "Backends"): the Ops interface on device memory of one GPU, with
// cuBLASLt GEMMs and custom kernels on one compute stream. Plain C++: callers need no CUDA headers.
// Built only when the CUDA toolkit is found (TPTRAIN_HAVE_CUDA).
#pragma once
#include <memory>
#include <string>

#include "core/ops.h"

namespace tpt {

struct CudaOptions {
  // fp32 GEMMs on TF32 tensor cores (10-bit mantissa products). Off by default: fp32 GEMMs then
  // match the CPU backend up to summation order.
  bool tf32 = false;
  // BF16 / F16: every GEMM operand is already a value of that type (mixed precision rounds each one
  // to the compute dtype before it is stored, DESIGN "Numerics"), so the GEMMs read 16-bit copies
  // on the tensor cores with fp32 accumulation -- the same products, exactly. Attention then runs
  // its tensor-core flash kernels where the head dimension allows (core/cuda/kernels.h), rounding
  // the probabilities and their gradient to the 16-bit type for their products (the CPU keeps them
  // in fp32). F32 (default): fp32 GEMMs and fp32 attention kernels.
  DType gemm_inputs = DType::F32;
  // Fuse the bias add (forward) and the bias gradient (backward) into the GEMMs as cuBLASLt
  // epilogues; off: separate kernels (the same sums in another order).
  bool gemm_epilogues = true;
};

// Number of CUDA devices visible to this process: 0 when there is no driver or no GPU (never throws).
int cuda_device_count();
// "NVIDIA H200 (sm_90, 139.8 GiB)"; empty if the device does not exist.
std::string cuda_device_name(int device);
// The device's 16-byte UUID (unique across machines); empty if it does not exist.
std::string cuda_device_uuid(int device);
// Makes `device` the current device of this process (its compute stream is created on it).
void cuda_set_device(int device);

std::unique_ptr<Ops> make_cuda_ops(int device, const CudaOptions& options = {});

}  // namespace tpt
