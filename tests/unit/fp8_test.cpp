// FP8 numerics (core/fp8.h) bitwise against the exact reference tests/reference/fp8_ref.py (its output,
// tests/reference/fp8_ref.txt): E4M3 / E5M2 codes of fp32(x * scale) with the clamp to +-max, ties,
// subnormals, inf / nan, the scale from an amax (amax 0, inf, nan, margin, overflow) and delayed
// scaling's amax history; and the training.fp8_* keys' rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "config_test_util.h"
#include "core/fp8.h"
#include "core/ops.h"

#ifdef TPTRAIN_HAVE_CUDA
#include <cuda_fp8.h>
#endif

namespace tpt {
namespace {

float from_hex(const std::string& h) { return bits_to_float(uint32_t(std::stoul(h, nullptr, 16))); }
bool same(float a, float b) { return (a != a && b != b) || float_to_bits(a) == float_to_bits(b); }
Fp8Type type_of(const std::string& s) { return s == "e4m3" ? Fp8Type::E4M3 : Fp8Type::E5M2; }

std::vector<std::string> reference_lines() {
  std::ifstream in(std::string(TPTRAIN_SOURCE_DIR) + "/tests/reference/fp8_ref.txt");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

TEST(Fp8, QuantizationBitwiseAsTheReference) {
  int64_t checked = 0, cases = 0;
  for (const std::string& line : reference_lines()) {
    std::istringstream is(line);
    std::string kind, fmt, prev, amax, scale;
    int margin = 0, n = 0;
    is >> kind;
    if (kind != "q") continue;
    is >> fmt >> margin >> prev >> amax >> scale >> n;
    const Fp8Type t = type_of(fmt);
    std::vector<float> xs;
    std::vector<int> codes;
    for (int i = 0; i < n; ++i) {
      std::string x, c;
      is >> x >> c;
      xs.push_back(from_hex(x)), codes.push_back(std::stoi(c, nullptr, 16));
    }
    float a = 0;
    for (float x : xs) a = fp8_amax_step(a, x);
    ASSERT_TRUE(same(a, from_hex(amax))) << line.substr(0, 80);
    const float s = fp8_scale_from_amax(a, from_hex(prev), t, margin);
    ASSERT_TRUE(same(s, from_hex(scale))) << fmt << " margin " << margin << " amax " << a << ": " << s;
    for (size_t i = 0; i < xs.size(); ++i) {
      const uint8_t got = fp32_to_fp8(xs[i] * s, t);
      EXPECT_EQ(int(got), codes[i]) << fmt << " x " << xs[i] << " (bits " << std::hex << float_to_bits(xs[i])
                                    << ") scale " << s;
      ++checked;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 36);  // 2 formats x 3 margins x 6 cases: the file is there and whole
  EXPECT_GT(checked, 5000);
}

// The CPU backend's fused quantize + amax (Ops::fp8_quantize) on the reference's inputs, in fp32 and as
// bf16 (the reference's inputs rounded, then its rule on those values), with a running amax.
TEST(Fp8, OpsQuantizeAsTheReference) {
  auto ops = make_cpu_ops(2);
  int cases = 0;
  for (const std::string& line : reference_lines()) {
    std::istringstream is(line);
    std::string kind, fmt, prev, amax, scale;
    int margin = 0, n = 0;
    is >> kind >> fmt >> margin >> prev >> amax >> scale >> n;
    if (kind != "q") continue;
    const Fp8Type t = type_of(fmt);
    std::vector<float> xs;
    std::vector<uint16_t> b16;
    std::vector<int> codes;
    for (int i = 0; i < n; ++i) {
      std::string x, c;
      is >> x >> c;
      xs.push_back(from_hex(x)), codes.push_back(std::stoi(c, nullptr, 16)), b16.push_back(fp32_to_bf16(xs.back()));
    }
    const float s = from_hex(scale);
    std::vector<uint8_t> out(xs.size());
    float a = 0.0f;
    ops->fp8_quantize(out.data(), xs.data(), n, t, &s, &a);
    EXPECT_TRUE(same(a, from_hex(amax))) << line.substr(0, 60);
    float alone = 0.0f;  // no output: the amax alone (current scaling's first pass)
    ops->fp8_quantize(nullptr, xs.data(), n, t, nullptr, &alone);
    EXPECT_TRUE(same(alone, from_hex(amax))) << "amax only " << line.substr(0, 60);
    for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(int(out[i]), codes[i]) << fmt << " x " << xs[i];
    float a16 = 0.5f;  // a running amax: max(0.5, the tensor's)
    ops->fp8_quantize(out.data(), CBuf(b16.data(), DType::BF16), n, t, &s, &a16);
    float want = 0.5f;
    for (size_t i = 0; i < xs.size(); ++i) {
      const float v = bf16_to_fp32(b16[i]);
      want = fp8_amax_step(want, v);
      ASSERT_EQ(int(out[i]), int(fp32_to_fp8(v * s, t))) << fmt << " bf16 " << v;
    }
    EXPECT_TRUE(same(a16, want));
    ++cases;
  }
  EXPECT_EQ(cases, 36);
}

// Ops::fp8_cast_transpose and fp8_quantize_blocks' transposed codes: each code core/fp8.h's scalar rule
// (bitwise as the reference above) at its place in each layout, and the amax as the running fold.
TEST(Fp8, CastTransposeLayoutsAsTheScalarRule) {
  auto ops = make_cpu_ops(2);
  const int64_t rows = 37, cols = 53, n = rows * cols;
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> e(-20.0f, 12.0f), sign(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = std::copysign(std::exp2(e(gen)), sign(gen));
  x[3] = INFINITY, x[100] = -0.0f, x[7 * cols + 2] = 1e6f;
  for (Fp8Type t : {Fp8Type::E4M3, Fp8Type::E5M2}) {
    const float s = 3.7f;
    std::vector<uint8_t> out(static_cast<size_t>(n)), out_t(out.size()), only_t(out.size());
    float a = 0.5f, a2 = 0.5f, want = 0.5f;
    ops->fp8_cast_transpose(out.data(), out_t.data(), x.data(), rows, cols, t, &s, &a);
    ops->fp8_cast_transpose(nullptr, only_t.data(), x.data(), rows, cols, t, &s, &a2);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float v = x[size_t(r * cols + c)];
        want = fp8_amax_step(want, v);
        const int code = fp32_to_fp8(v * s, t);
        ASSERT_EQ(int(out[size_t(r * cols + c)]), code) << r << ", " << c;
        ASSERT_EQ(int(out_t[size_t(c * rows + r)]), code) << r << ", " << c;
        ASSERT_EQ(int(only_t[size_t(c * rows + r)]), code) << r << ", " << c;
      }
    EXPECT_TRUE(same(a, want));
    EXPECT_TRUE(same(a2, want));
    // blocks (128 x 1 and 1 x 16, cut at the edges): the transposed codes are the codes transposed, the
    // scales the same
    for (auto [br, bc] : {std::pair<int64_t, int64_t>{128, 1}, {1, 16}}) {
      const int64_t blocks = (rows + br - 1) / br * ((cols + bc - 1) / bc);
      std::vector<float> si(static_cast<size_t>(blocks)), si_t(si.size());
      ops->fp8_quantize_blocks(out.data(), x.data(), rows, cols, br, bc, t, 0, si.data(), false);
      ops->fp8_quantize_blocks(out_t.data(), x.data(), rows, cols, br, bc, t, 0, si_t.data(), true);
      EXPECT_EQ(si, si_t);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(out_t[size_t(c * rows + r)], out[size_t(r * cols + c)]) << br << " x " << bc << " " << r << ", " << c;
    }
  }
}

TEST(Fp8, DelayedScalingHistoryAsTheReference) {
  int cases = 0;
  for (const std::string& line : reference_lines()) {
    std::istringstream is(line);
    std::string kind, fmt, algo, sep;
    int len = 0, margin = 0, k = 0;
    is >> kind;
    if (kind != "h") continue;
    is >> fmt >> algo >> len >> margin >> k;
    std::vector<std::string> amax(static_cast<size_t>(k)), scale(static_cast<size_t>(k));
    for (auto& a : amax) is >> a;
    is >> sep;
    for (auto& s : scale) is >> s;
    Fp8ScaleState st;
    std::vector<float> history(size_t(len), 0.0f);
    for (int i = 0; i < k; ++i) {
      st.record(history.data(), from_hex(amax[size_t(i)]));
      st.update(history.data(), len, algo == "max", type_of(fmt), margin);
      EXPECT_TRUE(same(st.scale, from_hex(scale[size_t(i)]))) << fmt << " " << algo << " len " << len << " step " << i;
      EXPECT_EQ(st.scale_inv, 1.0f / st.scale);
    }
    ++cases;
  }
  EXPECT_EQ(cases, 8);
}

TEST(Fp8, EveryCodeDecodesAndEncodesBack) {
  for (Fp8Type t : {Fp8Type::E4M3, Fp8Type::E5M2}) {
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_to_fp32(uint8_t(c), t);
      if (std::isnan(v)) continue;
      const int back = std::isinf(v) ? (c & 0x80) | fp8_max_code(t) : c;  // E5M2's infinities saturate
      EXPECT_EQ(int(fp32_to_fp8(v, t)), back) << int(t) << " code " << c;
    }
    EXPECT_EQ(fp8_to_fp32(fp8_max_code(t), t), fp8_max(t));
  }
}

// The CUDA casts convert on compute capability 8.9+ with the conversion instruction
// (cvt.rn.satfinite.{e4m3,e5m2}x2.f32; core/cuda/fp8_kernels.cu fp8_pair), NaNs excepted. cuda_fp8.h's
// host code is NVIDIA's model of that instruction: here it must give core/fp8.h's codes for every fp32
// pattern with its 12 low bits zero and their neighbours one ulp away (every tie of both formats --
// 20 or more dropped bits in a normal, more in a subnormal -- and the values just off it, the
// saturation past max, infinities, zeros, subnormals), a million random patterns, and the pair
// conversion's byte order (the first value in the low byte). A NaN: the instruction's is positive,
// the rule keeps the sign, so the kernels set a NaN's code as the rule's after the instruction.
TEST(Fp8, HardwareConversionIsTheScalarRule) {
#ifndef TPTRAIN_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: no cuda_fp8.h";
#else
  std::mt19937 gen(7);
  for (Fp8Type t : {Fp8Type::E4M3, Fp8Type::E5M2}) {
    const __nv_fp8_interpretation_t hw = t == Fp8Type::E4M3 ? __NV_E4M3 : __NV_E5M2;
    int64_t checked = 0, differ = 0;
    auto check = [&](uint32_t bits) {
      const float x = bits_to_float(bits);
      if (std::isnan(x)) return;
      ++checked;
      const int a = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, hw), b = fp32_to_fp8(x, t);
      if (a != b && ++differ <= 5) ADD_FAILURE() << (t == Fp8Type::E4M3 ? "e4m3 " : "e5m2 ") << std::hex << bits
                                                 << ": instruction " << a << ", rule " << b;
    };
    for (uint64_t hi = 0; hi < (uint64_t(1) << 20); ++hi) {
      const uint32_t p = uint32_t(hi << 12);
      check(p), check(p + 1), check(p - 1);
    }
    for (int i = 0; i < 1000000; ++i) check(uint32_t(gen()));
    EXPECT_EQ(differ, 0) << "of " << checked;
    float2 two;
    two.x = 3.0f, two.y = -448.0f;
    EXPECT_EQ(int(__nv_cvt_float2_to_fp8x2(two, __NV_SATFINITE, hw)), fp32_to_fp8(3.0f, t) | fp32_to_fp8(-448.0f, t) << 8);
    EXPECT_EQ(int(__nv_cvt_float_to_fp8(NAN, __NV_SATFINITE, hw)), 0x7F);
    EXPECT_EQ(int(fp32_to_fp8(-NAN, t)), 0xFF);
  }
#endif
}

using config_test::error_of_set;
using config_test::kBase;

TEST(Fp8Config, MegatronDefaultsAndResolvedYaml) {
  const Config c = parse_config(kBase, "test.yaml", {"training.precision=bf16", "training.fp8_format=hybrid"});
  EXPECT_EQ(c.training.fp8_format, Fp8Format::Hybrid);
  EXPECT_EQ(c.training.fp8_recipe, Fp8Recipe::Delayed);
  EXPECT_EQ(c.training.fp8_amax_history_len, 1);
  EXPECT_EQ(c.training.fp8_amax_compute_algo, "most_recent");
  EXPECT_EQ(c.training.fp8_margin, 0);
  EXPECT_TRUE(c.training.fp8_wgrad);
  const Config back = parse_config(config_to_yaml(c), "resolved.yaml");
  EXPECT_EQ(back.training.fp8_format, Fp8Format::Hybrid);
  EXPECT_EQ(parse_config(config_to_yaml(parse_config(kBase, "t")), "r").training.fp8_format, Fp8Format::None);
}

TEST(Fp8Config, BadCombinationsNameTheirKeys) {
  auto err = [](std::vector<std::string> sets) { return config_test::error_of(kBase, sets); };
  EXPECT_HAS(err({"training.fp8_format=e4m3"}), "training.fp8_format: FP8 training needs training.precision: bf16");
  EXPECT_HAS(err({"training.fp8_format=hybrid", "training.precision=fp16"}), "got fp16");
  EXPECT_HAS(error_of_set("training.fp8_format=e5m2"), "training.fp8_format: unknown value 'e5m2' (allowed: null | e4m3 | hybrid)");
  EXPECT_HAS(error_of_set("training.fp8_recipe=mxfp8"), "(allowed: delayed | tensorwise | blockwise)");
  EXPECT_HAS(error_of_set("training.fp8_amax_compute_algo=mean"), "(allowed: max | most_recent)");
  EXPECT_HAS(error_of_set("training.fp8_margin=-1"), "training.fp8_margin: must be >= 0");
  EXPECT_HAS(error_of_set("training.fp8_amax_history_len=0"), "training.fp8_amax_history_len: must be >= 1");
  const std::vector<std::string> fp8 = {"training.precision=bf16", "training.fp8_format=e4m3"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), fp8.begin(), fp8.end());
    return more;
  };
  EXPECT_HAS(err(with({"training.first_last_layers_bf16=true", "training.num_layers_at_end_in_bf16=2"})),
             "training.num_layers_at_start_in_bf16: 1 + training.num_layers_at_end_in_bf16 (2) bf16 layers exceed "
             "model.num_layers (2)");
  // blockwise: hidden 64 is not a multiple of 128; hidden 256 (2 heads of 128, ffn 1024) is, and stays so
  // under TP 2 until ffn 640 leaves 320 per rank
  EXPECT_HAS(err(with({"training.fp8_recipe=blockwise"})), "training.fp8_recipe: blockwise scaling");
  EXPECT_HAS(err(with({"training.fp8_recipe=blockwise"})), "model.hidden_size = 64 is not");
  std::vector<std::string> big = with({"training.fp8_recipe=blockwise", "model.hidden_size=256",
                                       "model.num_attention_heads=2", "parallel.tensor_model_parallel_size=2"});
  EXPECT_NO_THROW(parse_config(kBase, "test.yaml", big));
  big.push_back("model.ffn_hidden_size=640");
  EXPECT_HAS(err(big), "model.ffn_hidden_size / TP = 320 is not");
  // without fp8_format the recipe keys are not read (Megatron)
  EXPECT_NO_THROW(parse_config(kBase, "test.yaml", {"training.fp8_recipe=blockwise"}));
}

}  // namespace
}  // namespace tpt
