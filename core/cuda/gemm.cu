// cuBLASLt GEMMs in row-major terms (core/cuda/gemm.h).
//
// cuBLASLt is column-major: a row-major matrix X (r x c, ld) is the column-major X^T (c x r, ld).
// So row-major C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T: cuBLASLt's first
// operand is our B, its second our A, with m = N, n = M, k = K and the same leading dimensions.
// In that view:
//   - the BIAS epilogue adds a vector along D's rows (m = our N: bias[j]);
//   - GELU_AUX(_BIAS) / DGELU's auxiliary matrix has D's shape (m x n column-major, ld = aux_ld),
//     which is our row-major M x N with row stride aux_ld; cuBLASLt wants aux_ld % 8 == 0;
//   - BGRADB sums its second operand (our A) over k into a vector along D's columns (our rows:
//     bias[i]), in C's type.
// The bias and auxiliary matrix have C's dtype (cuBLASLt's default: the output type), so a bf16
// forward reads a bf16 bias and writes a bf16 pre-activation; the bias gradient is fp32 (C is the
// fp32 main gradient there).
#include "core/cuda/gemm.h"
#include "core/gpu_workspace.h"

#include <atomic>
#include <cstdio>
#include <string>

namespace tpt::cuda {
namespace {

std::atomic<int64_t> g_fused[kEpilogueKinds], g_fell_back[kEpilogueKinds];

constexpr size_t kWorkspaceBytes = size_t(kGemmWorkspaceBytes);  // core/gpu_workspace.h (the plan counts it)

void lt_check(cublasStatus_t st, const char* what, const char* file, int line) {
  if (st != CUBLAS_STATUS_SUCCESS)
    internal_error(std::string("cuBLASLt ") + what + " failed: " + cublasLtGetStatusName(st) + " (" +
                   cublasLtGetStatusString(st) + ") at " + file + ":" + std::to_string(line));
}
#define TPT_LT_CHECK(call) lt_check((call), #call, __FILE__, __LINE__)

cudaDataType_t cuda_type(DType t) {
  return t == DType::BF16 ? CUDA_R_16BF : t == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
}
const char* type_name(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F16 ? "fp16" : "fp32"; }

// Largest power of two (<= 256) dividing the address: what the heuristic may assume.
int alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && v % uintptr_t(a) != 0) a /= 2;
  return a;
}

template <class T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  TPT_LT_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

cublasLtEpilogue_t lt_epilogue(const EpilogueArgs& e) {
  switch (e.kind) {
    case Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::GeluAux: return e.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::DGelu: return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::BiasGrad: return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool uses_bias(const EpilogueArgs& e) {
  return e.kind == Epilogue::Bias || e.kind == Epilogue::BiasGrad || (e.kind == Epilogue::GeluAux && e.bias);
}
bool uses_aux(const EpilogueArgs& e) { return e.kind == Epilogue::GeluAux || e.kind == Epilogue::DGelu; }

// cuBLASLt's scale mode of an FP8 operand's scale_inv (-1: none, not FP8)
int lt_scaling(Fp8Scaling s) {
#if CUBLAS_VERSION >= 120900
  if (s == Fp8Scaling::Vec128) return int(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);
  if (s == Fp8Scaling::Blk128) return int(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
  return int(CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
#else
  return s == Fp8Scaling::Tensor ? 0 : 1000;  // block scales need cuBLAS 12.9: set_fp8_modes refuses
#endif
}

// The scale modes of an FP8 plan; false where this cuBLASLt has none for them.
bool set_fp8_modes(cublasLtMatmulDesc_t d, const LtGemm::Key& key) {
#if CUBLAS_VERSION >= 120900
  set_desc(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(key.scaling_a));
  set_desc(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t(key.scaling_b));
  return true;
#else
  return key.scaling_a == 0 && key.scaling_b == 0;
#endif
}

// An FP8 GEMM that cuBLASLt refused (its heuristic or the call), once per plan: the fp32 fallback of
// core/cuda/fp8_gemm.cu runs it, far slower, so a run says which shape and settings (docs/FP8.md).
void warn_fp8_refused(const LtGemm::Key& k, const char* why) {
  auto fp8 = [](int t) { return t == int(CUDA_R_8F_E5M2) ? "e5m2" : "e4m3"; };
  auto n = [](int64_t v) { return std::to_string(v); };
  const std::string c = k.ct == int(CUDA_R_16BF) ? "bf16" : k.ct == int(CUDA_R_16F) ? "fp16" : "fp32";
  const bool epilogue = k.epilogue != int(CUBLASLT_EPILOGUE_DEFAULT);
  // (stderr: spdlog's headers do not compile under nvcc here)
  std::fprintf(stderr, "%s\n",
               ("WARNING: cuBLASLt refused an FP8 GEMM (cuBLASLt's m " + n(k.m) + " n " + n(k.n) + " k " + n(k.k) +
                "; A " + fp8(k.ab) + " B " + fp8(k.ab_b) + " -> " + c + "; scale modes " + n(k.scaling_a) + " / " +
                n(k.scaling_b) + "; fast accumulation " + n(k.fast_accum) + "; cublasLtEpilogue_t " + n(k.epilogue) +
                "; alignments A " + n(k.align_a) + " B " + n(k.align_b) + " C " + n(k.align_c) + "): " + why +
                (epilogue ? "; tried without the epilogue next" : "; the fp32 fallback runs it"))
                   .c_str());
}

}  // namespace

EpilogueStats epilogue_stats() {
  EpilogueStats s;
  for (int k = 0; k < kEpilogueKinds; ++k) {
    s.fused[k] = g_fused[k].load(std::memory_order_relaxed);
    s.fell_back[k] = g_fell_back[k].load(std::memory_order_relaxed);
  }
  return s;
}

struct LtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;  // the heuristic returned an algorithm (and cuBLASLt accepted it)
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

size_t LtGemm::KeyHash::operator()(const Key& k) const {
  const int64_t fields[] = {k.op_a,      k.op_b,      k.m,         k.n,        k.k,         k.lda,
                            k.ldb,       k.ldc,       k.batch,     k.sa,       k.sb,        k.sc,
                            k.ab,        k.ab_b,      k.ct,        k.compute,  k.epilogue,  k.aux_ld,
                            k.align_a,   k.align_b,   k.align_c,   k.align_bias, k.align_aux, k.scaling_a,
                            k.scaling_b, k.fast_accum};
  uint64_t h = 1469598103934665603ull;
  for (int64_t f : fields) h = (h ^ uint64_t(f)) * 1099511628211ull;
  return size_t(h);
}

LtGemm::LtGemm(bool tf32, cudaStream_t stream) : tf32_(tf32), stream_(stream) {
  TPT_LT_CHECK(cublasLtCreate(&handle_));
  TPT_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

LtGemm::Plan& LtGemm::plan(const Key& key, const EpilogueArgs& e, const Fp8Args* fp8) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  const auto compute = cublasComputeType_t(key.compute);
  TPT_LT_CHECK(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t(key.op_a));
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t(key.op_b));
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, cublasLtEpilogue_t(key.epilogue));
  // the pointers are set for their alignment (the heuristic reads it); run() sets each call's own
  if (uses_bias(e)) {
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(key.ct));  // C's type (cuBLASLt's default)
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, e.bias);
  }
  if (uses_aux(e)) {
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(e.aux));
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, key.aux_ld);
  }
  if (key.scaling_a >= 0) {  // FP8: the scale modes (the pointers per call) and the accumulation
    if (!set_fp8_modes(p->desc, key)) return *plans_.emplace(key, std::move(p)).first->second;  // not ok
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t(key.fast_accum));
    // block scales need their pointers for the heuristic (without: INVALID_VALUE, seen on an H200)
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(fp8->b_scale_inv));
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(fp8->a_scale_inv));
  }
  const auto ab = cudaDataType_t(key.ab), ab_b = cudaDataType_t(key.ab_b);
  auto layout = [&](cublasLtMatrixLayout_t* l, cudaDataType_t t, bool transposed, int64_t rows, int64_t cols,
                    int64_t ld, int64_t stride) {
    // stored (rows x cols) column-major, or (cols x rows) when the op transposes it
    TPT_LT_CHECK(cublasLtMatrixLayoutCreate(l, t, uint64_t(transposed ? cols : rows), uint64_t(transposed ? rows : cols),
                                            ld));
    if (key.batch > 1) {
      const int32_t count = int32_t(key.batch);
      TPT_LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      TPT_LT_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                    sizeof(stride)));
    }
  };
  layout(&p->a, ab, key.op_a == CUBLAS_OP_T, key.m, key.k, key.lda, key.sa);
  layout(&p->b, ab_b, key.op_b == CUBLAS_OP_T, key.k, key.n, key.ldb, key.sb);
  layout(&p->c, cudaDataType_t(key.ct), false, key.m, key.n, key.ldc, key.sc);

  cublasLtMatmulPreference_t pref = nullptr;
  TPT_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  TPT_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t aligns[4] = {uint32_t(key.align_a), uint32_t(key.align_b), uint32_t(key.align_c),
                              uint32_t(key.align_c)};
  const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    TPT_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &aligns[i], sizeof(aligns[i])));
  // split-K only with its partial sums in the fp32 workspace: the in-place and output-type schemes add
  // them in C's type, rounding a 16-bit output once per part where the CPU backend rounds once
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;  // or none (no split-K)
  TPT_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                                    sizeof(reductions)));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    p->algo = result.algo;
    p->ok = true;
  } else {
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED &&
        !((key.epilogue != int(CUBLASLT_EPILOGUE_DEFAULT) || key.scaling_a >= 0) && st == CUBLAS_STATUS_INVALID_VALUE))
      lt_check(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    if (key.scaling_a >= 0)
      warn_fp8_refused(key, st != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusName(st)
                            : returned == 0             ? "the heuristic returned no algorithm"
                                                        : cublasLtGetStatusName(result.state));
  }
  return *plans_.emplace(key, std::move(p)).first->second;
}

bool LtGemm::run(int64_t M, int64_t N, int64_t K, const Operand& A, const Operand& B, void* C, DType ct, int64_t ldc,
                 int64_t sc, int64_t batch, float alpha, float beta, DType ab, const EpilogueArgs& e,
                 const Fp8Args* fp8) {
  if (fp8 && (K == 0 || batch != 1 || A.trans || !B.trans)) return false;  // Hopper's FP8: both K-major
  if (M <= 0 || N <= 0 || batch <= 0) return true;
  const bool epilogue = e.kind != Epilogue::None;
  if (epilogue) {
    TPT_CHECK(batch == 1);
    TPT_CHECK(!uses_bias(e) || e.bias != nullptr);
    TPT_CHECK(!uses_aux(e) || (e.aux != nullptr && e.aux_ld >= N));
    TPT_CHECK(e.kind != Epilogue::DGelu || beta == 0.0f);
    TPT_CHECK(e.kind != Epilogue::BiasGrad || ct == DType::F32);
    if (K == 0 || (uses_aux(e) && e.aux_ld % 8 != 0)) {  // an empty product; cuBLASLt's rule for the GELU aux matrix
      g_fell_back[int(e.kind)].fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  }
  const size_t csize = size_t(dtype_bytes(ct));
  if (K == 0) {  // an empty sum: C = beta * C (cuBLASLt needs k >= 1)
    TPT_CHECK(beta == 0.0f || beta == 1.0f);
    if (beta == 0.0f)
      for (int64_t i = 0; i < batch; ++i)
        TPT_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(C) + size_t(i * sc) * csize, size_t(ldc) * csize, 0,
                                         size_t(N) * csize, size_t(M), stream_));
    return true;
  }
  Key key{};
  key.op_a = int(B.trans ? CUBLAS_OP_T : CUBLAS_OP_N);  // cuBLASLt's A is our B (see the top of this file)
  key.op_b = int(A.trans ? CUBLAS_OP_T : CUBLAS_OP_N);
  key.m = N;
  key.n = M;
  key.k = K;
  key.lda = B.ld;
  key.ldb = A.ld;
  key.ldc = ldc;
  key.batch = batch;
  key.sa = batch > 1 ? B.stride : 0;
  key.sb = batch > 1 ? A.stride : 0;
  key.sc = batch > 1 ? sc : 0;
  key.ab = key.ab_b = int(cuda_type(ab));
  key.ct = int(cuda_type(ct));
  key.compute = int(ab == DType::F32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  key.scaling_a = key.scaling_b = -1;
  if (fp8) {  // cuBLASLt's A is our B
    key.ab = int(fp8->b_e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3);
    key.ab_b = int(fp8->a_e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3);
    key.compute = int(CUBLAS_COMPUTE_32F);
    key.scaling_a = lt_scaling(fp8->b_scaling);
    key.scaling_b = lt_scaling(fp8->a_scaling);
    key.fast_accum = int(fp8->fast_accum);
  }
  key.epilogue = int(lt_epilogue(e));
  key.aux_ld = uses_aux(e) ? e.aux_ld : 0;
  key.align_a = alignment(B.p);
  key.align_b = alignment(A.p);
  key.align_c = alignment(C);
  key.align_bias = uses_bias(e) ? alignment(e.bias) : 0;
  key.align_aux = uses_aux(e) ? alignment(e.aux) : 0;
  Plan& p = plan(key, e, fp8);
  if (!p.ok) {
    if (fp8) return false;
    if (epilogue) {
      g_fell_back[int(e.kind)].fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (batch > 1) {  // no strided-batched algorithm for these strides: one call per member
      const size_t esize = size_t(dtype_bytes(ab));
      for (int64_t i = 0; i < batch; ++i) {
        Operand a = A, b = B;
        a.p = static_cast<const char*>(A.p) + size_t(i * A.stride) * esize;
        b.p = static_cast<const char*>(B.p) + size_t(i * B.stride) * esize;
        run(M, N, K, a, b, static_cast<char*>(C) + size_t(i * sc) * csize, ct, ldc, 0, 1, alpha, beta, ab);
      }
      return true;
    }
    internal_error("cuBLASLt has no algorithm for a " + std::to_string(M) + " x " + std::to_string(N) + " x " +
                   std::to_string(K) + " GEMM (" + type_name(ab) + " operands, " + type_name(ct) + " output; lda " +
                   std::to_string(A.ld) + ", ldb " + std::to_string(B.ld) + ", ldc " + std::to_string(ldc) + ")");
  }
  if (uses_bias(e)) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, e.bias);
  if (uses_aux(e)) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(e.aux));
  if (fp8) {
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(fp8->b_scale_inv));
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(fp8->a_scale_inv));
  }
  const cublasStatus_t st = cublasLtMatmul(handle_, p.desc, &alpha, B.p, p.a, A.p, p.b, &beta, C, p.c, C, p.c,
                                           &p.algo, workspace_, kWorkspaceBytes, stream_);
  if (st != CUBLAS_STATUS_SUCCESS && (epilogue || fp8) &&
      (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)) {
    p.ok = false;  // rejected before launch: the caller's path from now on
    if (fp8) warn_fp8_refused(key, cublasLtGetStatusName(st));
    if (epilogue) g_fell_back[int(e.kind)].fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  lt_check(st, "cublasLtMatmul", __FILE__, __LINE__);
  if (epilogue) g_fused[int(e.kind)].fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace tpt::cuda
