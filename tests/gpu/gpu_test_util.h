// Helpers of the GPU tests: random host data, typed device buffers of a backend, element-wise
// comparison.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/cuda_ops.h"
#include "core/error.h"
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

inline const char* dtype_name(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F16 ? "fp16" : "fp32"; }

// Host floats as the raw storage of dtype t (rounded to nearest even), and back.
inline std::vector<char> to_storage(const VecF& v, DType t) {
  std::vector<char> out(v.size() * size_t(dtype_bytes(t)));
  if (t == DType::F32) {
    if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  auto* h = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < v.size(); ++i) h[i] = t == DType::BF16 ? fp32_to_bf16(v[i]) : fp32_to_fp16(v[i]);
  return out;
}
inline VecF from_storage(const char* p, size_t n, DType t) {
  VecF v(n);
  if (t == DType::F32) {
    if (n) std::memcpy(v.data(), p, n * sizeof(float));
    return v;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  for (size_t i = 0; i < n; ++i) v[i] = t == DType::BF16 ? bf16_to_fp32(h[i]) : fp16_to_fp32(h[i]);
  return v;
}

// n elements of dtype t on a backend's device, freed with it. Converts to a Buf / CBuf of its
// dtype, and to float* (fp32 buffers only: statistics, gradients).
class Dev {
 public:
  Dev(Ops& ops, size_t n, DType t = DType::F32) : ops_(&ops), n_(n), t_(t), p_(ops.alloc_bytes(n * size_t(dtype_bytes(t)))) {}
  Dev(Ops& ops, const VecF& host, DType t = DType::F32) : Dev(ops, host.size(), t) { upload(host); }
  Dev(Ops& ops, const std::vector<int32_t>& host) : Dev(ops, host.size()) {
    ops.to_device(Buf(p_, DType::F32), host.data(), int64_t(host.size()));
  }
  ~Dev() { ops_->free(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;

  Buf buf() const { return {p_, t_}; }
  operator Buf() const { return buf(); }
  operator CBuf() const { return buf(); }
  operator float*() const { return f32(); }
  float* f32() const {
    TPT_CHECK(t_ == DType::F32);
    return static_cast<float*>(p_);
  }
  int32_t* ints() const { return static_cast<int32_t*>(p_); }
  DType dtype() const { return t_; }
  size_t size() const { return n_; }

  // host floats -> the device, rounded to the dtype
  void upload(const VecF& host) {
    TPT_CHECK(host.size() == n_);
    const std::vector<char> raw = to_storage(host, t_);
    ops_->to_device(buf(), raw.data(), int64_t(n_));
  }
  // the stored values as floats
  VecF host() const {
    std::vector<char> raw(n_ * size_t(dtype_bytes(t_)));
    ops_->to_host(raw.data(), buf(), int64_t(n_));
    return from_storage(raw.data(), n_, t_);
  }

 private:
  Ops* ops_;
  size_t n_;
  DType t_;
  void* p_;
};

// The same buffer on the CPU and the GPU backend.
struct Pair {
  Dev cpu, gpu;
  Pair(Ops& c, Ops& g, const VecF& host, DType t = DType::F32) : cpu(c, host, t), gpu(g, host, t) {}
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

// Relative rounding step of a stored value of dtype t (fp32: 0): a result computed in fp32 from the
// same inputs in another order may land one such step away after rounding.
inline double ulp(DType t) { return t == DType::BF16 ? 1.0 / 128 : t == DType::F16 ? 1.0 / 1024 : 0.0; }

inline std::unique_ptr<Ops> cpu_ops() { return make_cpu_ops(4); }
inline std::unique_ptr<Ops> gpu_ops(const CudaOptions& o = {}) { return make_cuda_ops(0, o); }

// Options whose attention is always the own flash kernels (no cuDNN), for the tests of those kernels.
inline CudaOptions own_attention() {
  CudaOptions o;
  o.cudnn_attention = false;
  return o;
}

// Milliseconds per call of f on the backend's stream (the benchmarks): one call first (graphs built,
// algorithms chosen), then the mean of reps.
inline double time_ms(Ops& ops, const std::function<void()>& f, int reps) {
  f();
  ops.clear_marks();
  const int64_t a = ops.mark();
  for (int i = 0; i < reps; ++i) f();
  const int64_t b = ops.mark();
  return (ops.mark_ms(b) - ops.mark_ms(a)) / reps;
}

}  // namespace tpt::gpu_test
