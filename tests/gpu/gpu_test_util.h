// Helpers of the GPU tests: random host data, device buffers of a backend, element-wise comparison.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/cuda_ops.h"
#include "core/ops.h"

namespace tpt::gpu_test {

using VecF = std::vector<float>;

inline VecF randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  VecF v(n);
  for (float& x : v) x = nd(gen);
  return v;
}

inline VecF rounded(VecF v, DType t) {
  for (float& x : v) x = round_to(x, t);
  return v;
}

// A buffer of n floats on a backend's device, freed with it.
class Buf {
 public:
  Buf(Ops& ops, size_t n) : ops_(&ops), n_(n), p_(ops.alloc(n)) {}
  Buf(Ops& ops, const VecF& host) : Buf(ops, host.size()) { ops.to_device(p_, host.data(), host.size()); }
  Buf(Ops& ops, const std::vector<int32_t>& host) : Buf(ops, host.size()) {
    ops.to_device(p_, reinterpret_cast<const float*>(host.data()), host.size());
  }
  ~Buf() { ops_->free(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  float* get() const { return p_; }
  operator float*() const { return p_; }
  int32_t* ints() const { return reinterpret_cast<int32_t*>(p_); }
  uint16_t* halves() const { return reinterpret_cast<uint16_t*>(p_); }
  VecF host() const {
    VecF h(n_);
    ops_->to_host(h.data(), p_, n_);
    return h;
  }

 private:
  Ops* ops_;
  size_t n_;
  float* p_;
};

// The same buffer on the CPU and the GPU backend.
struct Pair {
  Buf cpu, gpu;
  Pair(Ops& c, Ops& g, const VecF& host) : cpu(c, host), gpu(g, host) {}
  Pair(Ops& c, Ops& g, const std::vector<int32_t>& host) : cpu(c, host), gpu(g, host) {}
};

// |gpu - cpu| <= atol + rtol * |cpu| everywhere; reports the worst element.
inline ::testing::AssertionResult close(const VecF& gpu, const VecF& cpu, double rtol, double atol) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "sizes differ";
  double worst = 0;
  size_t at = cpu.size();  // none yet
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double g = gpu[i], c = cpu[i];
    if (g == c || (std::isnan(g) && std::isnan(c))) continue;  // also equal infinities
    const double err = std::fabs(g - c), allowed = atol + rtol * std::fabs(c);
    if (err <= allowed) continue;
    const double excess = std::isnan(err) ? INFINITY : err - allowed;
    if (at == cpu.size() || excess > worst) worst = excess, at = i;
  }
  if (at == cpu.size()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << " of " << cpu.size() << ": gpu " << gpu[at] << " cpu "
                                       << cpu[at] << " (rtol " << rtol << ", atol " << atol << ")";
}

inline ::testing::AssertionResult bitwise(const VecF& gpu, const VecF& cpu) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < cpu.size(); ++i)
    if (std::memcmp(&gpu[i], &cpu[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": gpu " << gpu[i] << " cpu " << cpu[i];
  return ::testing::AssertionSuccess();
}

inline std::unique_ptr<Ops> cpu_ops() { return make_cpu_ops(4); }
inline std::unique_ptr<Ops> gpu_ops(const CudaOptions& o = {}) { return make_cuda_ops(0, o); }

}  // namespace tpt::gpu_test
