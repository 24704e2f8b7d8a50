// FP8 GEMM path (model/fp8_linear.h, Ops::fp8_linear_* on the CPU backend): forward, input gradient
// (through GELU's derivative too), weight gradient (FP8 and, with fp8_wgrad false, bf16-path) and bias
// gradient against the same GEMMs written out here in double from core/fp8.h's scalar quantization with
// each tensor's own scale; and far from the unquantized GEMM, so the quantization is really there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/fp8.h"
#include "core/ops.h"
#include "model/fp8_linear.h"
#include "parallel/grid.h"
#include "parallel/thread_comm.h"

namespace tpt {
namespace {

float amax_of(const std::vector<float>& x) {
  float amax = 0.0f;
  for (float v : x) amax = fp8_amax_step(amax, v);
  return amax;
}

// x as the FP8 GEMM reads it: decode(fp8(x * s)) * (1 / s), s from x's own amax (core/fp8.h), or s given
std::vector<double> dequantized(const std::vector<float>& x, Fp8Type t, int margin, float scale = 0.0f) {
  const float s = scale > 0.0f ? scale : fp8_scale_from_amax(amax_of(x), 1.0f, t, margin), s_inv = 1.0f / s;
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = double(fp8_to_fp32(fp32_to_fp8(x[i] * s, t), t) * s_inv);
  return out;
}

std::vector<float> random(size_t n, uint32_t seed, float scale) {
  std::vector<float> v(n);
  uint32_t s = seed;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (float(s >> 8) / float(1 << 24) - 0.5f) * (1.0f + float((s >> 3) & 7));
  }
  return v;
}

double max_rel(const float* got, const std::vector<double>& want) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::fabs(double(got[i]) - want[i]));
    ref = std::max(ref, std::fabs(want[i]));
  }
  return err / ref;
}

// hybrid options of recipe 0 (tensorwise), 1 (delayed), 2 (blockwise)
Fp8LinearOptions hybrid_recipe(int recipe) {
  Fp8LinearOptions o;
  o.hybrid = true;
  o.delayed = recipe == 1;
  o.blockwise = recipe == 2;
  return o;
}
const char* recipe_name(int recipe) { return recipe == 0 ? "tensorwise" : recipe == 1 ? "delayed" : "blockwise"; }

struct Case {
  bool hybrid, wgrad, gelu;
  int margin;
};

class Fp8LinearTest : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8LinearTest, AsTheDequantizedGemms) {
  const Case c = GetParam();
  const int64_t N = 24, I = 40, O = 56;
  auto ops = make_cpu_ops(2);
  Fp8LinearOptions o;
  o.hybrid = c.hybrid, o.wgrad = c.wgrad, o.margin = c.margin;
  Fp8State lin_state(*ops, o, Fp8ScratchSizes{N * I, O * I, N * O}, 1);
  Fp8Linear& lin = *lin_state.gemm(0);
  const std::vector<float> x = random(size_t(N * I), 1, 3.0f), w = random(size_t(O * I), 2, 0.05f),
                           b = random(size_t(O), 3, 0.1f), dy = random(size_t(N * O), 4, 1e-3f);
  const std::vector<double> xq = dequantized(x, Fp8Type::E4M3, c.margin), wq = dequantized(w, Fp8Type::E4M3, c.margin),
                            dyq = dequantized(dy, c.hybrid ? Fp8Type::E5M2 : Fp8Type::E4M3, c.margin);
  // forward (fp32 storage: the GEMM's own error, no rounding of the output)
  std::vector<float> y(size_t(N * O)), pre(size_t(N * O));
  lin.forward(y.data(), x.data(), w.data(), b.data(), N, I, O, c.gelu ? Buf(pre.data()) : Buf{});
  std::vector<double> want(size_t(N * O)), plain(size_t(N * O));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < O; ++j) {
      double s = b[size_t(j)], p = b[size_t(j)];
      for (int64_t i = 0; i < I; ++i) {
        s += xq[size_t(n * I + i)] * wq[size_t(j * I + i)];
        p += double(x[size_t(n * I + i)]) * double(w[size_t(j * I + i)]);
      }
      want[size_t(n * O + j)] = s, plain[size_t(n * O + j)] = p;
    }
  EXPECT_LT(max_rel(c.gelu ? pre.data() : y.data(), want), 1e-5);
  EXPECT_GT(max_rel(c.gelu ? pre.data() : y.data(), plain), 1e-3) << "the GEMM did not quantize";
  if (c.gelu) {
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], gelu(pre[i]));
  }
  // backward: dinp = dy @ W (times gelu'(pre) of a layer whose GELU produced x), dw += dy^T x, db += sums
  std::vector<float> dx(size_t(N * I)), dw(size_t(O * I), 0.5f), db(static_cast<size_t>(O), 0.25f), gpre = random(size_t(N * I), 5, 2.0f);
  lin.backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, I, O, false,
               c.gelu ? CBuf(gpre.data()) : CBuf{});
  std::vector<double> wdx(size_t(N * I)), wdw(size_t(O * I)), wdb(static_cast<size_t>(O));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < I; ++i) {
      double s = 0;
      for (int64_t j = 0; j < O; ++j) s += dyq[size_t(n * O + j)] * wq[size_t(j * I + i)];
      wdx[size_t(n * I + i)] = c.gelu ? s * double(gelu_grad(gpre[size_t(n * I + i)])) : s;
    }
  for (int64_t j = 0; j < O; ++j) {
    double sb = 0;
    for (int64_t n = 0; n < N; ++n) sb += dy[size_t(n * O + j)];
    wdb[size_t(j)] = 0.25 + sb;
    for (int64_t i = 0; i < I; ++i) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n)
        s += c.wgrad ? dyq[size_t(n * O + j)] * xq[size_t(n * I + i)] : double(dy[size_t(n * O + j)]) * double(x[size_t(n * I + i)]);
      wdw[size_t(j * I + i)] = s;
    }
  }
  EXPECT_LT(max_rel(dx.data(), wdx), 1e-5);
  for (float& v : dw) v -= 0.5f;  // += into the gradient
  EXPECT_LT(max_rel(dw.data(), wdw), 1e-5);
  EXPECT_LT(max_rel(db.data(), wdb), 1e-6);  // the bias gradient: from the unquantized dy
  // the scales the last call used: dy's own
  const float amax = amax_of(dy);
  EXPECT_EQ(lin_state.last_call_scale(2), fp8_scale_from_amax(amax, 1.0f, c.hybrid ? Fp8Type::E5M2 : Fp8Type::E4M3, c.margin));
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8LinearTest,
                         ::testing::Values(Case{false, true, false, 0}, Case{true, true, false, 0},
                                           Case{true, false, true, 0}, Case{false, true, true, 2},
                                           Case{true, true, false, 12}));  // 12: E4M3 subnormals

// Delayed scaling (two GEMMs, history 2, max): a step quantizes with the last update's scales (1 at
// first) and records each input's amax (max over the step's calls); update() takes the amaxes reduced
// elsewhere and sets the next step's scales from max(history); begin_step() forgets what was recorded
// between two steps. Checked against the dequantized GEMM with the scales written out here.
TEST(Fp8Linear, DelayedScaling) {
  const int64_t N = 8, I = 16, O = 12;
  auto ops = make_cpu_ops(1);
  Fp8LinearOptions o;
  o.delayed = true, o.history_len = 2, o.history_max = true, o.margin = 1;
  Fp8State st(*ops, o, Fp8ScratchSizes{N * I, O * I, N * O}, 2);
  const std::vector<float> x1 = random(size_t(N * I), 21, 2.0f), x2 = random(size_t(N * I), 22, 5.0f),
                           w = random(size_t(O * I), 23, 0.1f);
  std::vector<float> y(size_t(N * O));
  auto expect_forward = [&](Fp8Linear& g, const std::vector<float>& x, float sx, float sw) {
    g.forward(y.data(), x.data(), w.data(), nullptr, N, I, O);
    const std::vector<double> xq = dequantized(x, Fp8Type::E4M3, 0, sx), wq = dequantized(w, Fp8Type::E4M3, 0, sw);
    std::vector<double> want(size_t(N * O));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < O; ++j)
        for (int64_t i = 0; i < I; ++i) want[size_t(n * O + j)] += xq[size_t(n * I + i)] * wq[size_t(j * I + i)];
    EXPECT_LT(max_rel(y.data(), want), 1e-6);
  };
  st.begin_step();
  expect_forward(*st.gemm(0), x1, 1.0f, 1.0f);  // step 1: scale 1
  expect_forward(*st.gemm(0), x2, 1.0f, 1.0f);
  std::vector<float> amax(6);
  st.read_amaxes(amax.data());
  EXPECT_EQ(amax[0], std::max(amax_of(x1), amax_of(x2)));  // the step's maximum
  EXPECT_EQ(amax[1], amax_of(w));
  EXPECT_EQ(amax[2], 0.0f);  // no backward
  EXPECT_EQ(amax[3], 0.0f);  // GEMM 1 not called
  amax[0] *= 2.0f;           // as if another rank saw more
  st.update(amax.data());
  const float s_x = fp8_scale_from_amax(amax[0], 1.0f, Fp8Type::E4M3, 1), s_w = fp8_scale_from_amax(amax[1], 1.0f, Fp8Type::E4M3, 1);
  EXPECT_EQ(st.scales(0)[0], s_x);
  EXPECT_EQ(st.scales(0)[2], 1.0f);  // amax 0: kept
  EXPECT_EQ(st.scales(1)[0], 1.0f);
  EXPECT_EQ(st.history(0)[1], amax[0]);  // rolled: history[1] holds the step's amax, history[0] zeroed
  EXPECT_EQ(st.history(0)[0], 0.0f);
  expect_forward(*st.gemm(0), x1, s_x, s_w);  // recorded between steps (an evaluation) ...
  st.begin_step();                            // ... and forgotten
  expect_forward(*st.gemm(0), x1, s_x, s_w);  // step 2: the update's scales
  st.read_amaxes(amax.data());
  EXPECT_EQ(amax[0], amax_of(x1));
  st.update(amax.data());  // history (x): [0, 2 amax(x1, x2)] + amax(x1): max is still step 1's
  EXPECT_EQ(st.scales(0)[0], s_x);
  std::fill(amax.begin(), amax.end(), 0.0f);
  amax[0] = 1e-3f;
  st.update(amax.data());  // step 1's amax has left the history of 2
  EXPECT_EQ(st.scales(0)[0], fp8_scale_from_amax(std::max(amax_of(x1), 1e-3f), 1.0f, Fp8Type::E4M3, 1));
}

// Blockwise scaling: x (N, I) read in 1 x 128 blocks along I for the forward, W in 128 x 128 blocks,
// dY in 1 x 128 blocks along O for the input gradient, and dY and x in 128 x 1 blocks along the tokens
// for the weight gradient; each block's scale a power of two from its own amax (written out here with
// ilogb), the edges' blocks cut (N = 200 tokens: a block of 72). Against the GEMMs in double on values
// dequantized that way; far from per-tensor scaling.
std::vector<double> block_dequantized(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                                      Fp8Type t) {
  std::vector<double> out(x.size());
  for (int64_t r0 = 0; r0 < rows; r0 += br)
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[size_t(r * cols + c)]));
      const float s = amax > 0.0f ? std::ldexp(1.0f, std::ilogb(fp8_max(t) / amax)) : 1.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const size_t i = size_t(r * cols + c);
          out[i] = double(fp8_to_fp32(fp32_to_fp8(x[i] * s, t), t)) / double(s);
        }
    }
  return out;
}

TEST(Fp8Linear, BlockScaleIsAPowerOfTwo) {
  const Fp8Type E4 = Fp8Type::E4M3, E5 = Fp8Type::E5M2;
  EXPECT_EQ(fp8_block_scale(0.0f, E4, 0), 1.0f);  // no information: 1
  EXPECT_EQ(fp8_block_scale(INFINITY, E4, 0), 1.0f);
  EXPECT_EQ(fp8_block_scale(NAN, E5, 0), 1.0f);
  EXPECT_EQ(fp8_block_scale(448.0f, E4, 0), 1.0f);
  EXPECT_EQ(fp8_block_scale(300.0f, E4, 0), 1.0f);          // 1.49 -> 1
  EXPECT_EQ(fp8_block_scale(1.0f, E4, 3), 32.0f);           // 448 / 8 = 56 -> 32
  EXPECT_EQ(fp8_block_scale(1.0f, E5, 0), 32768.0f);        // 57344 -> 2^15
  EXPECT_EQ(fp8_block_scale(1e-40f, E4, 0), std::ldexp(1.0f, 127));  // overflow: FLT_MAX -> 2^127
}

TEST(Fp8Linear, BlockwiseScaling) {
  const int64_t N = 200, I = 256, O = 384;
  auto ops = make_cpu_ops(2);
  Fp8LinearOptions o;
  o.blockwise = true, o.hybrid = true;
  Fp8ScratchSizes f{N * I, O * I, N * O, std::max(N * 2, 2 * I), 6, std::max(N * 3, 2 * O)};
  Fp8State st(*ops, o, f, 1);
  Fp8Linear& lin = *st.gemm(0);
  std::vector<float> x = random(size_t(N * I), 31, 1.0f), w = random(size_t(O * I), 32, 0.1f),
                     dy = random(size_t(N * O), 33, 1e-3f);
  // tokens of very different magnitudes: the first 64 rows of x 1e-3 times the others, of dY 1e3 times
  // (both halves weigh alike in dW); a block along the tokens mixes them, a block along a row does not
  for (int64_t n = 0; n < 64; ++n) {
    for (int64_t i = 0; i < I; ++i) x[size_t(n * I + i)] *= 1e-3f;
    for (int64_t j = 0; j < O; ++j) dy[size_t(n * O + j)] *= 1e3f;
  }
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 30.0f;  // and outliers
  const Fp8Type E4 = Fp8Type::E4M3, E5 = Fp8Type::E5M2;
  auto gemm = [](const std::vector<double>& a, const std::vector<double>& b, int64_t M, int64_t K, int64_t Nn, bool at,
                 bool bt) {  // (M, Nn) = op(a) (M, K) @ op(b) (K, Nn)
    std::vector<double> c(size_t(M * Nn));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < Nn; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += a[size_t(at ? k * M + m : m * K + k)] * b[size_t(bt ? n * K + k : k * Nn + n)];
        c[size_t(m * Nn + n)] = acc;
      }
    return c;
  };
  std::vector<float> y(size_t(N * O)), dx(size_t(N * I)), dw(size_t(O * I), 0.0f);
  lin.forward(y.data(), x.data(), w.data(), nullptr, N, I, O);
  const std::vector<double> wq = block_dequantized(w, O, I, 128, 128, E4);
  EXPECT_LT(max_rel(y.data(), gemm(block_dequantized(x, N, I, 1, 128, E4), wq, N, I, O, false, true)), 1e-6);
  EXPECT_GT(max_rel(y.data(), gemm(dequantized(x, E4, 0), dequantized(w, E4, 0), N, I, O, false, true)), 1e-3);
  lin.backward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, I, O, false);
  EXPECT_LT(max_rel(dx.data(), gemm(block_dequantized(dy, N, O, 1, 128, E5), wq, N, O, I, false, false)), 1e-6);
  EXPECT_LT(max_rel(dw.data(), gemm(block_dequantized(dy, N, O, 128, 1, E5), block_dequantized(x, N, I, 128, 1, E4), O,
                                    N, I, true, false)), 1e-6);
  EXPECT_GT(max_rel(dw.data(), gemm(block_dequantized(dy, N, O, 1, 128, E5), block_dequantized(x, N, I, 1, 128, E4), O,
                                    N, I, true, false)), 1e-4)
      << "the weight gradient read the rowwise blocks";
}

// A split backward (input gradient, later the weight gradient) adds what one call adds, bit for bit, in
// every recipe: W casting the output gradient again, or reading the codes B stashed for it (dout_stash:
// W then given no output gradient; B adds the bias gradient). A stash written with another scale, or
// read with its blocks' scales lost, gives other weight gradients.
TEST(Fp8Linear, SplitBackwardBitwise) {
  const int64_t N = 256, I = 128, O = 256;
  const std::vector<float> x = random(size_t(N * I), 7, 1.0f), w = random(size_t(O * I), 8, 0.1f),
                           dy = random(size_t(N * O), 9, 0.01f);
  for (int recipe = 0; recipe < 3; ++recipe) {
    SCOPED_TRACE(recipe_name(recipe));
    auto ops = make_cpu_ops(1);
    const Fp8LinearOptions o = hybrid_recipe(recipe);
    const int64_t blocks = 2 * N * O / 128;  // the most block scales any layout of a tensor needs
    Fp8State lin_state(*ops, o, Fp8ScratchSizes{N * I, O * I, N * O, blocks, blocks, blocks}, 1);
    if (o.delayed) {  // scales of an earlier step
      std::vector<float> amax = {4.0f, 0.5f, 0.3f};
      lin_state.update(amax.data());
      lin_state.begin_step();
    }
    Fp8Linear& lin = *lin_state.gemm(0);
    std::vector<uint8_t> codes(size_t(fp8_saved_code_bytes(N, O)));
    std::vector<float> scales(size_t(fp8_saved_scale_floats(o.blockwise, N, O)));
    const Fp8SavedInput stash{codes.data(), scales.data()};
    std::vector<float> dx[3], dw[3], db[3];  // [whole, split, split through the stash]
    for (int k = 0; k < 3; ++k) dx[k].assign(size_t(N * I), 0.0f), dw[k].assign(size_t(O * I), 0.0f), db[k].assign(size_t(O), 0.0f);
    lin.backward(dx[0].data(), dw[0].data(), db[0].data(), dy.data(), x.data(), w.data(), N, I, O, false);
    lin.backward(dx[1].data(), nullptr, nullptr, dy.data(), CBuf{}, w.data(), N, I, O, false);
    lin.backward(Buf{}, dw[1].data(), db[1].data(), dy.data(), x.data(), CBuf{}, N, I, O, false);
    lin.backward(dx[2].data(), nullptr, db[2].data(), dy.data(), CBuf{}, w.data(), N, I, O, false, {}, {}, nullptr,
                 nullptr, stash);
    lin.backward(Buf{}, dw[2].data(), nullptr, CBuf{}, x.data(), CBuf{}, N, I, O, false, {}, {}, nullptr, nullptr, stash);
    for (int k = 1; k < 3; ++k) {
      EXPECT_EQ(dx[0], dx[k]) << k;
      EXPECT_EQ(dw[0], dw[k]) << k;
      EXPECT_EQ(db[0], db[k]) << k;
    }
    // the stash is what W reads: its scales halved, the weight gradient doubles
    for (float& v : scales) v *= 0.5f;
    std::vector<float> half(size_t(O * I), 0.0f);
    lin.backward(Buf{}, half.data(), nullptr, CBuf{}, x.data(), CBuf{}, N, I, O, false, {}, {}, nullptr, nullptr, stash);
    for (size_t i = 0; i < half.size(); i += 97) EXPECT_EQ(half[i], 0.5f * dw[0][i]) << i;
  }
}

// GEMM 0 of a and of b (weights wa, wb) on the same input and output gradient -- forward, then the backward
// (blockwise: its two calls, input gradient and weight gradient) -- give the same y, dx and dw bit for bit.
void expect_same_gemm(Fp8State& a, CBuf wa, Fp8State& b, CBuf wb, const std::vector<float>& x,
                      const std::vector<float>& dy, int64_t N, int64_t I, int64_t O, const std::string& where) {
  std::vector<float> y[2], dx[2], dw[2];
  for (int k = 0; k < 2; ++k) {
    Fp8State& st = k ? b : a;
    const CBuf w = k ? wb : wa;
    y[k].assign(size_t(N * O), 0.0f), dx[k].assign(size_t(N * I), 0.0f), dw[k].assign(size_t(O * I), 0.0f);
    st.gemm(0)->forward(y[k].data(), x.data(), w, CBuf{}, N, I, O);
    if (st.options().blockwise) {
      st.gemm(0)->backward(dx[k].data(), nullptr, nullptr, dy.data(), CBuf{}, w, N, I, O, false);
      st.gemm(0)->backward(Buf{}, dw[k].data(), nullptr, dy.data(), x.data(), CBuf{}, N, I, O, false);
    } else {
      st.gemm(0)->backward(dx[k].data(), dw[k].data(), nullptr, dy.data(), x.data(), w, N, I, O, false);
    }
  }
  EXPECT_EQ(y[0], y[1]) << where;
  EXPECT_EQ(dx[0], dx[1]) << where;
  EXPECT_EQ(dw[0], dw[1]) << where;
}

// Kept weight copies (Fp8State given the weights' shapes, as GPTStage): every recipe gives the outputs and
// gradients of quantizing the weight in every call, bit for bit, while quantizing it once per
// weights_changed(); a changed weight is quantized again after it, another weight address at once. The
// input gradient reads the kept transposed codes (the CPU transposes them back), so a wrong columnwise
// copy shows here (O != I).
TEST(Fp8Linear, KeptWeightCopiesAsQuantizingEveryCall) {
  const int64_t N = 16, I = 256, O = 128;
  auto ops = make_cpu_ops(1);
  for (int recipe = 0; recipe < 3; ++recipe) {
    SCOPED_TRACE(recipe_name(recipe));
    const Fp8LinearOptions o = hybrid_recipe(recipe);
    Fp8ScratchSizes f{N * I, O * I, N * O, N * I, O * I, N * O};
    Fp8State every(*ops, o, f, 1), kept(*ops, o, f, 1, {Fp8Weight{O, I}});
    std::vector<float> w = random(size_t(O * I), 8, 0.1f), w2 = w;
    const std::vector<float> x = random(size_t(N * I), 7, 1.0f), dy = random(size_t(N * O), 9, 0.01f);
    for (int step = 0; step < 3; ++step) {
      if (step == 2) w[5] *= 7.0f;  // the optimizer moved it
      kept.weights_changed();
      if (o.delayed) every.begin_step(), kept.begin_step();
      for (int micro = 0; micro < 2; ++micro)
        expect_same_gemm(every, CBuf(w.data()), kept, CBuf(w.data()), x, dy, N, I, O, "step " + std::to_string(step));
      if (o.delayed) {
        std::vector<float> a(3), b(3);
        every.read_amaxes(a.data()), kept.read_amaxes(b.data());
        EXPECT_EQ(a, b) << "the step's amaxes (the weight's recorded once)";
        every.update(a.data()), kept.update(b.data());
      }
      EXPECT_EQ(kept.weight_quantizations(), step + 1) << "one quantization of the weight per step";
    }
    // another weight at another address is quantized at once, without weights_changed
    kept.gemm(0)->forward(std::vector<float>(size_t(N * O)).data(), x.data(), w2.data(), CBuf{}, N, I, O);
    EXPECT_EQ(kept.weight_quantizations(), 4);
  }
}

// FP8 parameters (training.fp8_param_gather; Fp8State::set_param_codes, cast_param): the weight cast in
// three parts, as the distributed optimizer's owners cast theirs (current scaling from the parts' amaxes,
// one max; blockwise from each 128 x 128 block's, the parts cutting blocks and rows), then read by the
// GEMMs as the parameter's codes, gives every output and gradient of the quantized weight copy, bit for
// bit, over steps where the weight changes; delayed scaling records the same amaxes, none in a step where
// the GEMM is idle. A stale cast (the weight moved, not cast again) would show at step 2.
TEST(Fp8Linear, Fp8ParametersAsKeptCopies) {
  const int64_t N = 16, I = 256, O = 128;
  auto ops = make_cpu_ops(1);
  for (int recipe = 0; recipe < 3; ++recipe) {
    SCOPED_TRACE(recipe_name(recipe));
    const Fp8LinearOptions o = hybrid_recipe(recipe);
    Fp8ScratchSizes f{N * I, O * I, N * O, N * I, O * I, N * O};
    Fp8State kept(*ops, o, f, 1, {Fp8Weight{O, I}}), param(*ops, o, f, 1, {Fp8Weight{O, I, true}});
    // no rowwise copy of a parameter's codes (delayed scaling: its amax instead, a float in 256 bytes)
    EXPECT_EQ(Fp8State::weight_cache_bytes(o, {Fp8Weight{O, I, true}}) + O * I - (o.delayed ? 256 : 0),
              Fp8State::weight_cache_bytes(o, {Fp8Weight{O, I}}));
    std::vector<uint8_t> codes(size_t(O * I), 0);
    param.set_param_codes(0, codes.data());
    std::vector<float> w = random(size_t(O * I), 8, 0.1f);
    const std::vector<float> x = random(size_t(N * I), 7, 1.0f), dy = random(size_t(N * O), 9, 0.01f);
    const std::pair<int64_t, int64_t> parts[] = {{0, 1000}, {1000, 20000}, {20000, O * I}};
    for (int step = 0; step < 3; ++step) {
      if (step == 2) w[25000] *= 40.0f;  // the optimizer moved it: a new amax (of its block too)
      kept.weights_changed(), param.weights_changed();
      if (o.delayed) kept.begin_step(), param.begin_step();
      param.begin_param_amaxes();
      for (const auto& [lo, hi] : parts) param.param_amax(0, w.data() + lo, lo, hi - lo);
      param.set_param_amaxes({0}, param.param_amaxes({0}));
      for (const auto& [lo, hi] : parts) param.cast_param(0, w.data() + lo, lo, hi - lo);
      // delayed scaling, step 1: the GEMM idle (an expert without tokens), its weight's amax not recorded
      for (int micro = 0; micro < (o.delayed && step == 1 ? 0 : 2); ++micro)
        expect_same_gemm(kept, CBuf(w.data()), param, CBuf(codes.data(), DType::U8), x, dy, N, I, O,
                         "step " + std::to_string(step));
      if (o.delayed) {
        std::vector<float> a(3), b(3);
        kept.read_amaxes(a.data()), param.read_amaxes(b.data());
        EXPECT_EQ(a, b) << "the step's amaxes (the weight's from its cast)";
        kept.update(a.data()), param.update(b.data());
      }
      EXPECT_EQ(param.weight_quantizations(), kept.weight_quantizations()) << "its codes transposed once per step used";
    }
  }
}

// Saved FP8 inputs (Fp8SavedInput, as GPTStage's FP8 layers keep ln_1's, ln_2's and SwiGLU's outputs):
// every recipe gives the outputs and gradients of casting the input again in backward, bit for bit, with
// the backward never reading the input (passed empty). Two micro-batches' forwards before their
// backwards in reverse order, the second input 50x the first: a saved scale read from the state the
// next call overwrites (current scaling), or codes of the other micro-batch, would show; 160 rows cut
// the last 128 x 1 blocks (blockwise). Delayed scaling records the same amaxes.
TEST(Fp8Linear, SavedInputAsCastingAgain) {
  const int64_t N = 160, I = 256, O = 128;
  auto ops = make_cpu_ops(1);
  for (int recipe = 0; recipe < 3; ++recipe) {
    SCOPED_TRACE(recipe_name(recipe));
    const Fp8LinearOptions o = hybrid_recipe(recipe);
    Fp8ScratchSizes f{N * I, O * I, N * O, N * I, O * I, N * O};
    Fp8State again(*ops, o, f, 1), saving(*ops, o, f, 1);
    if (o.delayed) {  // scales of an earlier step (2 for the input, 1/4 for the output gradient)
      std::vector<float> amax = {224.0f, 0.0f, 229376.0f};
      again.update(amax.data()), saving.update(amax.data());
      again.begin_step(), saving.begin_step();
    }
    const std::vector<float> w = random(size_t(O * I), 8, 0.1f);
    std::vector<float> x[2] = {random(size_t(N * I), 7, 1.0f), random(size_t(N * I), 17, 50.0f)};
    std::vector<float> dy[2] = {random(size_t(N * O), 9, 0.01f), random(size_t(N * O), 19, 0.02f)};
    std::vector<uint8_t> codes[2];
    std::vector<float> scales[2];
    Fp8SavedInput saved[2];
    for (int m = 0; m < 2; ++m) {
      codes[m].assign(size_t(N * I), 0);
      scales[m].assign(size_t(fp8_saved_scale_floats(o.blockwise, N, I)), 0.0f);
      saved[m] = Fp8SavedInput{codes[m].data(), scales[m].data()};
    }
    std::vector<float> y[2][2], dx[2][2], dw[2][2];  // [casting again, saving][micro-batch]
    for (int m = 0; m < 2; ++m) {
      y[0][m].assign(size_t(N * O), 0.0f), y[1][m] = y[0][m];
      again.gemm(0)->forward(y[0][m].data(), x[m].data(), w.data(), CBuf{}, N, I, O);
      saving.gemm(0)->forward(y[1][m].data(), x[m].data(), w.data(), CBuf{}, N, I, O, {}, saved[m]);
    }
    for (int m = 1; m >= 0; --m) {
      for (int k = 0; k < 2; ++k) dx[k][m].assign(size_t(N * I), 0.0f), dw[k][m].assign(size_t(O * I), 0.0f);
      if (o.blockwise) {  // its two calls, as a split backward
        again.gemm(0)->backward(dx[0][m].data(), nullptr, nullptr, dy[m].data(), CBuf{}, w.data(), N, I, O, false);
        again.gemm(0)->backward(Buf{}, dw[0][m].data(), nullptr, dy[m].data(), x[m].data(), CBuf{}, N, I, O, false);
        saving.gemm(0)->backward(dx[1][m].data(), nullptr, nullptr, dy[m].data(), CBuf{}, w.data(), N, I, O, false, {},
                                 saved[m]);
        saving.gemm(0)->backward(Buf{}, dw[1][m].data(), nullptr, dy[m].data(), CBuf{}, CBuf{}, N, I, O, false, {},
                                 saved[m]);
      } else {
        again.gemm(0)->backward(dx[0][m].data(), dw[0][m].data(), nullptr, dy[m].data(), x[m].data(), w.data(), N, I,
                                O, false);
        saving.gemm(0)->backward(dx[1][m].data(), dw[1][m].data(), nullptr, dy[m].data(), CBuf{}, w.data(), N, I, O,
                                 false, {}, saved[m]);
      }
    }
    for (int m = 0; m < 2; ++m) {
      EXPECT_EQ(y[0][m], y[1][m]) << "micro-batch " << m;
      EXPECT_EQ(dx[0][m], dx[1][m]) << "micro-batch " << m;
      EXPECT_EQ(dw[0][m], dw[1][m]) << "micro-batch " << m;
    }
    EXPECT_NE(dw[1][0], dw[1][1]);
    if (o.delayed) {
      std::vector<float> a(3), b(3);
      again.read_amaxes(a.data()), saving.read_amaxes(b.data());
      EXPECT_EQ(a, b);
    }
  }
}

// Sequence parallelism's gathers as FP8 codes (Fp8TokenGather): on 2 thread ranks, each with its half of
// a weight, the forward given the rank's half of the rows (the second rank's 40x the first's, so a shard
// scaled by its own amax would give other codes) casts them, gathers the codes and saves its shard's; the
// backward gathers that shard again and transposes it for the weight gradient, and given the output
// gradient's rows of the rank (a row-parallel GEMM's, the second rank's 40x too) gathers its codes and
// transposes them. Every output is bit for bit the one of the same GEMM given the gathered 16-bit rows
// (and casting them again in backward), as GPTStage runs it without the gathers; also split (zb-h1), B
// gathering the output gradient's codes and stashing them for W. Blockwise scaling (the rows' 1 x 128
// blocks and their scales gathered; a saved shard's 128 x 1 blocks, a rank's 128 tokens) gathers the
// inputs alone.
TEST(Fp8Linear, SequenceParallelGathersCodes) {
  for (int recipe = 0; recipe < 3; ++recipe) {
    SCOPED_TRACE(recipe_name(recipe));
    const bool blockwise = recipe == 2;
    const int64_t N = blockwise ? 256 : 48, Nt = N / 2, I = blockwise ? 256 : 64, O = blockwise ? 128 : 32;
    std::vector<float> x = random(size_t(N * I), 21, 1.0f), dy = random(size_t(N * O), 23, 0.01f);
    for (size_t i = size_t(Nt * I); i < x.size(); ++i) x[i] *= 40.0f;
    for (size_t i = size_t(Nt * O); i < dy.size(); ++i) dy[i] *= 40.0f;
    const std::vector<float> w = random(size_t(2 * O * I), 22, 0.1f);
    run_thread_ranks(2, 1, 1, false, [&](Grid& g) {
      auto ops = make_cpu_ops(1);
      Fp8LinearOptions o = hybrid_recipe(recipe);
      o.amax_groups[0] = g.tp_group.get();
      const int64_t blocks = 2 * N * std::max(I, O) / kFp8Block;
      const Fp8ScratchSizes f{N * I, O * I, N * O, blocks, blocks, blocks};
      Fp8State plain(*ops, o, f, 1), gathering(*ops, o, f, 1);
      if (o.delayed) {  // scales of an earlier step
        std::vector<float> amax = {224.0f, 0.5f, 229376.0f};
        plain.update(amax.data()), gathering.update(amax.data());
        plain.begin_step(), gathering.begin_step();
      }
      const int r = g.tp_rank;
      const float* wr = w.data() + r * O * I;  // this rank's rows of the weight
      std::vector<uint8_t> scratch(size_t(N * I)), shard(size_t(Nt * I));
      std::vector<float> shard_scale(size_t(fp8_saved_scale_floats(blockwise, Nt, I)));
      Fp8TokenGather sp;
      sp.gather = [&](uint8_t* full, const uint8_t* in, int64_t n) { g.tp_group->all_gather(full, in, n, DType::U8); };
      sp.Nt = Nt, sp.rank = r, sp.scratch = scratch.data();
      // saving the shard's codes, or not (the forward's shard cast in place into the gathered codes, the
      // backward given the gathered 16-bit rows); the output gradient gathered as codes, or given whole
      for (const bool save : {true, false})
      for (const bool dout_codes : {false, true}) {
        if (dout_codes && blockwise) continue;
        const Fp8SavedInput saved = save ? Fp8SavedInput{shard.data(), shard_scale.data(), true} : Fp8SavedInput{};
        std::vector<float> y[2], dx[2], dw[2];  // [plain, gathering]
        for (int k = 0; k < 2; ++k)
          y[k].assign(size_t(N * O), 0.0f), dx[k].assign(size_t(N * I), 0.0f), dw[k].assign(size_t(O * I), 0.0f);
        plain.gemm(0)->forward(y[0].data(), x.data(), wr, CBuf{}, N, I, O);
        gathering.gemm(0)->forward(y[1].data(), x.data() + r * Nt * I, wr, CBuf{}, N, I, O, {}, saved, &sp);
        plain.gemm(0)->backward(dx[0].data(), dw[0].data(), nullptr, dy.data(), x.data(), wr, N, I, O, false);
        gathering.gemm(0)->backward(dx[1].data(), dw[1].data(), nullptr, dout_codes ? dy.data() + r * Nt * O : dy.data(),
                                    save ? CBuf{} : CBuf(x.data()), wr, N, I, O, false, {}, saved, &sp,
                                    dout_codes ? &sp : nullptr);
        const char* what = save ? (dout_codes ? ", saved, dout codes" : ", saved") : dout_codes ? ", dout codes" : "";
        EXPECT_EQ(y[0], y[1]) << "rank " << r << what;
        EXPECT_EQ(dx[0], dx[1]) << "rank " << r << what;
        EXPECT_EQ(dw[0], dw[1]) << "rank " << r << what;
        if (!dout_codes) continue;
        // zb-h1: B gathers the output gradient's codes and stashes their transpose, W reads them
        std::vector<uint8_t> stash_codes(size_t(N * O));
        std::vector<float> stash_scale(1), dx2(size_t(N * I), 0.0f), dw2(size_t(O * I), 0.0f);
        const Fp8SavedInput stash{stash_codes.data(), stash_scale.data()};
        gathering.gemm(0)->backward(dx2.data(), nullptr, nullptr, dy.data() + r * Nt * O, CBuf{}, wr, N, I, O, false, {},
                                    {}, nullptr, &sp, stash);
        gathering.gemm(0)->backward(Buf{}, dw2.data(), nullptr, CBuf{}, save ? CBuf{} : CBuf(x.data()), CBuf{}, N, I, O,
                                    false, {}, saved, &sp, nullptr, stash);
        EXPECT_EQ(dx[0], dx2) << "rank " << r << what << ", split";
        EXPECT_EQ(dw[0], dw2) << "rank " << r << what << ", split";
      }
      if (o.delayed) {  // the shards' amaxes recorded; over the TP group the whole tensors'
        std::vector<float> a(3), b(3);
        plain.read_amaxes(a.data()), gathering.read_amaxes(b.data());
        g.tp_group->all_reduce(a.data(), 3, ReduceOp::Max), g.tp_group->all_reduce(b.data(), 3, ReduceOp::Max);
        EXPECT_EQ(a, b) << "rank " << r;
      }
    });
  }
}

// Tensor parallelism: a column-parallel GEMM (the weight's rows split over 2 thread ranks) and a
// row-parallel one (the input's columns and the weight's columns split), with shards of very different
// magnitudes. The amaxes reduced over the TP group give every rank the whole tensor's scales, so each
// rank's output columns (column-parallel) and the sum of the partial outputs (row-parallel) are one
// rank's to fp32 rounding; a shard scaled by its own amax (no reduction) is far off.
TEST(Fp8Linear, TensorParallelAmaxReduction) {
  const int64_t N = 8, I = 32, O = 16;
  std::vector<float> x = random(size_t(N * I), 11, 2.0f), w = random(size_t(O * I), 12, 0.1f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = I / 2; i < I; ++i) x[size_t(n * I + i)] *= 37.0f;  // the second half of the columns larger
  for (int64_t j = O / 2; j < O; ++j)
    for (int64_t i = 0; i < I; ++i) w[size_t(j * I + i)] *= 0.013f;  // the second half of the rows smaller
  auto ops = make_cpu_ops(1);
  std::vector<float> y1(size_t(N * O));
  {
    Fp8State one_state(*ops, Fp8LinearOptions{}, Fp8ScratchSizes{N * I, O * I, N * O}, 1);
    Fp8Linear& one = *one_state.gemm(0);
    one.forward(y1.data(), x.data(), w.data(), nullptr, N, I, O);
  }
  for (bool reduce : {true, false}) {
    std::vector<float> col(size_t(N * O)), row(size_t(2 * N * O));
    run_thread_ranks(2, 1, 1, false, [&](Grid& g) {
      auto rops = make_cpu_ops(1);
      Fp8LinearOptions o;
      if (reduce) o.amax_groups[0] = g.tp_group.get();
      Fp8State lin_state(*rops, o, Fp8ScratchSizes{N * I, O * I, N * O}, 1);
      Fp8Linear& lin = *lin_state.gemm(0);
      const int r = g.tp_rank;
      // column-parallel: rows [r O/2, (r+1) O/2) of w; this rank's output columns
      std::vector<float> yc(size_t(N * O / 2));
      lin.forward(yc.data(), x.data(), w.data() + r * (O / 2) * I, nullptr, N, I, O / 2);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < O / 2; ++j) col[size_t(n * O + r * (O / 2) + j)] = yc[size_t(n * (O / 2) + j)];
      // row-parallel: columns [r I/2, (r+1) I/2) of x and of w; partial outputs, summed below
      std::vector<float> xs(size_t(N * I / 2)), ws(size_t(O * I / 2));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < I / 2; ++i) xs[size_t(n * (I / 2) + i)] = x[size_t(n * I + r * (I / 2) + i)];
      for (int64_t j = 0; j < O; ++j)
        for (int64_t i = 0; i < I / 2; ++i) ws[size_t(j * (I / 2) + i)] = w[size_t(j * I + r * (I / 2) + i)];
      lin.forward(row.data() + r * N * O, xs.data(), ws.data(), nullptr, N, I / 2, O);
    });
    std::vector<double> want(y1.begin(), y1.end());
    std::vector<float> sum(size_t(N * O));
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = row[i] + row[i + size_t(N * O)];
    if (reduce) {
      EXPECT_LT(max_rel(col.data(), want), 1e-6);
      EXPECT_LT(max_rel(sum.data(), want), 1e-6);
    } else {  // each shard's own scale: other codes
      EXPECT_GT(max_rel(col.data(), want), 1e-4);
      EXPECT_GT(max_rel(sum.data(), want), 1e-4);
    }
  }
}

}  // namespace
}  // namespace tpt
