// The CUDA backend (docs/ARCHITECTURE.md "Backends and communicators"): the Ops interface on device memory of one GPU, with
// cuBLASLt GEMMs and custom kernels on one compute stream. Plain C++: callers need no CUDA headers.
// Built only when the CUDA toolkit is found (TPTRAIN_HAVE_CUDA).
#pragma once
#include <memory>
#include <string>

#include "core/ops.h"

namespace tpt {

struct CudaOptions {
  // fp32 GEMMs on TF32 tensor cores (10-bit mantissa products). Off by default: fp32 GEMMs then
  // match the CPU backend up to summation order. (bf16 / fp16 GEMMs read their operands as stored,
  // on the tensor cores, with fp32 accumulation, whatever this says.)
  bool tf32 = false;
  // Fuse into the GEMMs, as cuBLASLt epilogues: the bias add and (bf16 / fp16) fc1's GELU with its
  // pre-activation in forward, the GELU derivative (bf16 / fp16) and the bias gradient in backward.
  // Off, or where cuBLASLt offers no algorithm for one: separate kernels (the same math, sums in
  // another order; fp32 runs always take core/math.h's GELU, cuBLASLt's is its own approximation).
  bool gemm_epilogues = true;
  // bf16 / fp16 attention through cuDNN's fused SDPA (core/cuda/attention/cudnn_attention.h) where this build
  // has it and cuDNN builds a graph for the shape; else, and in fp32 runs, the own flash kernels
  // (tensor cores for head dimension 32 / 64 / 128, else CUDA cores). The environment variable
  // TPTRAIN_CUDNN_ATTENTION=0 turns it off whatever this says.
  bool cudnn_attention = true;
  // cuDNN's backward with its deterministic algorithm (bitwise reproducible, as the own kernels;
  // more workspace). TPTRAIN_CUDNN_ATTENTION=nondeterministic turns it off (dQ summed with atomics).
  bool cudnn_deterministic = true;
};

// Number of CUDA devices visible to this process: 0 when there is no GPU (cudaErrorNoDevice) or no
// NVIDIA driver at all (no libcuda.so.1); any other CUDA error -- a driver too old for this CUDA
// runtime, a device that is busy or unavailable -- throws InternalError with CUDA's error string, so
// that a broken machine never passes for one without a GPU.
int cuda_device_count();
// cuda_device_count's rule: whether cudaGetDeviceCount's error (a cudaError_t) means "no GPU" rather
// than a failure, given whether the driver library libcuda.so.1 could be loaded.
bool cuda_error_means_no_gpu(int error, bool driver_library_found);
// "NVIDIA H200 (sm_90, 139.8 GiB)"; empty if the device does not exist.
std::string cuda_device_name(int device);
// Free memory of the current device in bytes (cudaMemGetInfo); -1 if it cannot be read.
int64_t cuda_free_memory();
// The device's 16-byte UUID (unique across machines); empty if it does not exist.
std::string cuda_device_uuid(int device);
// Makes `device` the current device of this process (its compute stream is created on it).
void cuda_set_device(int device);

std::unique_ptr<Ops> make_cuda_ops(int device, const CudaOptions& options = {});

}  // namespace tpt
