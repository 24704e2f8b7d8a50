// Shared by the CUDA backend's translation units and by NcclComm: error checks that turn CUDA
// failures into InternalError, the process's compute stream, and growable device scratch buffers.
// Compiles with nvcc and with the host compiler (runtime API only).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace tpt::cuda {

// Throws InternalError naming the failed call, the CUDA error and the place.
[[noreturn]] void fail(cudaError_t e, const char* what, const char* file, int line);
inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) fail(e, what, file, line);
}

// The stream every kernel, copy, GEMM and NCCL collective of this thread runs on, one per thread and
// device (created on the current device at first use). A rank is a process with one thread issuing
// GPU work; the one-GPU 3D tests run ranks as threads of one process, each with its own stream.
cudaStream_t compute_stream();

// Host waits for the device: until `stream` has drained (or `event` has completed), polling instead
// of blocking in the driver. While it waits it calls the poll hook about once a millisecond (NCCL's
// asynchronous errors, parallel/nccl_comm.cpp: a failed collective then ends the wait with an
// error instead of leaving the stream spinning forever) and it counts as one communication wait of
// the watchdog (core/watchdog.h: parallel.distributed_timeout_minutes), since collectives of the
// GPU's groups run on the stream. Throws InternalError on a CUDA error or what the hook throws.
void stream_wait(cudaStream_t stream);
void event_wait(cudaEvent_t event);
// The function stream_wait calls while it waits (one per process, nullptr for none).
void set_wait_poll(void (*poll)());

// Device memory that is reused across calls (all on the compute stream, so a later kernel never
// races an earlier one on it): reserve() sizes it at start-up (exactly), get() returns it, growing
// it when a call needs more than it holds. Growing frees the old block after waiting for the
// stream. Each cudaMalloc / cudaFree adds one to *calls (the backend's allocator count), if given.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t* calls = nullptr) : calls_(calls) {}
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void reserve(size_t bytes) {
    if (bytes > 0) resize(bytes, bytes);
  }
  void* get(size_t bytes) {
    if (!p_ || bytes > capacity_) resize(bytes, bytes + bytes / 4);
    return p_;
  }
  template <class T>
  T* as(size_t count) {
    return static_cast<T*>(get(count * sizeof(T)));
  }
  size_t capacity() const { return capacity_; }

 private:
  // to `want` bytes (at least core/gpu_workspace.h's 1 MiB) unless it holds `need` already
  void resize(size_t need, size_t want);
  void* p_ = nullptr;
  size_t capacity_ = 0;
  int64_t* calls_ = nullptr;
};

}  // namespace tpt::cuda

#define TPT_CUDA_CHECK(call) ::tpt::cuda::check((call), #call, __FILE__, __LINE__)
