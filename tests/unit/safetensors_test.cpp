// safetensors reader/writer and the fp32 <-> bf16 / fp16 conversions of core/dtype.h, checked
// against hand-computed bit patterns.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/safetensors.h"

namespace tpt {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// dtype conversions

float from_bits(uint32_t u) { return bits_to_float(u); }

TEST(DtypeBf16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808000)), 0x3F80);  // 1 + 2^-8: tie, 0x3F80 is even -> down
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F818000)), 0x3F82);  // 1 + 3*2^-8: tie, 0x3F81 is odd -> up
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808001)), 0x3F81);  // just above the tie -> up
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F807FFF)), 0x3F80);  // just below the tie -> down
  EXPECT_EQ(fp32_to_bf16(3.14159265f), 0x4049);            // pi = 0x40490FDB -> 0x4049
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7F7FFFFF)), 0x7F80);  // FLT_MAX rounds up to +inf
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7F7F7FFF)), 0x7F7F);  // largest value that stays finite
}

TEST(DtypeBf16, InfNanSubnormal) {
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFFC00000u, 0x7FFFFFFFu}) {
    const uint16_t h = fp32_to_bf16(from_bits(nan));
    EXPECT_EQ(h & 0x7F80, 0x7F80) << std::hex << nan;
    EXPECT_NE(h & 0x007F, 0) << std::hex << nan;  // still a NaN, never an infinity
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;
    EXPECT_TRUE(std::isnan(bf16_to_fp32(h)));
  }
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00010000)), 0x0001);  // smallest bf16 subnormal, exact
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00018000)), 0x0002);  // tie between 1 and 2 -> even 2
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00008000)), 0x0000);  // tie between 0 and 1 -> even 0
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00008001)), 0x0001);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x807FFFFF)), 0x8080);  // largest negative subnormal -> -2^-126
  EXPECT_EQ(float_to_bits(bf16_to_fp32(0x0001)), 0x00010000u);
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0xC049), -3.140625f);
  EXPECT_EQ(bf16_to_fp32(0xFF80), -std::numeric_limits<float>::infinity());
  // Every non-NaN bf16 survives bf16 -> fp32 -> bf16.
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7F80) != 0x7F80 || (h & 0x7F) == 0) {
      ASSERT_EQ(fp32_to_bf16(bf16_to_fp32(uint16_t(h))), h);
    }
  }
  EXPECT_EQ(round_to_bf16(1.00390625f), 1.0f);
}

TEST(DtypeFp16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(0.1f), 0x2E66);
  EXPECT_EQ(fp32_to_fp16(0.5f), 0x3800);
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);      // tie, 0x3C00 even -> down
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie, 0x3C01 odd -> up
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);  // max half
  EXPECT_EQ(fp32_to_fp16(65519.99f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);  // tie between 65504 (odd) and 2^16 -> inf
  EXPECT_EQ(fp32_to_fp16(-1e10f), 0xFC00);
  EXPECT_EQ(fp32_to_fp16(2047.0f), 0x67FF);
  EXPECT_EQ(fp32_to_fp16(2049.0f), 0x6800);  // tie between 2048 (even) and 2050 -> 2048
  EXPECT_EQ(fp32_to_fp16(2051.0f), 0x6802);  // tie between 2050 (odd) and 2052 -> 2052
}

TEST(DtypeFp16, InfNanSubnormal) {
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFFC00000u}) {
    const uint16_t h = fp32_to_fp16(from_bits(nan));
    EXPECT_EQ(h & 0x7C00, 0x7C00) << std::hex << nan;
    EXPECT_NE(h & 0x03FF, 0) << std::hex << nan;
    EXPECT_EQ(h & 0x8000, (nan >> 16) & 0x8000);
  }
  EXPECT_EQ(fp32_to_fp16(0x1p-14f), 0x0400);                // smallest normal
  EXPECT_EQ(fp32_to_fp16(0x1p-24f), 0x0001);                // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(-0x1p-24f), 0x8001);
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);                // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(fp32_to_fp16(from_bits(0x33000001)), 0x0001);  // just above 2^-25
  EXPECT_EQ(fp32_to_fp16(3 * 0x1p-25f), 0x0002);            // 1.5 units: tie -> even 2
  EXPECT_EQ(fp32_to_fp16(5 * 0x1p-25f), 0x0002);            // 2.5 units: tie -> even 2
  EXPECT_EQ(fp32_to_fp16(7 * 0x1p-25f), 0x0004);            // 3.5 units: tie -> even 4
  EXPECT_EQ(fp32_to_fp16(1023 * 0x1p-24f), 0x03FF);         // largest subnormal
  EXPECT_EQ(fp32_to_fp16(1023.5f * 0x1p-24f), 0x0400);      // tie -> rounds up into the normals
  EXPECT_EQ(fp32_to_fp16(1e-10f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(from_bits(0x00000001)), 0x0000);  // fp32 subnormal
  EXPECT_EQ(fp16_to_fp32(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_fp32(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(fp16_to_fp32(0x8001), -0x1p-24f);
  EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_fp32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_fp32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7C01)));
  EXPECT_TRUE(std::signbit(fp16_to_fp32(0x8000)));
  // Every non-NaN half survives half -> fp32 -> half.
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7C00) != 0x7C00 || (h & 0x3FF) == 0) {
      ASSERT_EQ(fp32_to_fp16(fp16_to_fp32(uint16_t(h))), h);
    }
  }
  EXPECT_EQ(round_to_fp16(0.1f), 0.0999755859375f);
}

#if defined(__FLT16_MAX__) && !defined(__CUDACC__)
// The compiler's own _Float16 conversion (IEEE, ties to even) as a second reference.
TEST(DtypeFp16, AgreesWithCompilerFloat16) {
  uint64_t state = 12345;
  for (int i = 0; i < 2000000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t bits = static_cast<uint32_t>(state >> 32);
    const float f = from_bits(bits);
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(fp32_to_fp16(f), ref_bits) << std::hex << "fp32 bits 0x" << bits;
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// safetensors

class SafetensorsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("tpt_st_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // A file from a header JSON text and raw data bytes (header not padded unless the text is).
  std::string write_raw(const std::string& name, const std::string& header, const std::vector<uint8_t>& data) {
    std::ofstream f(path(name), std::ios::binary | std::ios::trunc);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    return path(name);
  }
  std::string dir_;
};

void expect_input_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no InputError thrown (expected one mentioning " << needles.at(0) << ")";
  } catch (const InputError& e) {
    for (const std::string& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "message: " << e.what() << "\nmissing: " << n;
  }
}

TEST_F(SafetensorsFiles, RoundTripWithMetadata) {
  std::vector<float> a(6), b = {-1.5f, 2.25f}, scalar = {42.0f};
  for (int i = 0; i < 6; ++i) a[i] = 0.5f * i;
  SafetensorsWriter w;
  w.add("h.0.attn.c_attn.weight", {2, 3}, a.data());
  w.add("bias", {2}, b.data());
  w.add("scalar", {}, scalar.data());
  w.add("empty", {0, 4}, nullptr);
  w.set_metadata("format", "pt");
  w.set_metadata("iteration", "200");
  w.write(path("m.safetensors"));

  // On disk: 8-byte length, header padded with spaces so that the data starts 8-byte aligned.
  std::ifstream f(path("m.safetensors"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), {});
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 4 * (6 + 2 + 1));
  EXPECT_EQ(bytes[8], '{');
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));

  SafetensorsReader r(path("m.safetensors"));
  EXPECT_EQ(r.names(), (std::vector<std::string>{"bias", "empty", "h.0.attn.c_attn.weight", "scalar"}));
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("iteration"), "200");
  const SafetensorInfo& info = r.info("h.0.attn.c_attn.weight");
  EXPECT_EQ(info.dtype, "F32");
  EXPECT_EQ(info.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(info.numel(), 6);
  std::vector<float> back(6);
  r.read("h.0.attn.c_attn.weight", back.data());
  EXPECT_EQ(back, a);
  std::vector<float> back_b(2), back_s(1);
  r.read("bias", back_b.data());
  r.read("scalar", back_s.data());
  EXPECT_EQ(back_b, b);
  EXPECT_EQ(back_s[0], 42.0f);
  EXPECT_TRUE(r.info("scalar").shape.empty());
  EXPECT_EQ(r.info("empty").numel(), 0);
  EXPECT_TRUE(r.contains("bias"));
  EXPECT_FALSE(r.contains("nope"));
  expect_input_error([&] { r.info("nope"); }, {path("m.safetensors"), "nope"});
}

TEST_F(SafetensorsFiles, BoxReadsOf3DTensor) {
  const int64_t D0 = 3, D1 = 4, D2 = 5;
  std::vector<float> t(D0 * D1 * D2);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(i);
  SafetensorsWriter w;
  w.add("t", {D0, D1, D2}, t.data());
  w.write(path("t.safetensors"));
  SafetensorsReader r(path("t.safetensors"));

  struct Box {
    std::vector<int64_t> off, size;
  };
  for (const Box& box : {Box{{1, 1, 2}, {2, 3, 2}}, Box{{0, 0, 0}, {3, 4, 5}}, Box{{2, 3, 4}, {1, 1, 1}},
                         Box{{0, 2, 0}, {3, 2, 5}}, Box{{1, 0, 3}, {1, 4, 2}}}) {
    std::vector<float> got(static_cast<size_t>(box.size[0] * box.size[1] * box.size[2]), -1.0f);
    r.read_box("t", box.off, box.size, got.data());
    size_t k = 0;
    for (int64_t i = 0; i < box.size[0]; ++i)
      for (int64_t j = 0; j < box.size[1]; ++j)
        for (int64_t l = 0; l < box.size[2]; ++l, ++k)
          ASSERT_EQ(got[k], static_cast<float>(((box.off[0] + i) * D1 + box.off[1] + j) * D2 + box.off[2] + l))
              << "box at " << box.off[0] << "," << box.off[1] << "," << box.off[2] << " element " << k;
  }
  float untouched = -7.0f;
  r.read_box("t", std::vector<int64_t>{0, 0, 0}, std::vector<int64_t>{3, 0, 5}, &untouched);
  EXPECT_EQ(untouched, -7.0f);
  std::vector<float> sink(64);
  expect_input_error([&] { r.read_box("t", std::vector<int64_t>{2, 0, 0}, std::vector<int64_t>{2, 1, 1}, sink.data()); },
                     {path("t.safetensors"), "'t'", "outside"});
  expect_input_error([&] { r.read_box("t", std::vector<int64_t>{0, 0}, std::vector<int64_t>{1, 1}, sink.data()); },
                     {path("t.safetensors"), "dimensions"});
}

TEST_F(SafetensorsFiles, ReadsF16Bf16F64AsFloat) {
  std::vector<uint8_t> data;
  auto put16 = [&](uint16_t v) { data.push_back(v & 0xFF), data.push_back(v >> 8); };
  for (uint16_t h : {0x3C00, 0xC000, 0x3555, 0x0001}) put16(h);  // F16: 1, -2, 0.333251953125, 2^-24
  for (uint16_t h : {0x3F80, 0xC049, 0x7F7F}) put16(h);          // BF16: 1, -3.140625, its largest
  for (double d : {0.25, -1e30}) {  // (inf, or an F64 past float's range, is refused: below)
    uint8_t b[8];
    std::memcpy(b, &d, 8);
    data.insert(data.end(), b, b + 8);
  }
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]},)"
      R"("d":{"dtype":"F64","shape":[2],"data_offsets":[14,30]},)"
      R"("i":{"dtype":"I32","shape":[0],"data_offsets":[30,30]}})";
  SafetensorsReader r(write_raw("mixed.safetensors", header, data));  // unpadded header, unaligned data
  std::vector<float> h(4), b(3), d(2);
  r.read("h", h.data());
  r.read("b", b.data());
  r.read("d", d.data());
  EXPECT_EQ(h, (std::vector<float>{1.0f, -2.0f, 0.333251953125f, 0x1p-24f}));
  EXPECT_EQ(b, (std::vector<float>{1.0f, -3.140625f, 3.3895314e38f}));
  EXPECT_EQ(d[0], 0.25f);
  EXPECT_EQ(d[1], -1e30f);
  std::vector<float> hb(2);
  r.read_box("h", std::vector<int64_t>{1, 0}, std::vector<int64_t>{1, 2}, hb.data());
  EXPECT_EQ(hb, (std::vector<float>{0.333251953125f, 0x1p-24f}));
  EXPECT_EQ(r.info("i").dtype, "I32");
  expect_input_error([&] { r.read("i", h.data()); }, {"mixed.safetensors", "'i'", "I32"});
}

TEST_F(SafetensorsFiles, CorruptFilesAreInputErrorsNamingTheFile) {
  const std::vector<uint8_t> data(16, 0);
  struct Case {
    std::string name, header, what;
  };
  const std::vector<Case> cases = {
      {"json", R"({"a":{"dtype":"F32",)", "not valid JSON"},
      {"notobj", R"([1,2])", "not a JSON object"},
      {"past_end", R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", "'a'"},
      {"size", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "need 12"},
      {"reversed", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", "reversed"},
      {"overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", "overlap"},
      {"dtype", R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", "unknown dtype 'Q7'"},
      {"noshape", R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "shape"},
      {"negshape", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "shape"},
      {"huge", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", "more bytes"},
      {"offsets", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "data_offsets"},
      {"meta", R"({"__metadata__":{"k":5}})", "__metadata__"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string p = write_raw(c.name + ".safetensors", c.header, data);
    expect_input_error([&] { SafetensorsReader r(p); }, {p, c.what});
  }
  // Header length past the end, and a file shorter than the length field.
  {
    std::ofstream f(path("len.safetensors"), std::ios::binary);
    const uint64_t n = 1000;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << "{}";
  }
  expect_input_error([&] { SafetensorsReader r(path("len.safetensors")); }, {path("len.safetensors"), "header length"});
  {
    std::ofstream f(path("tiny.safetensors"), std::ios::binary);
    f << "abc";
  }
  expect_input_error([&] { SafetensorsReader r(path("tiny.safetensors")); }, {path("tiny.safetensors"), "8-byte"});
  expect_input_error([&] { SafetensorsReader r(path("absent.safetensors")); }, {path("absent.safetensors")});
  expect_input_error([&] { SafetensorsWriter().write(path("no/dir/x.safetensors")); }, {path("no/dir/x.safetensors")});
}

// Every tensor that enters is finite (the first bad value named by tensor and index, in every
// stored dtype); a box that does not reach the bad value reads. Every tensor that leaves in a
// narrower dtype fits it: a finite value that would round to inf is refused, naming max |w| and a
// dtype that holds it.
TEST_F(SafetensorsFiles, NonFiniteValuesInAndOverflowOutAreRefused) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> a(12, 0.5f), b(6, -1.0f), c(5, 2.0f);
  a[9] = nan;   // [2, 1] of [3, 4]
  a[11] = inf;  // after the first: not the one named
  b[3] = -inf;  // [1, 0, 1] of [2, 1, 3]
  c[4] = inf;
  SafetensorsWriter w;
  w.add("a", {3, 4}, a.data());
  w.add("b", {2, 1, 3}, b.data(), DType::BF16);  // non-finite values are no overflow: written as they are
  w.add("c", {5}, c.data(), DType::F16);
  w.write(path("bad.safetensors"));
  SafetensorsReader r(path("bad.safetensors"));
  std::vector<float> out(12);
  const double huge = -1e300;  // F64 past float's range: -inf once converted
  std::vector<uint8_t> raw(8);
  std::memcpy(raw.data(), &huge, 8);
  SafetensorsReader r64(write_raw("f64.safetensors", R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", raw));
  expect_input_error([&] { r64.read("x", out.data()); }, {"tensor 'x'", "holds -inf at index [0]"});
  expect_input_error([&] { r.read("a", out.data()); }, {path("bad.safetensors"), "tensor 'a'", "holds NaN at index [2, 1]"});
  expect_input_error([&] { r.read("b", out.data()); }, {"tensor 'b'", "holds -inf at index [1, 0, 0]"});
  expect_input_error([&] { r.read("c", out.data()); }, {"tensor 'c'", "holds +inf at index [4]"});
  std::vector<int64_t> at{0, 0}, rows{2, 4};
  r.read_box("a", at, rows, out.data());  // rows 0-1 hold no bad value
  EXPECT_EQ(out[7], 0.5f);
  at = {2, 2};
  rows = {1, 2};
  expect_input_error([&] { r.read_box("a", at, rows, out.data()); }, {"holds +inf at index [2, 3]"});

  std::vector<float> big(4, 1.0f);
  big[2] = -70000.0f;
  expect_input_error([&] { SafetensorsWriter().add("w", {2, 2}, big.data(), DType::F16); },
                     {"tensor 'w': max |w| 70000 overflows F16 (largest 65504); BF16 or F32 hold it"});
  big[2] = 65519.0f;  // rounds to 65504: fits
  SafetensorsWriter().add("w", {2, 2}, big.data(), DType::F16);
  big[2] = 3.4e38f;
  expect_input_error([&] { SafetensorsWriter().add("w", {2, 2}, big.data(), DType::BF16); },
                     {"max |w| 3.4e+38 overflows BF16", "F32 holds it"});
  expect_input_error([&] { SafetensorsWriter().add("w", {2, 2}, big.data(), DType::F16); }, {"overflows F16", "F32 holds it"});
  SafetensorsWriter().add("w", {2, 2}, big.data(), DType::F32);
}

}  // namespace
}  // namespace tpt
