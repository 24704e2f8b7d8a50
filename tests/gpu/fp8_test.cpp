// The CUDA backend's FP8 kernels against the CPU emulation (docs/FP8.md): Ops::fp8_quantize's codes
// and amax (and its amax alone), Ops::fp8_cast_transpose's codes in both layouts, and
// Ops::fp8_quantize_blocks' codes (also transposed) and block scales, bit for bit, for fp32 / bf16 / fp16 inputs of awkward sizes over the whole FP8 range and beyond (saturation),
// with infinities, signed zeros, subnormals and a NaN. The FP8 GEMMs (Ops::fp8_linear_forward / backward: cuBLASLt's FP8
// matmul, or the fallback where it has none) against a double-precision sum of the decoded operands,
// within a bound derived from the accumulation (see gemm_bound), for tensor scales (E4M3, and E5M2
// output gradients) and block scales, aligned shapes (cuBLASLt's FP8 on Hopper: it must run there) and
// odd ones (the fallback), with bias, GELU, an accumulated input gradient and fp32 / bf16 weight
// gradients, the weight gradient's operands given as codes or as their columnwise copies alone. And
// Fp8Linear's split backward (ZB-H1) through its FP8 stash as one backward, bit for bit.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>

#include "core/cuda/fp8_gemm.h"
#include "core/math.h"
#include "gpu_test_util.h"
#include "model/fp8_linear.h"

namespace tpt::gpu_test {
namespace {

VecF fp8_inputs(size_t n, uint32_t seed, bool with_nan) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> e(-30.0f, 20.0f), sign(-1.0f, 1.0f);
  VecF v(n);
  for (float& x : v) x = std::copysign(std::exp2(e(gen)), sign(gen));
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, 448.0f, 464.0f, 57344.0f, 61440.0f, 1e-7f, -0x1p-10f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(float) && i < n; ++i) v[i * 7 % n] = specials[i];
  if (with_nan) v[n / 2] = NAN;
  return v;
}

TEST(GpuFp8, QuantizeAndAmaxBitwiseAsCpu) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (Fp8Type t : {Fp8Type::E4M3, Fp8Type::E5M2})
      // (8 << 20) + 64: more than one pass of the 8-wide kernel's grid of resident blocks
      for (size_t n : {size_t(1), size_t(1000), size_t(65536), size_t(300007), (size_t(8) << 20) + 64})
        for (bool nan : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + (t == Fp8Type::E4M3 ? " e4m3 n " : " e5m2 n ") +
                       std::to_string(n) + (nan ? " nan" : ""));
          const VecF x = fp8_inputs(n, uint32_t(n + 7 * int(t)), nan && n > 1);
          Pair in(*cpu, *gpu, x, dt);
          const float scale = 3.7f, amax0 = 0.25f;
          Pair sc(*cpu, *gpu, VecF{scale}), am(*cpu, *gpu, VecF{amax0});
          Dev qc(*cpu, (n + 3) / 4), qg(*gpu, (n + 3) / 4);  // n bytes
          cpu->fp8_quantize(static_cast<uint8_t*>(qc.buf().p), in.cpu, int64_t(n), t, sc.cpu, am.cpu);
          gpu->fp8_quantize(static_cast<uint8_t*>(qg.buf().p), in.gpu, int64_t(n), t, sc.gpu, am.gpu);
          std::vector<uint8_t> hc((n + 3) / 4 * 4), hg(hc.size());
          cpu->to_host(hc.data(), qc, int64_t(hc.size() / 4));
          gpu->to_host(hg.data(), qg, int64_t(hg.size() / 4));
          size_t diff = 0;
          for (size_t i = 0; i < n; ++i) diff += hc[i] != hg[i];
          EXPECT_EQ(diff, 0u);
          EXPECT_TRUE(bitwise(am.gpu.host(), am.cpu.host()));
          // no output: the amax alone (current scaling's first pass), the same bits as with the codes
          Pair a2(*cpu, *gpu, VecF{amax0});
          gpu->fp8_quantize(nullptr, in.gpu, int64_t(n), t, nullptr, a2.gpu);
          EXPECT_TRUE(bitwise(a2.gpu.host(), am.cpu.host())) << "amax only";
        }
}

// n bytes on a backend's device, from / to the host
struct Bytes {
  Dev d;
  size_t n;
  Bytes(Ops& ops, const std::vector<uint8_t>& host) : d(ops, (host.size() + 3) / 4), n(host.size()) {
    std::vector<uint8_t> h(d.size() * 4);
    std::memcpy(h.data(), host.data(), host.size());
    ops.to_device(d.buf(), h.data(), int64_t(d.size()));
  }
  std::vector<uint8_t> host(Ops& ops) const {
    std::vector<uint8_t> h(d.size() * 4);
    ops.to_host(h.data(), d.buf(), int64_t(d.size()));
    h.resize(n);
    return h;
  }
  uint8_t* p() const { return static_cast<uint8_t*>(d.buf().p); }
};

// Both layouts in one pass against the CPU's, on the wide path (rows and columns multiples of 8: whole
// 64 x 64 tiles and cut ones) and the narrow one (odd shapes), with and without the rowwise codes.
TEST(GpuFp8, CastTransposeBitwiseAsCpu) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape& sh : {Shape{64, 64}, Shape{256, 384}, Shape{72, 200}, Shape{8, 8}, Shape{37, 53}, Shape{1, 1000},
                          Shape{1000, 1}, Shape{130, 96}})
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
      for (Fp8Type t : {Fp8Type::E4M3, Fp8Type::E5M2})
        for (bool rowwise : {true, false}) {
          SCOPED_TRACE(std::to_string(sh.rows) + " x " + std::to_string(sh.cols) + " " + dtype_name(dt) +
                       (t == Fp8Type::E4M3 ? " e4m3" : " e5m2") + (rowwise ? " both" : " columnwise"));
          const size_t n = size_t(sh.rows * sh.cols);
          const VecF x = fp8_inputs(n, uint32_t(n + 3 * int(t)), n > 1);
          Pair in(*cpu, *gpu, x, dt), sc(*cpu, *gpu, VecF{0.37f}), am(*cpu, *gpu, VecF{0.5f});
          Bytes rc(*cpu, std::vector<uint8_t>(n)), rg(*gpu, std::vector<uint8_t>(n));
          Bytes tc(*cpu, std::vector<uint8_t>(n)), tg(*gpu, std::vector<uint8_t>(n));
          cpu->fp8_cast_transpose(rowwise ? rc.p() : nullptr, tc.p(), in.cpu, sh.rows, sh.cols, t, sc.cpu, am.cpu);
          gpu->fp8_cast_transpose(rowwise ? rg.p() : nullptr, tg.p(), in.gpu, sh.rows, sh.cols, t, sc.gpu, am.gpu);
          EXPECT_TRUE(tg.host(*gpu) == tc.host(*cpu)) << "columnwise codes";
          if (rowwise) {
            EXPECT_TRUE(rg.host(*gpu) == rc.host(*cpu)) << "rowwise codes";
          }
          EXPECT_TRUE(bitwise(am.gpu.host(), am.cpu.host())) << "amax";
        }
}

TEST(GpuFp8, QuantizeBlocksBitwiseAsCpu) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  struct Case {
    int64_t rows, cols, br, bc;
  };
  // the kernel for any block (the first four), and the fast ones: 1 x 128 blocks along whole rows (an
  // odd count of them: a half warp idle), 128 x 1 blocks written transposed (bf16 values, 128 x 32 tiles)
  for (const Case& c : {Case{3, 300, 1, 128}, Case{257, 129, 128, 128}, Case{300, 70, 128, 1}, Case{1, 5, 1, 128},
                        Case{3, 384, 1, 128}, Case{64, 1024, 1, 128}, Case{256, 192, 128, 1}, Case{128, 64, 128, 1}})
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
      for (Fp8Type t : {Fp8Type::E4M3, Fp8Type::E5M2})
        for (int margin : {0, 2})
          for (bool tr : {false, true}) {
            SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols) + " in " + std::to_string(c.br) +
                         " x " + std::to_string(c.bc) + " " + dtype_name(dt) + " margin " + std::to_string(margin) +
                         (tr ? " transposed" : ""));
            const size_t n = size_t(c.rows * c.cols);
            const VecF x = fp8_inputs(n, uint32_t(n + margin), n > 1);
            const int64_t blocks = (c.rows + c.br - 1) / c.br * ((c.cols + c.bc - 1) / c.bc);
            Pair in(*cpu, *gpu, x, dt);
            Pair si(*cpu, *gpu, VecF(size_t(blocks), -1.0f));
            Bytes qc(*cpu, std::vector<uint8_t>(n)), qg(*gpu, std::vector<uint8_t>(n));
            cpu->fp8_quantize_blocks(qc.p(), in.cpu, c.rows, c.cols, c.br, c.bc, t, margin, si.cpu, tr);
            gpu->fp8_quantize_blocks(qg.p(), in.gpu, c.rows, c.cols, c.br, c.bc, t, margin, si.gpu, tr);
            EXPECT_TRUE(qg.host(*gpu) == qc.host(*cpu)) << "codes";
            EXPECT_TRUE(bitwise(si.gpu.host(), si.cpu.host())) << "block scales";
          }
}

// FP8 parameters (docs/FP8.md "FP8 parameters"): the master weights' 16-bit copy (Ops::master_copy: bf16
// ties away from zero, fp16 to nearest even, near ties included), and a weight's parts -- cutting rows and
// 128 x 128 blocks, at an offset into the matrix -- through fp8_block_amax, then fp8_quantize_given_blocks
// with the blocks' scale_inv from those amaxes, against the CPU backend bit for bit; and the parts' codes
// and scales those of fp8_quantize_blocks on the whole matrix.
TEST(GpuFp8, Fp8ParameterCastsBitwiseAsCpu) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  VecF master = fp8_inputs(4099, 11, false);
  for (size_t i = 0; i < 64; ++i)  // halfway between two bf16 values: where the two roundings differ
    master[i] = bits_to_float((float_to_bits(master[i]) & 0xFFFF0000u) | 0x8000u);
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    Pair m(*cpu, *gpu, master), copy(*cpu, *gpu, VecF(master.size(), 0.0f), dt);
    cpu->master_copy(copy.cpu, m.cpu.f32(), int64_t(master.size()));
    gpu->master_copy(copy.gpu, m.gpu.f32(), int64_t(master.size()));
    EXPECT_TRUE(bitwise(copy.gpu.host(), copy.cpu.host())) << "master_copy";
  }
  const int64_t rows = 300, cols = 260, n = rows * cols, gc = 3, blocks = 3 * gc;
  const VecF x = fp8_inputs(size_t(n), 5, false);
  const std::pair<int64_t, int64_t> parts[] = {{0, 1000}, {1000, 40000}, {40000, n}};
  for (Fp8Type t : {Fp8Type::E4M3, Fp8Type::E5M2}) {
    Pair amax(*cpu, *gpu, VecF(size_t(blocks), 0.0f));
    for (const auto& [lo, hi] : parts) {
      Pair part(*cpu, *gpu, VecF(x.begin() + lo, x.begin() + hi), DType::BF16);
      cpu->fp8_block_amax(amax.cpu, part.cpu, lo, hi - lo, cols, 128, 128);
      gpu->fp8_block_amax(amax.gpu, part.gpu, lo, hi - lo, cols, 128, 128);
    }
    EXPECT_TRUE(bitwise(amax.gpu.host(), amax.cpu.host())) << "block amaxes";
    VecF si(static_cast<size_t>(blocks));
    const VecF a = amax.cpu.host();
    for (int64_t b = 0; b < blocks; ++b) si[size_t(b)] = 1.0f / fp8_block_scale(a[size_t(b)], t, 0);
    Pair scale_inv(*cpu, *gpu, si);
    Bytes qc(*cpu, std::vector<uint8_t>(size_t(n))), qg(*gpu, std::vector<uint8_t>(size_t(n)));
    for (const auto& [lo, hi] : parts) {
      Pair part(*cpu, *gpu, VecF(x.begin() + lo, x.begin() + hi), DType::BF16);
      cpu->fp8_quantize_given_blocks(qc.p() + lo, part.cpu, lo, hi - lo, cols, 128, 128, t, scale_inv.cpu);
      gpu->fp8_quantize_given_blocks(qg.p() + lo, part.gpu, lo, hi - lo, cols, 128, 128, t, scale_inv.gpu);
    }
    EXPECT_TRUE(qg.host(*gpu) == qc.host(*cpu)) << "codes of the parts";
    Pair whole(*cpu, *gpu, x, DType::BF16), si_whole(*cpu, *gpu, VecF(size_t(blocks), -1.0f));
    Bytes qw(*gpu, std::vector<uint8_t>(size_t(n)));
    gpu->fp8_quantize_blocks(qw.p(), whole.gpu, rows, cols, 128, 128, t, 0, si_whole.gpu, false);
    EXPECT_TRUE(qw.host(*gpu) == qg.host(*gpu)) << "the whole matrix's codes";
    EXPECT_TRUE(bitwise(si_whole.gpu.host(), si)) << "the whole matrix's block scales";
  }
}

// ---- the FP8 GEMMs

// An FP8 operand on the host: codes of x (rows, cols) with one scale from the amax (block_rows 0) or a
// power-of-two scale per block, as Ops::fp8_quantize / fp8_quantize_blocks make them, and its values.
struct HostQ {
  std::vector<uint8_t> codes;
  VecF scale_inv, values;
  Fp8Type t = Fp8Type::E4M3;
  int64_t br = 0, bc = 0, cols = 0;
};
HostQ quantize(const VecF& x, int64_t rows, int64_t cols, Fp8Type t, int64_t br, int64_t bc) {
  HostQ q;
  q.t = t, q.br = br, q.bc = bc, q.cols = cols;
  q.codes.resize(x.size());
  q.values.resize(x.size());
  if (br == 0) {
    float amax = 0.0f;
    for (float v : x) amax = fp8_amax_step(amax, v);
    const float s = fp8_scale_from_amax(amax, 1.0f, t, 0);
    q.scale_inv = {1.0f / s};
    for (size_t i = 0; i < x.size(); ++i) {
      q.codes[i] = fp32_to_fp8(x[i] * s, t);
      q.values[i] = fp8_to_fp32(q.codes[i], t) * q.scale_inv[0];
    }
    return q;
  }
  const int64_t gc = (cols + bc - 1) / bc, blocks = (rows + br - 1) / br * gc;
  q.scale_inv.resize(size_t(blocks));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t r0 = b / gc * br, c0 = b % gc * bc, r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
    float amax = 0.0f;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) amax = fp8_amax_step(amax, x[size_t(r * cols + c)]);
    const float s = fp8_block_scale(amax, t, 0);
    q.scale_inv[size_t(b)] = 1.0f / s;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        const size_t i = size_t(r * cols + c);
        q.codes[i] = fp32_to_fp8(x[i] * s, t);
        q.values[i] = fp8_to_fp32(q.codes[i], t) * q.scale_inv[size_t(b)];
      }
  }
  return q;
}

// A HostQ on the GPU, as an Fp8Operand: its codes, or (columnwise, q (rows, cols)) their transpose alone
// as t_codes, the scales as for the codes.
struct DevQ {
  Bytes codes;
  Dev scale_inv;
  Fp8Operand op;
  DevQ(Ops& ops, const HostQ& q) : codes(ops, q.codes), scale_inv(ops, q.scale_inv) {
    op = Fp8Operand{codes.p(), q.t, scale_inv.f32(), q.br, q.bc, q.cols};
  }
  DevQ(Ops& ops, const HostQ& q, int64_t rows) : codes(ops, transposed(q.codes, rows)), scale_inv(ops, q.scale_inv) {
    op = Fp8Operand{nullptr, q.t, scale_inv.f32(), q.br, q.bc, q.cols, codes.p()};
  }
  static std::vector<uint8_t> transposed(const std::vector<uint8_t>& c, int64_t rows) {
    const int64_t cols = int64_t(c.size()) / rows;
    std::vector<uint8_t> t(c.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) t[size_t(k * rows + r)] = c[size_t(r * cols + k)];
    return t;
  }
};

// ref (M, Nc) = sum over k of a (M, K) b (Nc, K) in double (element (m, k) of a at a[m * sam + k * sak]),
// and sum |a b| (the bound's scale)
void reference(const VecF& a, int64_t sam, int64_t sak, const VecF& b, int64_t sbn, int64_t sbk, int64_t M, int64_t Nc,
               int64_t K, std::vector<double>& ref, std::vector<double>& mag) {
  ref.assign(size_t(M * Nc), 0.0);
  mag.assign(size_t(M * Nc), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < Nc; ++n) {
      double s = 0, t = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(a[size_t(m * sam + k * sak)]) * double(b[size_t(n * sbn + k * sbk)]);
        s += p, t += std::fabs(p);
      }
      ref[size_t(m * Nc + n)] = s, mag[size_t(m * Nc + n)] = t;
    }
}

// The bound: the products of FP8 values are exact; their sum in fp32 errs by at most about K * 2^-24
// of sum |a b| (K = 384 here: 2.3e-5; 4e-5 allowed), with cuBLASLt's fast FP8 accumulation (the
// forward with tensor scales: Hopper's tensor cores keep about 14 bits between promotions) by 2^-9,
// and in the gradients' FP8 GEMMs on those tensor cores by about 2^-11 (bwd_acc below).
// The stored result then rounds once (bf16: half a step of 2^-7 relative, a step allowed), and GELU
// (cuBLASLt's own approximation in the epilogue) adds 2e-3.
::testing::AssertionResult within(const VecF& got, const std::vector<double>& ref, const std::vector<double>& mag,
                                  double acc, double rel, double abs) {
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(double(got[i]) - ref[i]), allowed = acc * mag[i] + rel * std::fabs(ref[i]) + abs;
    if (!(err <= allowed))
      return ::testing::AssertionFailure() << "element " << i << " of " << ref.size() << ": got " << got[i]
                                           << ", reference " << ref[i] << " (sum |ab| " << mag[i] << ", allowed "
                                           << allowed << ")";
  }
  return ::testing::AssertionSuccess();
}

bool fp8_tensor_cores() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major * 10 + minor >= 89;
}

struct GemmCase {
  int64_t N, I, O;
  bool blockwise, hybrid;
};

void check_fp8_linear(const GemmCase& c, bool bias_on, bool gelu, bool accumulate, DType dw_t) {
  auto gpu = gpu_ops();
  const int64_t N = c.N, I = c.I, O = c.O, B = c.blockwise ? 128 : 0;
  const Fp8Type gt = c.hybrid ? Fp8Type::E5M2 : Fp8Type::E4M3;
  const VecF x = randn(size_t(N * I), 1), w = randn(size_t(O * I), 2, 0.05f), dy = randn(size_t(N * O), 3, 1e-3f);
  const VecF bias = rounded(randn(size_t(O), 4, 0.1f), DType::BF16);
  // forward: the input 1 x 128, the weight 128 x 128 (blockwise)
  const HostQ qx = quantize(x, N, I, Fp8Type::E4M3, B ? 1 : 0, B), qw = quantize(w, O, I, Fp8Type::E4M3, B, B);
  DevQ dx(*gpu, qx), dw_(*gpu, qw);
  Dev out(*gpu, size_t(N * O), DType::BF16), pre(*gpu, size_t(N * O), DType::BF16), db(*gpu, bias, DType::BF16);
  const int64_t before = cuda::fp8_gemm_stats().fp8;
  gpu->fp8_linear_forward(out, dx.op, dw_.op, bias_on ? CBuf(db) : CBuf{}, N, I, O, gelu ? Buf(pre) : Buf{});
  std::vector<double> ref, mag;
  reference(qx.values, I, 1, qw.values, I, 1, N, O, I, ref, mag);
  for (int64_t i = 0; i < N * O; ++i) ref[size_t(i)] += bias_on ? bias[size_t(i % O)] : 0.0;
  // without fast accumulation (the gradients' GEMMs, block scales): on Hopper's FP8 tensor cores still
  // about 14 bits inside each slice of K between promotions (DeepSeek-V3 report, 3.3.2); measured on an
  // H200: up to 2.3e-4 of sum |ab| (input gradient), 4.6e-5 (weight gradient); the fp32 fallback (no
  // FP8 tensor cores): the fp32 bound
  const double bwd_acc = fp8_tensor_cores() ? 5e-4 : 4e-5;
  const double fwd_acc = B ? bwd_acc : 2e-3;  // fast accumulation with tensor scales
  if (gelu) {
    EXPECT_TRUE(within(pre.host(), ref, mag, fwd_acc, 1.0 / 128, 1e-6)) << "forward: pre-activation";
    std::vector<double> g(ref.size()), gm(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) g[i] = tpt::gelu(float(ref[i])), gm[i] = 1.2 * mag[i];
    EXPECT_TRUE(within(out.host(), g, gm, fwd_acc, 1.0 / 128, 2e-3)) << "forward: GELU";
  } else {
    EXPECT_TRUE(within(out.host(), ref, mag, fwd_acc, 1.0 / 128, 1e-6)) << "forward";
  }
  // input gradient: the output gradient 1 x 128 over O, the weight 128 x 128
  const HostQ qg = quantize(dy, N, O, gt, B ? 1 : 0, B);
  DevQ dg(*gpu, qg);
  const VecF dx0 = rounded(randn(size_t(N * I), 5, 1e-3f), DType::BF16);
  Dev dinp(*gpu, dx0, DType::BF16);
  // dGELU: the pre-activation of this layer's input (N x I), as fc2's backward reads fc1's
  const VecF pre_h = gelu ? rounded(randn(size_t(N * I), 7), DType::BF16) : VecF{};
  Dev pre_in(*gpu, gelu ? pre_h : VecF(1), DType::BF16);
  gpu->fp8_linear_backward(dinp, Buf{}, dg.op, Fp8Operand{}, dw_.op, N, I, O, accumulate && !gelu,
                           gelu ? CBuf(pre_in) : CBuf{});
  reference(qg.values, O, 1, qw.values, 1, I, N, I, O, ref, mag);  // w read as (I, O): element (i, o) at o * I + i
  for (size_t i = 0; i < ref.size(); ++i) {
    if (gelu) ref[i] *= gelu_grad(pre_h[i]), mag[i] *= 1.2;
    else if (accumulate) ref[i] += dx0[i], mag[i] += std::fabs(dx0[i]);
  }
  EXPECT_TRUE(within(dinp.host(), ref, mag, bwd_acc, 1.0 / 128, 1e-9)) << "input gradient";
  // weight gradient: both 128 x 1 over the tokens (blockwise)
  const HostQ qg2 = quantize(dy, N, O, gt, B, B ? 1 : 0), qx2 = quantize(x, N, I, Fp8Type::E4M3, B, B ? 1 : 0);
  DevQ dg2(*gpu, qg2), dx2(*gpu, qx2);
  const VecF w0 = rounded(randn(size_t(O * I), 6, 1e-2f), dw_t);
  Dev dwg(*gpu, w0, dw_t);
  gpu->fp8_linear_backward(Buf{}, dwg, dg2.op, dx2.op, Fp8Operand{}, N, I, O, false, CBuf{});
  reference(qg2.values, 1, O, qx2.values, 1, I, O, I, N, ref, mag);  // dout^T (O, N), inp^T (I, N)
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += w0[i], mag[i] += std::fabs(w0[i]);
  EXPECT_TRUE(within(dwg.host(), ref, mag, bwd_acc, dw_t == DType::BF16 ? 1.0 / 128 : 0.0, 1e-9)) << "weight gradient";
  // the same operands as their columnwise codes alone (as the casts make them for the model): the same
  // GEMM, bit for bit (cuBLASLt's without a transpose of its own, or the fallback decoding them)
  DevQ tg2(*gpu, qg2, N), tx2(*gpu, qx2, N);
  Dev dwt(*gpu, w0, dw_t);
  gpu->fp8_linear_backward(Buf{}, dwt, tg2.op, tx2.op, Fp8Operand{}, N, I, O, false, CBuf{});
  EXPECT_TRUE(bitwise(dwt.host(), dwg.host())) << "weight gradient from the columnwise codes";
  // aligned shapes on a GPU with FP8 tensor cores run cuBLASLt's FP8 (4 GEMMs), never the fallback
  if (fp8_tensor_cores() && N % 128 == 0 && I % 128 == 0 && O % 128 == 0) {
    EXPECT_EQ(cuda::fp8_gemm_stats().fp8 - before, 4) << "cuBLASLt's FP8 GEMMs ran";
  }
}

TEST(GpuFp8, LinearGemmsMatchTheDecodedOperandsProducts) {
  for (const GemmCase& c : {GemmCase{256, 384, 256, false, false}, GemmCase{256, 384, 256, false, true},
                            GemmCase{256, 384, 256, true, false}, GemmCase{256, 384, 256, true, true},
                            GemmCase{40, 72, 24, false, true}, GemmCase{40, 200, 136, true, false}})
    for (bool bias : {false, true})
      for (bool gelu : {false, true})
        for (DType dw_t : {DType::F32, DType::BF16}) {
          SCOPED_TRACE(std::to_string(c.N) + " x " + std::to_string(c.I) + " -> " + std::to_string(c.O) +
                       (c.blockwise ? " blockwise" : " tensor scales") + (c.hybrid ? " hybrid" : " e4m3") +
                       (bias ? " bias" : "") + (gelu ? " gelu" : "") + " dw " + dtype_name(dw_t));
          check_fp8_linear(c, bias, gelu, !gelu, dw_t);
        }
}

// ZB-H1's split backward through Fp8Linear on the GPU (docs/FP8.md "ZB-H1"): B (the input gradient, and
// the bias gradient) writing the output gradient's FP8 codes and scales into a stash -- current and delayed
// scaling in the cast + transpose's columnwise layout, blockwise in its 128 x 1 cast -- and W reading them
// for the weight gradient give what one backward gives, bit for bit (the same kernels on the same codes),
// for each recipe, at an aligned shape (cuBLASLt's FP8 on a GPU with FP8 tensor cores).
TEST(GpuFp8, SplitBackwardThroughTheStashAsOneCall) {
  const int64_t N = 256, I = 384, O = 256;
  auto gpu = gpu_ops();
  const VecF x = randn(size_t(N * I), 31), w = randn(size_t(O * I), 32, 0.05f), dy = randn(size_t(N * O), 33, 1e-3f);
  Dev dx_in(*gpu, x, DType::BF16), dw_in(*gpu, w, DType::BF16), ddy(*gpu, dy, DType::BF16);
  for (int recipe = 0; recipe < 3; ++recipe) {
    SCOPED_TRACE(recipe == 0 ? "tensorwise" : recipe == 1 ? "delayed" : "blockwise");
    Fp8LinearOptions o;
    o.hybrid = true, o.delayed = recipe == 1, o.blockwise = recipe == 2;
    const int64_t blocks = 2 * N * O / 128;
    Fp8State st(*gpu, o, Fp8ScratchSizes{N * I, O * I, N * O, blocks, blocks, blocks}, 1);
    if (o.delayed) {  // scales of an earlier step
      const float amax[3] = {4.0f, 0.5f, 0.004f};
      st.update(amax);
      st.begin_step();
    }
    Fp8Linear& lin = *st.gemm(0);
    const VecF zero_x(size_t(N * I), 0.0f), zero_w(size_t(O * I), 0.0f), zero_b(size_t(O), 0.0f);
    Dev dx1(*gpu, zero_x, DType::BF16), dx2(*gpu, zero_x, DType::BF16), dw1(*gpu, zero_w), dw2(*gpu, zero_w),
        db1(*gpu, zero_b), db2(*gpu, zero_b);
    Bytes codes(*gpu, std::vector<uint8_t>(size_t(fp8_saved_code_bytes(N, O))));
    Dev scales(*gpu, size_t(fp8_saved_scale_floats(o.blockwise, N, O)));
    const Fp8SavedInput stash{codes.p(), scales.f32()};
    lin.backward(dx1, dw1, db1, ddy, dx_in, dw_in, N, I, O, false);
    lin.backward(dx2, Buf{}, db2, ddy, CBuf{}, dw_in, N, I, O, false, {}, {}, nullptr, nullptr, stash);
    lin.backward(Buf{}, dw2, Buf{}, CBuf{}, dx_in, CBuf{}, N, I, O, false, {}, {}, nullptr, nullptr, stash);
    EXPECT_TRUE(bitwise(dx2.host(), dx1.host())) << "input gradient";
    EXPECT_TRUE(bitwise(dw2.host(), dw1.host())) << "weight gradient";
    EXPECT_TRUE(bitwise(db2.host(), db1.host())) << "bias gradient";
  }
}

// The casts' bandwidth (a benchmark: TPTRAIN_FP8_BENCH=1; scripts/gpu_check.sh runs it with
// llama8b-fp8): each FP8 cast of a Llama-3-8B layer's bf16 tensors at seq 4096 (micro-batch 1) --
// current scaling's amax pass, the cast, the cast + transpose (both layouts, and the columnwise codes
// alone), blockwise 1 x 128, 128 x 1 transposed and 128 x 128 -- in GB/s (bytes read + written) beside
// a device copy of the same tensor, and each as a fraction of the copy's.
TEST(GpuFp8, BenchmarkCasts) {
  const char* env = std::getenv("TPTRAIN_FP8_BENCH");
  if (!env || std::strcmp(env, "1") != 0) GTEST_SKIP() << "a benchmark: TPTRAIN_FP8_BENCH=1 runs it";
  auto gpu = gpu_ops();
  Ops& ops = *gpu;
  struct Shape {
    const char* what;
    int64_t rows, cols;
  };
  for (const Shape& sh : {Shape{"activation (tokens x hidden)", 4096, 4096}, Shape{"activation (tokens x ffn)", 4096, 14336},
                          Shape{"weight (ffn x hidden)", 14336, 4096}}) {
    const int64_t n = sh.rows * sh.cols;
    Dev x(ops, randn(size_t(n), 17, 3.0f), DType::BF16), y(ops, size_t(n), DType::BF16);
    Dev codes(ops, size_t(n / 4)), t_codes(ops, size_t(n / 4)), scale(ops, VecF{0.5f}), amax(ops, VecF{0.0f});
    Dev si(ops, size_t(n / 128 + 64));
    uint8_t* c = static_cast<uint8_t*>(codes.buf().p);
    uint8_t* ct = static_cast<uint8_t*>(t_codes.buf().p);
    const double copy = time_ms(ops, [&] { ops.copy(y, x, n); }, 20);
    const double copy_gbs = 4.0 * double(n) / copy / 1e6;
    std::printf("fp8 cast bench: %s %lld x %lld bf16: device copy %.1f us, %.0f GB/s\n", sh.what, (long long)sh.rows,
                (long long)sh.cols, copy * 1e3, copy_gbs);
    struct Op {
      const char* name;
      double bytes;  // per element: read + written
      std::function<void()> f;
    };
    const Op cases[] = {
        {"amax alone", 2.0, [&] { ops.fp8_quantize(nullptr, x, n, Fp8Type::E4M3, nullptr, amax); }},
        {"cast", 3.0, [&] { ops.fp8_quantize(c, x, n, Fp8Type::E4M3, scale, amax); }},
        {"cast + transpose (both)", 4.0,
         [&] { ops.fp8_cast_transpose(c, ct, x, sh.rows, sh.cols, Fp8Type::E5M2, scale, amax); }},
        {"cast + transpose (columnwise)", 3.0,
         [&] { ops.fp8_cast_transpose(nullptr, ct, x, sh.rows, sh.cols, Fp8Type::E4M3, scale, amax); }},
        {"blockwise 1 x 128", 3.0 + 4.0 / 128,
         [&] { ops.fp8_quantize_blocks(c, x, sh.rows, sh.cols, 1, 128, Fp8Type::E4M3, 0, si, false); }},
        {"blockwise 128 x 1 transposed", 3.0 + 4.0 / 128,
         [&] { ops.fp8_quantize_blocks(ct, x, sh.rows, sh.cols, 128, 1, Fp8Type::E5M2, 0, si, true); }},
        {"blockwise 128 x 128", 3.0,
         [&] { ops.fp8_quantize_blocks(c, x, sh.rows, sh.cols, 128, 128, Fp8Type::E4M3, 0, si, false); }},
    };
    for (const Op& o : cases) {
      const double ms = time_ms(ops, o.f, 20), gbs = o.bytes * double(n) / ms / 1e6;
      std::printf("fp8 cast bench:   %-30s %8.1f us %6.0f GB/s  %.2f of the copy's\n", o.name, ms * 1e3, gbs,
                  gbs / copy_gbs);
    }
  }
}

}  // namespace
}  // namespace tpt::gpu_test
