// CudaOps: the Ops interface (core/ops.h) on one GPU. Memory is cudaMalloc'd device memory; every
// kernel, copy and GEMM runs in order on the process's compute stream, and only the calls that
// return values to the host (to_host, to_device, sum_squares, has_nonfinite) wait for it. GEMMs go
// through cuBLASLt (core/cuda/gemm.h), the rest through core/cuda/kernels.h. Tensors are stored in
// their own dtype (Buf / CBuf): no conversion or packing pass anywhere.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/cuda/attention/cudnn_attention.h"
#include "core/cuda/attention/ring_attention.h"
#include "core/cuda/cuda_ops.h"
#include "core/cuda/fp8_gemm.h"
#include "core/cuda/gemm.h"
#include "core/cuda/kernels.h"
#include "core/gpu_workspace.h"
#include "core/watchdog.h"

namespace tpt {
namespace cuda {

[[noreturn]] void fail(cudaError_t e, const char* what, const char* file, int line) {
  internal_error(std::string("CUDA call ") + what + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                 ") at " + file + ":" + std::to_string(line));
}

cudaStream_t compute_stream() {
  // per thread and device; never destroyed (a rank's stream lives as long as its process; the few
  // threads of a threads-as-ranks test leave theirs to process exit)
  thread_local cudaStream_t streams[64] = {};
  int device = 0;
  TPT_CUDA_CHECK(cudaGetDevice(&device));
  TPT_CHECK(device >= 0 && device < 64);
  // a blocking stream: it also stays ordered with anything issued on the legacy default stream
  if (!streams[device]) TPT_CUDA_CHECK(cudaStreamCreate(&streams[device]));
  return streams[device];
}

namespace {
std::atomic<void (*)()> g_wait_poll{nullptr};

template <class Query>
void poll_until_done(Query query, const char* what) {
  CommWait wait(what, "the kernels and collectives queued on this GPU stream");
  auto last_poll = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = query();
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) fail(e, what, __FILE__, __LINE__);
    const auto now = std::chrono::steady_clock::now();
    if (now - last_poll >= std::chrono::milliseconds(1)) {
      last_poll = now;
      if (auto poll = g_wait_poll.load()) poll();
    }
    std::this_thread::yield();
  }
}
}  // namespace

void set_wait_poll(void (*poll)()) { g_wait_poll = poll; }
void stream_wait(cudaStream_t stream) {
  poll_until_done([stream] { return cudaStreamQuery(stream); }, "cudaStreamQuery (a host wait for the GPU)");
}
void event_wait(cudaEvent_t event) {
  poll_until_done([event] { return cudaEventQuery(event); }, "cudaEventQuery (a host wait for the GPU)");
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

void DeviceBuffer::resize(size_t need, size_t want) {
  if (p_ && need <= capacity_) return;
  if (p_) {
    stream_wait(compute_stream());  // pending work may still use it (bounded, unlike cudaFree's own wait)
    TPT_CUDA_CHECK(cudaFree(p_));
    if (calls_) ++*calls_;
  }
  p_ = nullptr;
  capacity_ = 0;
  want = std::max(want, size_t(kMinDeviceBufferBytes));
  if (calls_) ++*calls_;
  if (cudaMalloc(&p_, want) != cudaSuccess) {
    (void)cudaGetLastError();
    p_ = nullptr;
    internal_error("out of GPU memory: " + std::to_string(want >> 20) +
                   " MiB of scratch (lower training.micro_batch_size or set training.recompute)");
  }
  capacity_ = want;
}

}  // namespace cuda

bool cuda_error_means_no_gpu(int error, bool driver_library_found) {
  // with no libcuda.so.1 at all the runtime answers cudaErrorInsufficientDriver as for a driver
  // that is too old: only the absence of the library tells the two apart
  return error == cudaErrorNoDevice || (error == cudaErrorInsufficientDriver && !driver_library_found);
}

int cuda_device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess) return n;
  (void)cudaGetLastError();
  bool driver_found = false;
  if (void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    driver_found = true;
    dlclose(lib);
  }
  if (cuda_error_means_no_gpu(int(e), driver_found)) return 0;
  internal_error(std::string("CUDA cannot count the GPUs: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                 ")" + (driver_found ? "" : "; no NVIDIA driver library libcuda.so.1 found"));
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

int64_t cuda_free_memory() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return int64_t(free_b);
}

void cuda_set_device(int device) { TPT_CUDA_CHECK(cudaSetDevice(device)); }

namespace {

using cuda::DeviceBuffer;
using cuda::Epilogue;
using cuda::EpilogueArgs;
using cuda::Operand;

// The weight gradients are the gradient buffer's: fp32, or bf16 (parallel.grad_reduce_in_bf16), where
// each call adds its fp32 contribution to the stored value and rounds once, as on the CPU backend:
// cuBLASLt's beta = 1 with a bf16 C for the GEMMs of 16-bit inputs, GradPtr in the other kernels
// (core/cuda/device_util.h).
bool bf16_grad(CBuf g) { return g && g.t == DType::BF16; }

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
    fp8_ = std::make_unique<cuda::Fp8Gemms>(*gemm_, stream_, opt_.gemm_epilogues, &allocator_calls_);
    TPT_CUDA_CHECK(cudaMallocHost(&pinned_, 64));
    // cuDNN attention: TPTRAIN_CUDNN_ATTENTION=0 forces the own kernels
    const char* env = std::getenv("TPTRAIN_CUDNN_ATTENTION");
    if (env && std::strcmp(env, "0") == 0) opt_.cudnn_attention = false;
    if (opt_.cudnn_attention && cuda::cudnn_attention_built())
      cudnn_ = std::make_unique<cuda::CudnnAttention>(stream_, opt_.cudnn_deterministic, &allocator_calls_);
  }
  ~CudaOps() override {
    cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (pinned_) cudaFreeHost(pinned_);
  }

  std::string name() const override {
    return "cuda (device " + std::to_string(device_) + ": " + cuda_device_name(device_) +
           "; cuBLASLt GEMMs in the compute dtype, fp32 " + (opt_.tf32 ? "on TF32" : "exact") +
           (opt_.gemm_epilogues ? ", epilogues" : ", no epilogues") + "; attention: " + attention_name() + ")";
  }

  // Which attention runs: "cuDNN SDPA (cuDNN 9.19.0 loaded, ...) for bf16/fp16, own flash kernels
  // otherwise", or the own kernels and why not cuDNN.
  std::string attention_name() const {
    if (cudnn_)
      return cuda::cudnn_attention_version() + " for bf16/fp16" +
             (opt_.cudnn_deterministic ? "" : " (nondeterministic backward)") +
             ", own flash kernels otherwise (fp32, shapes cuDNN rejects)";
    return std::string("own flash kernels (") +
           (!cuda::cudnn_attention_built() ? "built without cuDNN"
                                           : "cuDNN SDPA off: TPTRAIN_CUDNN_ATTENTION=0 or CudaOptions") +
           ")";
  }

  // ---- memory

  void* alloc_bytes(size_t n) override {
    const size_t bytes = std::max<size_t>(256, (n + 255) / 256 * 256);
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
    ++allocator_calls_;
    alloc_sizes_[p] = bytes;
    allocated_ += int64_t(bytes);
    peak_ = std::max(peak_, allocated_);
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    auto it = alloc_sizes_.find(p);
    if (it != alloc_sizes_.end()) {
      allocated_ -= int64_t(it->second);
      alloc_sizes_.erase(it);
    }
    TPT_CUDA_CHECK(cudaFree(p));
    ++allocator_calls_;
  }
  // page-locked, so that to_host / to_device copy at the link's speed
  void* alloc_host(size_t bytes) override {
    void* p = nullptr;
    if (cudaMallocHost(&p, std::max<size_t>(bytes, 1)) != cudaSuccess) {
      (void)cudaGetLastError();
      internal_error("cannot allocate " + std::to_string(bytes) + " bytes of pinned host memory (cudaMallocHost)");
    }
    std::memset(p, 0, bytes);
    return p;
  }
  void free_host(void* p) override {
    if (p) TPT_CUDA_CHECK(cudaFreeHost(p));
  }
  // alloc_bytes()'s device memory only (the backend's own buffers: reserve_workspace)
  int64_t allocated_bytes() const override { return allocated_; }
  int64_t peak_allocated_bytes() const override { return peak_; }
  int64_t allocator_calls() const override { return allocator_calls_; }
  BackendWorkspace reserve_workspace(const BackendWorkspace& planned, const AttentionShape& a) override {
    scratch_.reserve(size_t(planned.scratch));
    bias_grad_.reserve(size_t(planned.bias_grad));
    fp8_->reserve(planned.fp8);
    BackendWorkspace held;
    held.gemm = kGemmWorkspaceBytes;  // cuBLASLt's, allocated with the backend
    held.scratch = int64_t(scratch_.capacity());
    held.bias_grad = int64_t(bias_grad_.capacity());
    held.fallback = int64_t(gemm_f32_.capacity()) + fp8_->fallback_bytes();
    held.fp8 = fp8_->workspace_bytes();
    if (cudnn_) {
      // cuDNN's graphs for the shape built now; the workspace as they ask (the plan's count is the
      // fit check's; the trainer reports both)
      const auto p = a.ring ? cudnn_->prepare_ring(a.B, a.T, a.H, a.KV, a.D, a.t)
                            : cudnn_->prepare(a.B, a.T, a.H, a.KV, a.D, a.t, 0);
      held.attention = p.held;
      held.attention_forward_asked = p.forward;
      held.attention_backward_asked = p.backward;
    }
    return held;
  }
  void zero(Buf p, int64_t n) override {
    if (n > 0) TPT_CUDA_CHECK(cudaMemsetAsync(p.p, 0, size_t(dtype_size(n, p.t)), stream_));
  }
  void copy(Buf dst, CBuf src, int64_t n) override {
    TPT_CHECK(dst.t == src.t);
    if (n > 0 && dst.p != src.p)
      TPT_CUDA_CHECK(
          cudaMemcpyAsync(dst.p, src.p, size_t(dtype_size(n, src.t)), cudaMemcpyDeviceToDevice, stream_));
  }
  void to_host(void* host, CBuf dev, int64_t n) override {
    if (n <= 0) return;
    TPT_CUDA_CHECK(cudaMemcpyAsync(host, dev.p, size_t(dtype_size(n, dev.t)), cudaMemcpyDeviceToHost, stream_));
    cuda::stream_wait(stream_);
  }
  void to_device(Buf dev, const void* host, int64_t n) override {
    if (n <= 0) return;
    TPT_CUDA_CHECK(cudaMemcpyAsync(dev.p, host, size_t(dtype_size(n, dev.t)), cudaMemcpyHostToDevice, stream_));
    cuda::stream_wait(stream_);  // the host buffer may go away on return
  }
  void convert(Buf dst, CBuf src, int64_t n) override { cuda::convert(dst, src, n, stream_); }
  void master_copy(Buf dst, const float* master, int64_t n) override { cuda::master_copy(dst, master, n, stream_); }

  // ---- GEMMs: operands as stored (fp32, or bf16 / fp16 on the tensor cores), fp32 accumulation,
  // outputs in their dtype; epilogues where cuBLASLt has them, else the separate kernels below

  void linear_forward(Buf out, CBuf inp, CBuf w, CBuf bias, int64_t N, int64_t I, int64_t O,
                      Buf gelu_pre) override {
    if (N <= 0 || O <= 0) return;
    const DType t = out.t;
    TPT_CHECK(inp.t == t && w.t == t && (!bias || bias.t == t) && (!gelu_pre || gelu_pre.t == t));
    const Operand A{inp.p, I};        // (N, I)
    const Operand B{w.p, I, true};    // w (O, I) used as (I, O)
    if (!gelu_pre) {
      // the BIAS epilogue at widths a multiple of 8: at others (131) cuBLASLt's kernel added the bias to
      // the 16-bit rounded products on an H200 (the path below rounds once)
      if (bias && opt_.gemm_epilogues && (t == DType::F32 || O % 8 == 0) &&
          gemm_->run(N, O, I, A, B, out.p, t, O, 0, 1, 1.0f, 0.0f, t, {Epilogue::Bias, bias.p}))
        return;
      if (!bias || t == DType::F32) {
        if (bias) cuda::broadcast_rows(out, bias, N, O, stream_);  // then the GEMM adds the products
        gemm_->run(N, O, I, A, B, out.p, t, O, 0, 1, 1.0f, bias ? 1.0f : 0.0f, t);
        return;
      }
      // 16-bit: the fp32 products, then the bias, rounded once (cuBLASLt's beta = 1 with a 16-bit C
      // rounds the products first: bf16(p) + b on an H200, 0.0469 for 0.0541)
      float* acc = gemm_f32_.as<float>(size_t(N * O));
      gemm_->run(N, O, I, A, B, acc, DType::F32, O, 0, 1, 1.0f, 0.0f, t);
      cuda::bias_store(out, acc, bias, N, O, stream_);
      return;
    }
    // fc1 with its GELU: pre = x w^T + b, gelu_pre = pre, out = gelu(pre), both rounded from fp32.
    // cuBLASLt's GELU is its own approximation of the tanh form: bf16 / fp16 runs take it (their
    // rounding is far coarser), fp32 runs keep the shared gelu() of core/math.h, as the CPU.
    if (opt_.gemm_epilogues && t != DType::F32 &&
        gemm_->run(N, O, I, A, B, out.p, t, O, 0, 1, 1.0f, 0.0f, t, {Epilogue::GeluAux, bias.p, gelu_pre.p, O}))
      return;
    // fallback: the fp32 products (in gelu_pre itself when that is fp32), then bias and GELU
    float* acc = t == DType::F32 ? gelu_pre.f32() : gemm_f32_.as<float>(size_t(N * O));
    gemm_->run(N, O, I, A, B, acc, DType::F32, O, 0, 1, 1.0f, 0.0f, t);
    cuda::bias_gelu_forward(out, gelu_pre, acc, bias, N, O, stream_);
  }

  void linear_backward(Buf dinp, Buf dw_grad, Buf dbias_grad, CBuf dout, CBuf inp, CBuf w, int64_t N, int64_t I,
                       int64_t O, bool accumulate_dinp, CBuf gelu_pre) override {
    const Buf dw = dw_grad, dbias = dbias_grad;
    if (N <= 0) return;
    const DType t = dout.t;
    TPT_CHECK((!dw || inp.t == t) && (!dinp || (dinp.t == t && w.t == t)) && (!gelu_pre || gelu_pre.t == t));
    TPT_CHECK(!(gelu_pre && accumulate_dinp));
    if (dinp && I > 0) {  // dinp (N, I) = / += dout (N, O) @ w (O, I)
      const Operand A{dout.p, O}, B{w.p, I};
      if (!gelu_pre && (!accumulate_dinp || t == DType::F32)) {
        gemm_->run(N, I, O, A, B, dinp.p, t, I, 0, 1, 1.0f, accumulate_dinp ? 1.0f : 0.0f, t);
      } else if (!gelu_pre) {  // += into 16-bit: the fp32 product added and rounded once (as the bias above)
        float* acc = gemm_f32_.as<float>(size_t(N * I));
        gemm_->run(N, I, O, A, B, acc, DType::F32, I, 0, 1, 1.0f, 0.0f, t);
        cuda::accumulate_f32(dinp, acc, N * I, stream_);
      } else if (!(opt_.gemm_epilogues && t != DType::F32 &&  // DGELU: as GELU_AUX above
                   gemm_->run(N, I, O, A, B, dinp.p, t, I, 0, 1, 1.0f, 0.0f, t,
                              {Epilogue::DGelu, nullptr, const_cast<void*>(gelu_pre.p), I}))) {
        // fallback: the fp32 product (in dinp itself when that is fp32), times gelu'(pre), rounded once
        float* acc = t == DType::F32 ? dinp.f32() : gemm_f32_.as<float>(size_t(N * I));
        gemm_->run(N, I, O, A, B, acc, DType::F32, I, 0, 1, 1.0f, 0.0f, t);
        cuda::gelu_backward(dinp, acc, gelu_pre, N * I, stream_);
      }
    }
    if (O <= 0) return;
    if (!dw) {  // no weight gradient (ZB-H1's B): only the bias's, as the fallback below computes it
      if (dbias) cuda::add_column_sums(dbias, dout, N, O, scratch_, stream_);
      return;
    }
    // dw (O, I) += dout^T (O, N) @ inp (N, I), into the gradient; dbias (O) += row sums of dout^T
    const Operand A{dout.p, O, true}, B{inp.p, I};
    if (bf16_grad(dw)) {
      weight_grad_into_bf16(dw, A, B, N, I, O, t);
      if (dbias) cuda::add_column_sums(dbias, dout, N, O, scratch_, stream_);
      return;
    }
    if (dbias && !bf16_grad(dbias) && opt_.gemm_epilogues && I > 0) {
      float* tmp = bias_grad_.as<float>(size_t(O));
      if (gemm_->run(O, I, N, A, B, dw.p, DType::F32, I, 0, 1, 1.0f, 1.0f, t, {Epilogue::BiasGrad, tmp})) {
        cuda::accumulate(dbias, tmp, O, stream_);
        return;
      }
    }
    gemm_->run(O, I, N, A, B, dw.p, DType::F32, I, 0, 1, 1.0f, 1.0f, t);
    if (dbias) cuda::add_column_sums(dbias, dout, N, O, scratch_, stream_);
  }
  // dw (O, I, bf16) += A^T B: 16-bit inputs straight into the bf16 C (beta 1: added in fp32, rounded
  // once); fp32 inputs (the MoE router's fp32 GEMM), which cuBLASLt does not pair with a bf16 C, as fp32
  // products of as many rows of dw as the reductions' scratch holds, each block added and rounded once
  void weight_grad_into_bf16(Buf dw, const Operand& A, const Operand& B, int64_t N, int64_t I, int64_t O, DType t) {
    if (t != DType::F32) {
      gemm_->run(O, I, N, A, B, dw.p, DType::BF16, I, 0, 1, 1.0f, 1.0f, t);
      return;
    }
    const int64_t fit = int64_t(scratch_.capacity() / 4) / std::max<int64_t>(I, 1);  // rows the scratch holds
    const int64_t rows = std::min<int64_t>(O, std::max<int64_t>(1, fit));
    float* tmp = scratch_.as<float>(size_t(rows * I));
    for (int64_t r0 = 0; r0 < O; r0 += rows) {
      const int64_t n = std::min(rows, O - r0);
      const Operand Ar{static_cast<const float*>(A.p) + r0, A.ld, true};
      gemm_->run(n, I, N, Ar, B, tmp, DType::F32, I, 0, 1, 1.0f, 0.0f, t);
      cuda::accumulate_grad(dw + r0 * I, tmp, n * I, stream_);
    }
  }

  // ---- attention: bf16 / fp16 through cuDNN's fused SDPA where this build has it and cuDNN runs
  // the shape (core/cuda/attention/cudnn_attention.h); else flash-style kernels of our own, on the tensor
  // cores for bf16 / fp16 tensors where the head dimension and alignment allow
  // (core/cuda/attention/attention_tc.cu), else fp32 math on the CUDA cores (attention.cu). All read and write
  // the compute dtype directly and share the lse convention, so either backward follows either forward.

  // Grouped-query attention (KV < H key / value heads) everywhere: cuDNN takes the smaller K and V
  // natively, the own kernels read each query head's key / value head in place.

  void attention_forward(Buf out, float* lse, CBuf qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                         int64_t D) override {
    check_kv_heads(H, KV);
    if (cudnn_ && qkv.t != DType::F32 && cudnn_->forward(out, lse, qkv, B, T, H, KV, D)) return;
    if (cuda::tc_attention_supported(D, qkv.t) && cuda::tc_attention_aligned(qkv, {}))
      cuda::tc_flash_attention_forward(out, lse, qkv, B, T, H, KV, D, stream_);
    else
      cuda::flash_attention_forward(out, lse, qkv, B, T, H, KV, D, stream_);
  }
  void attention_backward(Buf dqkv, float* scratch, CBuf dout, CBuf qkv, CBuf out, const float* lse, int64_t B,
                          int64_t T, int64_t H, int64_t KV, int64_t D) override {
    check_kv_heads(H, KV);
    if (cudnn_ && qkv.t != DType::F32 && cudnn_->backward(dqkv, dout, qkv, out, lse, B, T, H, KV, D)) return;
    if (cuda::tc_attention_supported(D, qkv.t) && cuda::tc_attention_aligned(qkv, dout))
      cuda::tc_flash_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, D, stream_);
    else
      cuda::flash_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, H, KV, D, stream_);
  }
  static void check_kv_heads(int64_t H, int64_t KV) {
    if (KV < 1 || KV > H || H % KV != 0)
      internal_error("attention: " + std::to_string(KV) + " key / value heads for " + std::to_string(H) +
                     " query heads (it must divide them)");
  }
  // context parallelism's ring blocks: cuDNN's SDPA per pair of chunks where it runs the shape
  // (core/cuda/attention/cudnn_attention.h ring_forward), else core/cuda/attention/ring_attention.cu
  void attention_block_forward(float* out, float* lse, CBuf qkv, CBuf kv, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t D, const RingBlock& blk) override {
    if (cudnn_ && qkv.t != DType::F32 && cudnn_->ring_forward(out, lse, qkv, kv, B, T, H, KV, D, blk)) return;
    cuda::ring_block_forward(out, lse, qkv, kv, B, T, H, KV, D, blk, stream_);
  }
  void attention_block_backward(float* dq, float* dkv, CBuf dout, CBuf out, const float* lse, CBuf qkv, CBuf kv,
                                int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, const RingBlock& blk) override {
    if (cudnn_ && qkv.t != DType::F32 &&
        cudnn_->ring_backward(dq, dkv, dout, out, lse, qkv, kv, B, T, H, KV, D, blk))
      return;
    cuda::ring_block_backward(dq, dkv, dout, out, lse, qkv, kv, B, T, H, KV, D, blk, stream_);
  }
  void copy_rows(Buf dst, int64_t dst_stride, CBuf src, int64_t src_stride, int64_t rows, int64_t cols) override {
    cuda::copy_rows(dst, dst_stride, src, src_stride, rows, cols, stream_);
  }
  void qkv_regroup(Buf out, CBuf in, int64_t N, int64_t G, int64_t Q, int64_t D, bool to_heads) override {
    cuda::qkv_regroup(out, in, N, G, Q, D, to_heads, stream_);
  }
  void rope(Buf qkv, const float* inv_freq, const int32_t* positions, int64_t N, int64_t S, int64_t H, int64_t KV,
            int64_t D, int64_t rot, bool interleaved, bool inverse) override {
    cuda::rope(qkv, inv_freq, positions, N, S, H, KV, D, rot, interleaved, inverse, stream_);
  }

  // ---- element-wise and rows

  void gelu_forward(Buf out, CBuf inp, int64_t n) override { cuda::gelu_forward(out, inp, n, stream_); }
  void gelu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t n) override {
    TPT_CHECK(dout.t == dinp.t);
    cuda::gelu_backward(dinp, dout, inp, n, stream_);
  }
  void swiglu_forward(Buf out, CBuf inp, int64_t N, int64_t F) override {
    cuda::swiglu_forward(out, inp, N, F, stream_);
  }
  void swiglu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t N, int64_t F) override {
    cuda::swiglu_backward(dinp, dout, inp, N, F, stream_);
  }
  void add(Buf out, CBuf a, CBuf b, int64_t n) override { cuda::add(out, a, b, n, stream_); }
  void accumulate(Buf y, CBuf x, int64_t n) override { cuda::accumulate(y, x, n, stream_); }
  void sum_parts(Buf out, CBuf parts, int k, int64_t n) override { cuda::sum_parts(out, parts, k, n, stream_); }
  void scale(Buf x, float s, int64_t n) override { cuda::scale(x, s, n, stream_); }
  void fp8_quantize(uint8_t* out, CBuf in, int64_t n, Fp8Type t, const float* scale, float* amax) override {
    cuda::fp8_quantize(out, in, n, t, scale, amax, stream_);
  }
  void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, CBuf in, int64_t rows, int64_t cols, Fp8Type t,
                          const float* scale, float* amax) override {
    cuda::fp8_cast_transpose(out, out_t, in, rows, cols, t, scale, amax, stream_);
  }
  void fp8_current_scales(float* scale, float* scale_inv, const float* amax, const Fp8Type* t, int n,
                          int margin) override {
    cuda::fp8_current_scales(scale, scale_inv, amax, t, n, margin, stream_);
  }
  void fp8_transpose(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols) override {
    cuda::fp8_transpose(out, in, rows, cols, stream_);
  }
  void fp8_block_amax(float* amax, CBuf in, int64_t at, int64_t n, int64_t cols, int64_t br, int64_t bc) override {
    cuda::fp8_block_amax(amax, in, at, n, cols, br, bc, stream_);
  }
  void fp8_quantize_given_blocks(uint8_t* out, CBuf in, int64_t at, int64_t n, int64_t cols, int64_t br, int64_t bc,
                                 Fp8Type t, const float* scale_inv) override {
    cuda::fp8_quantize_given_blocks(out, in, at, n, cols, br, bc, t, scale_inv, stream_);
  }
  void fp8_quantize_blocks(uint8_t* out, CBuf in, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Type t,
                           int margin, float* scale_inv, bool transposed) override {
    cuda::fp8_quantize_blocks(out, in, rows, cols, br, bc, t, margin, scale_inv, transposed, stream_);
  }
  void fp8_linear_forward(Buf out, Fp8Operand inp, Fp8Operand w, CBuf bias, int64_t N, int64_t I, int64_t O,
                          Buf gelu_pre) override {
    fp8_->forward(out, inp, w, bias, N, I, O, gelu_pre);
  }
  void fp8_linear_backward(Buf dinp, Buf dw, Fp8Operand dout, Fp8Operand inp, Fp8Operand w, int64_t N, int64_t I,
                           int64_t O, bool accumulate_dinp, CBuf gelu_pre) override {
    fp8_->backward(dinp, dw, dout, inp, w, N, I, O, accumulate_dinp, gelu_pre);
  }


  void layernorm_forward(Buf out, float* mean, float* rstd, CBuf inp, CBuf w, CBuf b, int64_t N, int64_t C,
                         float eps) override {
    cuda::layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps, stream_);
  }
  void residual_layernorm_forward(Buf res, Buf out, float* mean, float* rstd, CBuf a, CBuf b, CBuf w, CBuf bias,
                                  int64_t N, int64_t C, float eps) override {
    cuda::residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, C, eps, stream_);
  }
  void layernorm_backward(Buf dinp, Buf dw, Buf db, CBuf dout, CBuf inp, CBuf w, const float* mean,
                          const float* rstd, int64_t N, int64_t C) override {
    cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch_, stream_);
  }
  void rmsnorm_forward(Buf out, float* rstd, CBuf inp, CBuf w, int64_t N, int64_t C, float eps) override {
    cuda::rmsnorm_forward(out, rstd, inp, w, N, C, eps, stream_);
  }
  void residual_rmsnorm_forward(Buf res, Buf out, float* rstd, CBuf a, CBuf b, CBuf w, int64_t N, int64_t C,
                                float eps) override {
    cuda::residual_rmsnorm_forward(res, out, rstd, a, b, w, N, C, eps, stream_);
  }
  void rmsnorm_backward(Buf dinp, Buf dw, CBuf dout, CBuf inp, CBuf w, const float* rstd, int64_t N,
                        int64_t C) override {
    cuda::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, scratch_, stream_);
  }

  void embedding_forward(Buf out, const int32_t* tokens, CBuf wte, int64_t N, int64_t C, int64_t v0,
                         int64_t rows) override {
    cuda::embedding_forward(out, tokens, wte, N, C, v0, rows, stream_);
  }
  void embedding_backward(Buf dwte, const int32_t* tokens, CBuf dout, int64_t N, int64_t C, int64_t v0,
                          int64_t rows) override {
    cuda::embedding_backward(dwte, tokens, dout, N, C, v0, rows, scratch_, stream_);
  }
  void gather_rows(Buf out, CBuf inp, const int32_t* idx, const float* scale, int64_t R, int64_t C) override {
    cuda::gather_rows(out, inp, idx, scale, R, C, stream_);
  }
  void combine_rows(Buf out, CBuf inp, const int32_t* idx, const float* w, int64_t N, int64_t K, int64_t C,
                    bool accumulate) override {
    cuda::combine_rows(out, inp, idx, w, N, K, C, accumulate, stream_);
  }
  void row_dots(float* out, CBuf a, CBuf b, const int32_t* idx, int64_t N, int64_t K, int64_t C) override {
    cuda::row_dots(out, a, b, idx, N, K, C, stream_);
  }
  void add_position_embedding(Buf out, CBuf wpe, int64_t B, int64_t T, int64_t C) override {
    cuda::add_position_embedding(out, wpe, B, T, C, stream_);
  }
  void position_embedding_backward(Buf dwpe, CBuf dout, int64_t B, int64_t T, int64_t C) override {
    cuda::position_embedding_backward(dwpe, dout, B, T, C, stream_);
  }
  void bias_backward(Buf dbias, CBuf dout, int64_t N, int64_t C) override {
    cuda::add_column_sums(dbias, dout, N, C, scratch_, stream_);
  }

  void xent_local_max(float* row_max, float* target_logit, CBuf logits, const int32_t* targets, int64_t N,
                      int64_t Vl, int64_t v0, int64_t valid_vocab) override {
    cuda::xent_local_max(row_max, target_logit, logits, targets, N, Vl, v0, valid_vocab, stream_);
  }
  void xent_local_sumexp(float* sum_exp, CBuf logits, const float* row_max, int64_t N, int64_t Vl, int64_t v0,
                         int64_t valid_vocab) override {
    cuda::xent_local_sumexp(sum_exp, logits, row_max, N, Vl, v0, valid_vocab, stream_);
  }
  void xent_loss_grad(Buf logits, float* losses, const float* row_max, const float* sum_exp,
                      const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                      int64_t valid_vocab, float dloss_scale, bool want_grad, const float* row_weight) override {
    cuda::xent_loss_grad(logits, losses, row_max, sum_exp, target_logit, targets, N, Vl, v0, valid_vocab,
                         dloss_scale, want_grad, row_weight, stream_);
  }

  // ---- norms, optimizer (fp32)

  bool has_nonfinite(CBuf x, int64_t n) override {
    return cuda::has_nonfinite(x, n, scratch_, static_cast<int*>(pinned_), stream_);
  }
  double sum_squares(CBuf x, int64_t n) override {
    return cuda::sum_squares(x, n, scratch_, static_cast<double*>(pinned_), stream_);
  }
  void adamw(float* p, CBuf g, float* m, float* v, int64_t n, const AdamWParams& a, bool decay,
             Buf compute, float grad_scale) override {
    TPT_CHECK(g.t == DType::F32);  // the single-range step (tests); training steps through adamw_segments
    cuda::adamw(p, static_cast<const float*>(g.p), m, v, n, a, decay, compute, grad_scale, stream_);
  }
  GradStats grad_stats(CBuf grads, const std::vector<TensorSegment>& segments) override {
    return cuda::grad_stats(grads, segments.data(), int(segments.size()), scratch_, static_cast<double*>(pinned_),
                            stream_);
  }
  void adamw_segments(const AdamWBuffers& b, const std::vector<TensorSegment>& segments, const AdamWParams& a,
                      float grad_scale) override {
    cuda::adamw_segments(b, segments.data(), int(segments.size()), a, grad_scale, nullptr, stream_);
  }
  void adamw_store_scaled(const AdamWBuffers& b, const std::vector<TensorSegment>& segments, const AdamWParams& a,
                          float grad_scale, const float* new_scales) override {
    TPT_CHECK(b.scaled() && new_scales);
    cuda::adamw_segments(b, segments.data(), int(segments.size()), a, grad_scale, new_scales, stream_);
  }

  // ---- op profile: events on the compute stream, from a pool reused after clear_marks()

  int64_t mark() override {
    if (marks_ == int64_t(events_.size())) {
      cudaEvent_t e = nullptr;
      TPT_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    TPT_CUDA_CHECK(cudaEventRecord(events_[size_t(marks_)], stream_));
    return marks_++;
  }
  double mark_ms(int64_t id) override {
    TPT_CHECK(id >= 0 && id < marks_);
    cuda::event_wait(events_[size_t(id)]);
    float ms = 0;
    TPT_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[size_t(id)]));
    return double(ms);
  }
  void clear_marks() override { marks_ = 0; }

 private:
  std::vector<cudaEvent_t> events_;  // the op profile's marks: events_[0, marks_) recorded
  int64_t marks_ = 0;
  int device_;
  CudaOptions opt_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::LtGemm> gemm_;
  std::unique_ptr<cuda::Fp8Gemms> fp8_;  // Ops::fp8_linear_* (its workspace: BackendWorkspace::fp8)
  std::unique_ptr<cuda::CudnnAttention> cudnn_;  // null: the own attention kernels only
  int64_t allocator_calls_ = 0;  // cudaMalloc / cudaFree of alloc_bytes, free and the buffers below
  DeviceBuffer scratch_{&allocator_calls_};    // partial sums, sort buffers, reduction results
  // fp32 GEMM products where an epilogue falls back to separate kernels (16-bit runs; not reserved:
  // only where cuBLASLt offers no GELU epilogue for a shape)
  DeviceBuffer gemm_f32_{&allocator_calls_};
  DeviceBuffer bias_grad_{&allocator_calls_};  // the bias-gradient epilogue's output before it is accumulated
  void* pinned_ = nullptr;  // page-locked host memory for reduction results
  std::unordered_map<void*, size_t> alloc_sizes_;  // allocation accounting (single-threaded use)
  int64_t allocated_ = 0, peak_ = 0;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(int device, const CudaOptions& options) {
  return std::make_unique<CudaOps>(device, options);
}

}  // namespace tpt
