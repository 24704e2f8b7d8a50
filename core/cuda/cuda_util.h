// Shared by the CUDA backend's translation units and by NcclComm: error checks that turn CUDA
// failures into InternalError, the process's compute stream, and growable device scratch buffers.
// Compiles with nvcc and with the host compiler (runtime API only).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "core/error.h"

namespace tpt::cuda {

// Throws InternalError naming the failed call, the CUDA error and the place.
[[noreturn]] void fail(cudaError_t e, const char* what, const char* file, int line);
inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) fail(e, what, file, line);
}

// The one stream every kernel, copy, GEMM and NCCL collective of this process runs on (created on
// the current device at first use; the process uses one device).
cudaStream_t compute_stream();

// Device memory that grows on demand and is reused across calls (all on the compute stream, so a
// later kernel never races an earlier one on it). Growing frees the old block: cudaFree waits for
// the device, so pending work on it completes first.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get(size_t bytes);
  template <class T>
  T* as(size_t count) {
    return static_cast<T*>(get(count * sizeof(T)));
  }

 private:
  void* p_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace tpt::cuda

#define TPT_CUDA_CHECK(call) ::tpt::cuda::check((call), #call, __FILE__, __LINE__)
