// cuBLASLt GEMMs in row-major terms (core/cuda/gemm.h).
//
// cuBLASLt is column-major: a row-major matrix X (r x c, ld) is the column-major X^T (c x r, ld).
// So row-major C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T: cuBLASLt's first
// operand is our B, its second our A, with m = N, n = M, k = K and the same leading dimensions.
// cuBLASLt's bias epilogue adds a vector along D's rows (our columns: bias[j]); its BGRADB epilogue
// sums its second operand (our A) over k into a vector along D's columns (our rows: bias[i]).
#include "core/cuda/gemm.h"

#include <string>

namespace tpt::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's recommendation for Hopper

void lt_check(cublasStatus_t st, const char* what, const char* file, int line) {
  if (st != CUBLAS_STATUS_SUCCESS)
    internal_error(std::string("cuBLASLt ") + what + " failed: " + cublasLtGetStatusName(st) + " (" +
                   cublasLtGetStatusString(st) + ") at " + file + ":" + std::to_string(line));
}
#define TPT_LT_CHECK(call) lt_check((call), #call, __FILE__, __LINE__)

cudaDataType_t cuda_type(DType t) {
  return t == DType::BF16 ? CUDA_R_16BF : t == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
}

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

}  // namespace

struct LtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;  // the heuristic returned an algorithm
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

size_t LtGemm::KeyHash::operator()(const Key& k) const {
  const int64_t fields[] = {k.op_a, k.op_b, k.m,  k.n,  k.k,       k.lda,     k.ldb,   k.ldc,   k.batch,
                            k.sa,   k.sb,   k.sc, k.ab, k.compute, k.epilogue, k.align_a, k.align_b, k.align_c,
                            k.align_bias};
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

LtGemm::Plan& LtGemm::plan(const Key& key, const float* bias) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  const auto compute = cublasComputeType_t(key.compute);
  TPT_LT_CHECK(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t(key.op_a));
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t(key.op_b));
  const auto epi = cublasLtEpilogue_t(key.epilogue);
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
  if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_32F));
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias));  // for its alignment
  }
  const auto ab = cudaDataType_t(key.ab);
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
  layout(&p->b, ab, key.op_b == CUBLAS_OP_T, key.k, key.n, key.ldb, key.sb);
  layout(&p->c, CUDA_R_32F, false, key.m, key.n, key.ldc, key.sc);

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
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    p->algo = result.algo;
    p->ok = true;
  } else if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
    lt_check(st, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  }
  return *plans_.emplace(key, std::move(p)).first->second;
}

bool LtGemm::run(int64_t M, int64_t N, int64_t K, const Operand& A, const Operand& B, float* C, int64_t ldc,
                 int64_t sc, int64_t batch, float alpha, float beta, DType ab, Epilogue epilogue, float* bias) {
  if (M <= 0 || N <= 0 || batch <= 0) return true;
  TPT_CHECK(epilogue == Epilogue::None || (batch == 1 && bias != nullptr));
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
  key.ab = int(cuda_type(ab));
  key.compute = int(ab == DType::F32 && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  key.epilogue = int(epilogue == Epilogue::Bias       ? CUBLASLT_EPILOGUE_BIAS
                     : epilogue == Epilogue::BiasGrad ? CUBLASLT_EPILOGUE_BGRADB
                                                      : CUBLASLT_EPILOGUE_DEFAULT);
  key.align_a = alignment(B.p);
  key.align_b = alignment(A.p);
  key.align_c = alignment(C);
  key.align_bias = bias ? alignment(bias) : 0;
  if (K == 0) {  // an empty sum: C = beta * C (cuBLASLt needs k >= 1)
    TPT_CHECK(epilogue == Epilogue::None && (beta == 0.0f || beta == 1.0f));
    if (beta == 0.0f)
      for (int64_t i = 0; i < batch; ++i)
        TPT_CUDA_CHECK(cudaMemset2DAsync(C + i * sc, size_t(ldc) * 4, 0, size_t(N) * 4, size_t(M), stream_));
    return true;
  }
  Plan& p = plan(key, bias);
  if (!p.ok) {
    if (epilogue != Epilogue::None) return false;
    if (batch > 1) {  // no strided-batched algorithm for these strides: one call per member
      const size_t esize = ab == DType::F32 ? 4 : 2;
      for (int64_t i = 0; i < batch; ++i) {
        Operand a = A, b = B;
        a.p = static_cast<const char*>(A.p) + size_t(i * A.stride) * esize;
        b.p = static_cast<const char*>(B.p) + size_t(i * B.stride) * esize;
        run(M, N, K, a, b, C + i * sc, ldc, 0, 1, alpha, beta, ab);
      }
      return true;
    }
    internal_error("cuBLASLt has no algorithm for a " + std::to_string(M) + " x " + std::to_string(N) + " x " +
                   std::to_string(K) + " GEMM (lda " + std::to_string(A.ld) + ", ldb " + std::to_string(B.ld) +
                   ", ldc " + std::to_string(ldc) + ")");
  }
  if (epilogue != Epilogue::None) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<void*>(bias));
  TPT_LT_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, B.p, p.a, A.p, p.b, &beta, C, p.c, C, p.c, &p.algo, workspace_,
                              kWorkspaceBytes, stream_));
  return true;
}

}  // namespace tpt::cuda
