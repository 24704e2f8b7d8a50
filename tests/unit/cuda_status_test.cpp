// CUDA builds only: which CUDA errors at start-up mean "no GPU" (the GPU tests then skip, exit 77)
// and which are failures (core/cuda/cuda_ops.h cuda_device_count). Needs no GPU; on a machine
// without an NVIDIA driver cuda_device_count must say 0 rather than throw.
#ifdef TPTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "core/cuda/cuda_ops.h"

namespace tpt {

TEST(CudaStatus, OnlyNoDeviceOrNoDriverMeansNoGpu) {
  EXPECT_TRUE(cuda_error_means_no_gpu(cudaErrorNoDevice, true));
  EXPECT_TRUE(cuda_error_means_no_gpu(cudaErrorNoDevice, false));
  // no libcuda.so.1: the runtime reports an "insufficient driver"; with the library it is one
  EXPECT_TRUE(cuda_error_means_no_gpu(cudaErrorInsufficientDriver, false));
  EXPECT_FALSE(cuda_error_means_no_gpu(cudaErrorInsufficientDriver, true));
  for (cudaError_t e : {cudaErrorDevicesUnavailable, cudaErrorInitializationError, cudaErrorSystemNotReady,
                        cudaErrorCompatNotSupportedOnDevice, cudaErrorMemoryAllocation})
    EXPECT_FALSE(cuda_error_means_no_gpu(e, false)) << cudaGetErrorName(e);
}

TEST(CudaStatus, DeviceCountWithoutDriverIsZero) {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver) {
    dlclose(driver);
    GTEST_SKIP() << "an NVIDIA driver is installed here";
  }
  EXPECT_EQ(cuda_device_count(), 0);
}

}  // namespace tpt
#endif  // TPTRAIN_HAVE_CUDA
