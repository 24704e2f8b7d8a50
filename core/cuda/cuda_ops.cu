// CudaOps: the Ops interface (core/ops.h) on one GPU. Memory is cudaMalloc'd device memory; every
// kernel, copy and GEMM runs in order on the process's compute stream, and only the calls that
// return values to the host (to_host, sum_squares, has_nonfinite) wait for it. GEMMs go through
// cuBLASLt (core/cuda/gemm.h), the rest through core/cuda/kernels.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>

#include "core/cuda/cuda_ops.h"
#include "core/cuda/gemm.h"
#include "core/cuda/kernels.h"

namespace tpt {
namespace cuda {

[[noreturn]] void fail(cudaError_t e, const char* what, const char* file, int line) {
  internal_error(std::string("CUDA call ") + what + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                 ") at " + file + ":" + std::to_string(line));
}

cudaStream_t compute_stream() {
  static cudaStream_t streams[64] = {};
  int device = 0;
  TPT_CUDA_CHECK(cudaGetDevice(&device));
  TPT_CHECK(device >= 0 && device < 64);
  // a blocking stream: it also stays ordered with anything issued on the legacy default stream
  if (!streams[device]) TPT_CUDA_CHECK(cudaStreamCreate(&streams[device]));
  return streams[device];
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

void* DeviceBuffer::get(size_t bytes) {
  if (p_ && bytes <= capacity_) return p_;
  if (p_) TPT_CUDA_CHECK(cudaFree(p_));  // waits for pending work that may still use it
  p_ = nullptr;
  capacity_ = 0;
  const size_t want = std::max(bytes + bytes / 4, size_t(1) << 20);
  if (cudaMalloc(&p_, want) != cudaSuccess) {
    (void)cudaGetLastError();
    p_ = nullptr;
    internal_error("out of GPU memory: " + std::to_string(want >> 20) +
                   " MiB of scratch (lower training.micro_batch_size or set training.recompute)");
  }
  capacity_ = want;
  return p_;
}

}  // namespace cuda

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: not an error here
    return 0;
  }
  return n;
}

std::string cuda_device_name(int device) {
  cudaDeviceProp prop{};
  if (device < 0 || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  char buf[320];
  snprintf(buf, sizeof(buf), "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
           double(prop.totalGlobalMem) / double(1u << 30));
  return buf;
}

std::string cuda_device_uuid(int device) {
  cudaDeviceProp prop{};
  if (device < 0 || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return std::string(prop.uuid.bytes, sizeof(prop.uuid.bytes));
}

void cuda_set_device(int device) { TPT_CUDA_CHECK(cudaSetDevice(device)); }

namespace {

using cuda::DeviceBuffer;
using cuda::Epilogue;
using cuda::Operand;

class CudaOps final : public Ops {
 public:
  CudaOps(int device, const CudaOptions& options) : device_(device), opt_(options) {
    const int count = cuda_device_count();
    if (device < 0 || device >= count)
      internal_error("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                     " visible)");
    cuda_set_device(device);
    stream_ = cuda::compute_stream();
    gemm_ = std::make_unique<cuda::LtGemm>(options.tf32, stream_);
    TPT_CUDA_CHECK(cudaMallocHost(&pinned_, 64));
  }
  ~CudaOps() override {
    cudaStreamSynchronize(stream_);
    if (pinned_) cudaFreeHost(pinned_);
  }

  std::string name() const override {
    std::string s = "cuda (device " + std::to_string(device_) + ": " + cuda_device_name(device_) + "; cuBLASLt ";
    if (opt_.gemm_inputs == DType::BF16) s += "bf16";
    else if (opt_.gemm_inputs == DType::F16) s += "fp16";
    else s += opt_.tf32 ? "tf32" : "fp32";
    return s + " GEMMs)";
  }

  // ---- memory

  float* alloc(size_t n) override {
    const size_t bytes = std::max<size_t>(256, (n * sizeof(float) + 255) / 256 * 256);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      char msg[256];
      snprintf(msg, sizeof(msg),
               "out of GPU memory on device %d: allocating %.1f MiB with %.1f MiB of %.1f MiB free "
               "(lower training.micro_batch_size or set training.recompute)",
               device_, double(bytes) / 1048576.0, double(free_b) / 1048576.0, double(total_b) / 1048576.0);
      internal_error(msg);
    }
    TPT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    alloc_sizes_[p] = bytes;
    allocated_ += int64_t(bytes);
    peak_ = std::max(peak_, allocated_);
    return static_cast<float*>(p);
  }
  void free(float* p) override {
    if (!p) return;
    auto it = alloc_sizes_.find(p);
    if (it != alloc_sizes_.end()) {
      allocated_ -= int64_t(it->second);
      alloc_sizes_.erase(it);
    }
    TPT_CUDA_CHECK(cudaFree(p));
  }
  // alloc()'s device memory only (the backend's own scratch and cuBLASLt's workspace are not counted)
  int64_t allocated_bytes() const override { return allocated_; }
  int64_t peak_allocated_bytes() const override { return peak_; }
  void zero(float* p, size_t n) override {
    if (n) TPT_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_));
  }
  void copy(float* dst, const float* src, size_t n) override {
    if (n && dst != src) TPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }
  void to_host(float* host, const float* dev, size_t n) override {
    if (!n) return;
    TPT_CUDA_CHECK(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    TPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void to_device(float* dev, const float* host, size_t n) override {
    if (!n) return;
    TPT_CUDA_CHECK(cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    TPT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host buffer may go away on return
  }

  // ---- GEMMs

  void linear_forward(float* out, const float* inp, const float* w, const float* bias, int64_t N, int64_t I,
                      int64_t O) override {
    if (N <= 0 || O <= 0) return;
    const DType t = opt_.gemm_inputs;
    const Operand A{operand(a16_, inp, N * I), I};          // (N, I)
    const Operand B{operand(b16_, w, O * I), I, true};      // w (O, I) used as (I, O)
    if (bias && opt_.gemm_epilogues &&
        gemm_->run(N, O, I, A, B, out, O, 0, 1, 1.0f, 0.0f, t, Epilogue::Bias, const_cast<float*>(bias)))
      return;
    if (bias) cuda::broadcast_rows(out, bias, N, O, stream_);
    gemm_->run(N, O, I, A, B, out, O, 0, 1, 1.0f, bias ? 1.0f : 0.0f, t);
  }

  void linear_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                       int64_t N, int64_t I, int64_t O, bool accumulate_dinp) override {
    if (N <= 0) return;
    const DType t = opt_.gemm_inputs;
    const void* dout_p = operand(a16_, dout, N * O);
    if (dinp)  // dinp (N, I) = / += dout (N, O) @ w (O, I)
      gemm_->run(N, I, O, Operand{dout_p, O}, Operand{operand(b16_, w, O * I), I}, dinp, I, 0, 1, 1.0f,
                 accumulate_dinp ? 1.0f : 0.0f, t);
    // dw (O, I) += dout^T (O, N) @ inp (N, I); dbias (O) += row sums of dout^T
    const Operand A{dout_p, O, true}, B{operand(c16_, inp, N * I), I};
    if (dbias && opt_.gemm_epilogues) {
      float* tmp = bias_grad_.as<float>(size_t(O));
      if (gemm_->run(O, I, N, A, B, dw, I, 0, 1, 1.0f, 1.0f, t, Epilogue::BiasGrad, tmp)) {
        cuda::accumulate(dbias, tmp, O, stream_);
        return;
      }
    }
    gemm_->run(O, I, N, A, B, dw, I, 0, 1, 1.0f, 1.0f, t);
    if (dbias) cuda::add_column_sums(dbias, dout, N, O, scratch_, stream_);
  }

  // ---- attention: flash-style kernels, on the tensor cores in bf16 / fp16 runs where the head
  // dimension allows (core/cuda/attention_tc.cu), else fp32 on the CUDA cores (attention.cu)

  void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                         int64_t D) override {
    if (cuda::tc_attention_supported(D, opt_.gemm_inputs))
      cuda::tc_flash_attention_forward(out, lse, qkv, B, T, H, D, opt_.gemm_inputs, stream_);
    else
      cuda::flash_attention_forward(out, lse, qkv, B, T, H, D, stream_);
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* out,
                          const float* lse, int64_t B, int64_t T, int64_t H, int64_t D) override {
    if (cuda::tc_attention_supported(D, opt_.gemm_inputs))
      cuda::tc_flash_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, H, D, opt_.gemm_inputs, stream_);
    else
      cuda::flash_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, H, D, stream_);
  }

  // ---- element-wise and rows

  void gelu_forward(float* out, const float* inp, int64_t n) override { cuda::gelu_forward(out, inp, n, stream_); }
  void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) override {
    cuda::gelu_backward(dinp, dout, inp, n, stream_);
  }
  void add(float* out, const float* a, const float* b, int64_t n) override { cuda::add(out, a, b, n, stream_); }
  void accumulate(float* y, const float* x, int64_t n) override { cuda::accumulate(y, x, n, stream_); }
  void scale(float* x, float s, int64_t n) override { cuda::scale(x, s, n, stream_); }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         int64_t N, int64_t C, float eps) override {
    cuda::layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps, stream_);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int64_t N, int64_t C) override {
    cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch_, stream_);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N, int64_t C, int64_t v0,
                         int64_t rows) override {
    cuda::embedding_forward(out, tokens, wte, N, C, v0, rows, stream_);
  }
  void embedding_backward(float* dwte, const int32_t* tokens, const float* dout, int64_t N, int64_t C, int64_t v0,
                          int64_t rows) override {
    cuda::embedding_backward(dwte, tokens, dout, N, C, v0, rows, scratch_, stream_);
  }
  void add_position_embedding(float* out, const float* wpe, int64_t B, int64_t T, int64_t C) override {
    cuda::add_position_embedding(out, wpe, B, T, C, stream_);
  }
  void position_embedding_backward(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C) override {
    cuda::position_embedding_backward(dwpe, dout, B, T, C, stream_);
  }

  void xent_local_max(float* row_max, float* target_logit, const float* logits, const int32_t* targets, int64_t N,
                      int64_t Vl, int64_t v0, int64_t valid_vocab) override {
    cuda::xent_local_max(row_max, target_logit, logits, targets, N, Vl, v0, valid_vocab, stream_);
  }
  void xent_local_sumexp(float* sum_exp, float* logits, const float* row_max, int64_t N, int64_t Vl, int64_t v0,
                         int64_t valid_vocab) override {
    cuda::xent_local_sumexp(sum_exp, logits, row_max, N, Vl, v0, valid_vocab, stream_);
  }
  void xent_backward_inplace(float* exps, float* losses, const float* row_max, const float* sum_exp,
                             const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                             int64_t valid_vocab, float dloss_scale, bool want_grad) override {
    cuda::xent_backward_inplace(exps, losses, row_max, sum_exp, target_logit, targets, N, Vl, v0, valid_vocab,
                                dloss_scale, want_grad, stream_);
  }

  // ---- mixed precision, norms, optimizer

  void round_to(float* x, int64_t n, DType t) override { cuda::round_to(x, n, t, stream_); }
  bool has_nonfinite(const float* x, int64_t n) override {
    return cuda::has_nonfinite(x, n, scratch_, static_cast<int*>(pinned_), stream_);
  }
  void pack_half(uint16_t* dst, const float* src, int64_t n, DType t) override {
    cuda::pack_half(dst, src, n, t, stream_);
  }
  void unpack_half(float* dst, const uint16_t* src, int64_t n, DType t) override {
    cuda::unpack_half(dst, src, n, t, stream_);
  }
  double sum_squares(const float* x, int64_t n) override {
    return cuda::sum_squares(x, n, scratch_, static_cast<double*>(pinned_), stream_);
  }
  void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a, bool decay,
             float* compute, DType t) override {
    cuda::adamw(p, g, m, v, n, a, decay, compute, t, stream_);
  }

 private:
  // A GEMM operand of n floats: itself for fp32 GEMMs, else its 16-bit copy in `buf` (exact: the
  // values are representable, see CudaOptions::gemm_inputs).
  const void* operand(DeviceBuffer& buf, const float* x, int64_t n) {
    if (opt_.gemm_inputs == DType::F32) return x;
    uint16_t* h = buf.as<uint16_t>(size_t(n));
    cuda::pack_half(h, x, n, opt_.gemm_inputs, stream_);
    return h;
  }
  int device_;
  CudaOptions opt_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::LtGemm> gemm_;
  DeviceBuffer scratch_;         // partial sums, sort buffers, reduction results
  DeviceBuffer a16_, b16_, c16_;  // 16-bit GEMM operands
  DeviceBuffer bias_grad_;       // the bias-gradient epilogue's output before it is accumulated
  void* pinned_ = nullptr;       // page-locked host memory for reduction results
  std::unordered_map<void*, size_t> alloc_sizes_;  // allocation accounting (single-threaded use)
  int64_t allocated_ = 0, peak_ = 0;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(int device, const CudaOptions& options) {
  return std::make_unique<CudaOps>(device, options);
}

}  // namespace tpt
