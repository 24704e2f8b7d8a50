// The CUDA backend's FP8 GEMMs (core/cuda/fp8_gemm.h).
#include "core/cuda/fp8_gemm.h"

#include <algorithm>
#include <atomic>

#include "core/cuda/kernels.h"
#include "core/gpu_workspace.h"

namespace tpt::cuda {
namespace {

std::atomic<int64_t> g_fp8{0}, g_fallback{0};

int64_t round4(int64_t n) { return (n + 3) / 4 * 4; }
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// One GEMM operand for cuBLASLt's FP8: (R, K) K-major codes and their scale_inv in cuBLASLt's layout.
struct Side {
  const uint8_t* codes = nullptr;
  bool e5m2 = false;
  const float* scale_inv = nullptr;
  Fp8Scaling scaling = Fp8Scaling::Tensor;
  bool ok = false;  // a scaling cuBLASLt takes
};

// The side for x (rows_x, cols_x as stored) read as (R, K) = x (transposed: false) or x^T (true), its
// codes at `codes` (x's, or their transpose's); block scales copied into `scales` (4 x the blocks, fp32),
// or a tensor scale whose address cuBLASLt does not take.
Side side(const Fp8Operand& x, const uint8_t* codes, int64_t R, int64_t K, bool transposed, float* scales,
          cudaStream_t s) {
  Side o;
  o.codes = codes;
  o.e5m2 = x.t == Fp8Type::E5M2;
  if (x.block_rows == 0) {  // one scale for the tensor, at a 16-byte aligned address: cuBLASLt 13.1's call
    // returns NOT_SUPPORTED for a scale 4 or 8 bytes off (seen on an H200), as a tensor's in a state array is
    o.scale_inv = x.scale_inv;
    if (!aligned16(x.scale_inv)) {
      TPT_CUDA_CHECK(cudaMemcpyAsync(scales, x.scale_inv, sizeof(float), cudaMemcpyDeviceToDevice, s));
      o.scale_inv = scales;
    }
    o.ok = true;
    return o;
  }
  const int64_t kb = cdiv(K, kFp8BlockLen), rb = cdiv(R, kFp8BlockLen);
  const bool blk = x.block_rows == kFp8BlockLen && x.block_cols == kFp8BlockLen;
  o.scale_inv = scales;
  if (!transposed && x.cols == K && x.block_rows == 1 && x.block_cols == kFp8BlockLen) {
    // 1 x 128 along K: the grid (R, kb) to [kb][round4(R)]
    fp8_relayout_scales(scales, x.scale_inv, R, kb, kb, 1, round4(R), s);
    o.scaling = Fp8Scaling::Vec128, o.ok = true;
  } else if (!transposed && x.cols == K && blk) {  // the grid (rb, kb) to [rb][round4(kb)]
    fp8_relayout_scales(scales, x.scale_inv, kb, rb, 1, kb, round4(kb), s);
    o.scaling = Fp8Scaling::Blk128, o.ok = true;
  } else if (transposed && x.cols == R && x.block_rows == kFp8BlockLen && x.block_cols == 1) {
    // x (K, R) in 128 x 1 blocks: the grid (kb, R) is x^T's 1 x 128 along K; to [kb][round4(R)]
    fp8_relayout_scales(scales, x.scale_inv, R, kb, 1, R, round4(R), s);
    o.scaling = Fp8Scaling::Vec128, o.ok = true;
  } else if (transposed && x.cols == R && blk) {  // x's grid (kb, rb) to x^T's [rb][round4(kb)]
    fp8_relayout_scales(scales, x.scale_inv, kb, rb, rb, 1, round4(kb), s);
    o.scaling = Fp8Scaling::Blk128, o.ok = true;
  }
  return o;
}

}  // namespace

Fp8GemmStats fp8_gemm_stats() { return {g_fp8.load(), g_fallback.load()}; }

// C (M, Nc) = A (M, K) B (Nc, K)^T. FP8: both K-major codes (a, b). The fallback: the operands xa, xb
// decoded as stored (na, nb elements; their codes, or with ta / tb their t_codes), read as fa, fb say
// (ld, trans; pointers set when decoded).
struct Fp8Gemms::Gemm {
  int64_t M = 0, Nc = 0, K = 0;
  Side a, b;
  bool fast_accum = false;
  bool fp8 = false;  // try cuBLASLt's FP8 (scalings it takes, shapes a multiple of 16)
  const Fp8Operand *xa = nullptr, *xb = nullptr;
  bool ta = false, tb = false;
  int64_t na = 0, nb = 0;
  Operand fa, fb;
};

bool Fp8Gemms::run_fp8(const Gemm& g, void* C, DType ct, float beta, const EpilogueArgs& e) {
  if (!g.fp8) return false;
  Fp8Args args;
  args.a_e5m2 = g.a.e5m2, args.b_e5m2 = g.b.e5m2;
  args.a_scale_inv = g.a.scale_inv, args.b_scale_inv = g.b.scale_inv;
  args.a_scaling = g.a.scaling, args.b_scaling = g.b.scaling;
  args.fast_accum = g.fast_accum;
  const Operand A{g.a.codes, g.K}, B{g.b.codes, g.K, true};
  if (!gemm_.run(g.M, g.Nc, g.K, A, B, C, ct, g.Nc, 0, 1, 1.0f, beta, DType::F32, e, &args)) return false;
  g_fp8.fetch_add(1, std::memory_order_relaxed);
  return true;
}

float* Fp8Gemms::run_fallback(const Gemm& g, float* C, float beta) {
  // fallback_: the operands decoded (fp32, as stored), then the products unless C is given
  auto up = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t ba = up(g.na * 4), bb = up(g.nb * 4);
  char* base = static_cast<char*>(fallback_.get(size_t(ba + bb + (C ? 0 : g.M * g.Nc * 4))));
  float* fa = reinterpret_cast<float*>(base);
  float* fb = reinterpret_cast<float*>(base + ba);
  if (!C) C = reinterpret_cast<float*>(base + ba + bb);
  fp8_dequantize(fa, *g.xa, g.na, g.ta, stream_);
  fp8_dequantize(fb, *g.xb, g.nb, g.tb, stream_);
  Operand A = g.fa, B = g.fb;
  A.p = fa, B.p = fb;
  gemm_.run(g.M, g.Nc, g.K, A, B, C, DType::F32, g.Nc, 0, 1, 1.0f, beta, DType::F32);
  g_fallback.fetch_add(1, std::memory_order_relaxed);
  return C;
}

void Fp8Gemms::forward(Buf out, const Fp8Operand& inp, const Fp8Operand& w, CBuf bias, int64_t N, int64_t I,
                       int64_t O, Buf gelu_pre) {
  if (N <= 0 || O <= 0) return;
  const DType t = out.t;
  const bool blockwise = inp.block_rows > 0 || w.block_rows > 0;
  const int64_t blocks = blockwise ? std::max(N * cdiv(I, kFp8BlockLen), cdiv(O, kFp8BlockLen) * cdiv(I, kFp8BlockLen)) : 0;
  const Fp8WorkspaceParts wp = cuda_fp8_workspace(0, 0, 0, blocks);
  char* ws = static_cast<char*>(work_.get(size_t(wp.total)));
  Gemm g;
  g.M = N, g.Nc = O, g.K = I;
  g.a = side(inp, inp.codes, N, I, false, reinterpret_cast<float*>(ws + wp.s0), stream_);
  g.b = side(w, w.codes, O, I, false, reinterpret_cast<float*>(ws + wp.s1), stream_);
  g.fast_accum = inp.block_rows == 0 && w.block_rows == 0;
  g.fp8 = g.a.ok && g.b.ok && N % 16 == 0 && O % 16 == 0 && I % 16 == 0 && aligned16(inp.codes) &&
          aligned16(w.codes) && aligned16(out.p);
  g.xa = &inp, g.xb = &w, g.na = N * I, g.nb = O * I;
  g.fa = Operand{nullptr, I}, g.fb = Operand{nullptr, I, true};
  if (!gelu_pre) {
    if (bias && epilogues_ && run_fp8(g, out.p, t, 0.0f, {Epilogue::Bias, bias.p})) return;
    if (!bias && run_fp8(g, out.p, t, 0.0f)) return;
    if (bias && g.fp8 && t == DType::F32) {  // the bias in out, the products added
      broadcast_rows(out, bias, N, O, stream_);
      if (run_fp8(g, out.p, t, 1.0f)) return;
    } else if (bias && g.fp8) {  // 16-bit: the fp32 products and the bias rounded once (CudaOps::linear_forward)
      float* acc = scratch(N * O);
      if (run_fp8(g, acc, DType::F32, 0.0f)) return bias_store(out, acc, bias, N, O, stream_);
    }
    bias_store(out, run_fallback(g, nullptr, 0.0f), bias, N, O, stream_);
    return;
  }
  // fc1 with its GELU (Ops::linear_forward's rules: cuBLASLt's GELU for 16-bit outputs)
  if (epilogues_ && t != DType::F32 && run_fp8(g, out.p, t, 0.0f, {Epilogue::GeluAux, bias.p, gelu_pre.p, O}))
    return;
  float* into = t == DType::F32 ? gelu_pre.f32() : nullptr;  // the fp32 products: there, or in scratch
  float* acc = g.fp8 ? (into ? into : scratch(N * O)) : nullptr;
  if (!acc || !run_fp8(g, acc, DType::F32, 0.0f)) acc = run_fallback(g, into, 0.0f);
  bias_gelu_forward(out, gelu_pre, acc, bias, N, O, stream_);
}

void Fp8Gemms::backward(Buf dinp, Buf dw, const Fp8Operand& dout, const Fp8Operand& inp, const Fp8Operand& w,
                        int64_t N, int64_t I, int64_t O, bool accumulate_dinp, CBuf gelu_pre) {
  if (N <= 0) return;
  const int64_t B = kFp8BlockLen;
  const bool blockwise = (dout && dout.block_rows > 0) || (inp && inp.block_rows > 0) || (w && w.block_rows > 0);
  const int64_t blocks =
      blockwise ? std::max({N * cdiv(O, B), cdiv(O, B) * cdiv(I, B), cdiv(N, B) * std::max(O, I)}) : 0;
  // transposed codes in the workspace only for operands that come without them (model/fp8_linear.h gives
  // every one: the kept weights', the casts' columnwise codes)
  const Fp8WorkspaceParts wp = cuda_fp8_workspace(dw && !inp.t_codes ? N * I : 0, dinp && !w.t_codes ? O * I : 0,
                                                  dw && !dout.t_codes ? N * O : 0, blocks);
  char* ws = static_cast<char*>(work_.get(size_t(wp.total)));
  auto* t0 = reinterpret_cast<uint8_t*>(ws + wp.t0);
  auto* t1 = reinterpret_cast<uint8_t*>(ws + wp.t1);
  float* s0 = reinterpret_cast<float*>(ws + wp.s0);
  float* s1 = reinterpret_cast<float*>(ws + wp.s1);
  const bool shapes = N % 16 == 0 && I % 16 == 0 && O % 16 == 0;
  if (dinp && I > 0) {  // dinp (N, I) = / += dout (N, O) @ w (O, I): B = w^T (I, O)
    const DType t = dinp.t;
    TPT_CHECK(dout.codes);  // read rowwise
    Gemm g;
    g.M = N, g.Nc = I, g.K = O;
    g.a = side(dout, dout.codes, N, O, false, s0, stream_);
    const bool fp8 = shapes && g.a.ok && aligned16(dout.codes) && aligned16(dinp.p);
    const uint8_t* wt = w.t_codes ? w.t_codes : t0;  // the kept columnwise copy, or one made here
    if (fp8 && !w.t_codes) fp8_transpose(t0, w.codes, O, I, stream_);
    g.b = side(w, wt, I, O, true, s1, stream_);
    g.fp8 = fp8 && g.b.ok;
    g.xa = &dout, g.xb = &w, g.na = N * O, g.nb = O * I;
    g.fa = Operand{nullptr, O}, g.fb = Operand{nullptr, I};
    if (!gelu_pre && accumulate_dinp && t != DType::F32) {  // += into 16-bit: the fp32 product, rounded once
      float* acc = g.fp8 ? scratch(N * I) : nullptr;
      if (!acc || !run_fp8(g, acc, DType::F32, 0.0f)) acc = run_fallback(g, nullptr, 0.0f);
      accumulate_f32(dinp, acc, N * I, stream_);
    } else if (!gelu_pre) {
      if (!run_fp8(g, dinp.p, t, accumulate_dinp ? 1.0f : 0.0f)) {
        const float* acc = run_fallback(g, nullptr, 0.0f);
        if (accumulate_dinp) accumulate_grad(dinp, acc, N * I, stream_);
        else convert(dinp, acc, N * I, stream_);
      }
    } else if (!(epilogues_ && t != DType::F32 &&
                 run_fp8(g, dinp.p, t, 0.0f, {Epilogue::DGelu, nullptr, const_cast<void*>(gelu_pre.p), I}))) {
      TPT_CHECK(!accumulate_dinp);
      float* into = t == DType::F32 ? dinp.f32() : nullptr;
      float* acc = g.fp8 ? (into ? into : scratch(N * I)) : nullptr;
      if (!acc || !run_fp8(g, acc, DType::F32, 0.0f)) acc = run_fallback(g, into, 0.0f);
      gelu_backward(dinp, acc, gelu_pre, N * I, stream_);
    }
  }
  if (!dw || O <= 0 || I <= 0) return;
  // dw (O, I) += dout^T (O, N) @ inp (N, I): A = dout^T (O, N), B = inp^T (I, N)
  Gemm g;
  g.M = O, g.Nc = I, g.K = N;
  const bool fp8 = shapes && aligned16(dw.p);
  // the columnwise codes made in the casts, else transposed here
  const uint8_t* dt = dout.t_codes ? dout.t_codes : t0;
  const uint8_t* it = inp.t_codes ? inp.t_codes : t1;
  if (fp8 && !dout.t_codes) fp8_transpose(t0, dout.codes, N, O, stream_);
  if (fp8 && !inp.t_codes) fp8_transpose(t1, inp.codes, N, I, stream_);
  g.a = side(dout, dt, O, N, true, s0, stream_);
  g.b = side(inp, it, I, N, true, s1, stream_);
  g.fp8 = fp8 && g.a.ok && g.b.ok && aligned16(dt) && aligned16(it);
  g.xa = &dout, g.xb = &inp, g.na = N * O, g.nb = N * I;
  g.ta = dout.t_codes != nullptr, g.tb = inp.t_codes != nullptr;  // the fallback decodes what is there
  g.fa = g.ta ? Operand{nullptr, N} : Operand{nullptr, O, true};
  g.fb = g.tb ? Operand{nullptr, N, true} : Operand{nullptr, I};
  if (run_fp8(g, dw.p, dw.t, 1.0f)) return;
  if (dw.t == DType::F32) {
    run_fallback(g, dw.f32(), 1.0f);
    return;
  }
  accumulate_grad(dw, run_fallback(g, nullptr, 0.0f), O * I, stream_);
}

}  // namespace tpt::cuda
