// The optimizer step as multi-tensor work (Ops::grad_stats, Ops::adamw_segments) on the GPU against
// the CPU backend, which runs the same table segment by segment through its single-range calls. The
// tables are longer than one launch takes (kTableSegments = 512), with gaps the step must not touch,
// segments of every size around the kernels' chunk, mixed flags and a sharded master.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace tpt::gpu_test {
namespace {

// count segments of 1 .. 5000 elements with gaps of 0 .. 3 between them, flags at random; the
// owned-array offsets (local) run without gaps. Returns the buffer size.
int64_t make_table(std::vector<TensorSegment>& segs, int count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> size(1, 5000), gap(0, 3), coin(0, 1);
  int64_t at = 0, local = 0;
  for (int j = 0; j < count; ++j) {
    at += gap(gen);
    const int64_t n = j % 7 == 0 ? 4096 + j % 3 - 1 : size(gen);  // chunk-sized ones too
    segs.push_back({at, local, n, coin(gen) == 1});
    at += n;
    local += n;
  }
  return at + 5;
}

AdamWParams adamw_params(int step) {
  AdamWParams a{};
  a.lr = 3e-3f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f;
  a.one_minus_beta1 = float(1.0 - 0.9), a.one_minus_beta2 = float(1.0 - 0.95);
  a.bias_correction1 = float(1.0 - std::pow(0.9, step));
  a.bias_correction2 = float(1.0 - std::pow(0.95, step));
  return a;
}

}  // namespace

TEST(GpuOptimizer, AdamWSegmentsMatchCpu) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  std::vector<TensorSegment> segs;
  const int64_t total = make_table(segs, 1100, 7);
  const int64_t owned = segs.back().local + segs.back().n;
  for (int variant = 0; variant < 3; ++variant) {
    const bool sharded = variant == 2;
    const DType t = variant == 0 ? DType::BF16 : DType::F32;
    SCOPED_TRACE(std::string(dtype_name(t)) + (sharded ? ", sharded master" : ""));
    const int64_t master_n = sharded ? owned : total;
    Pair p(*cpu, *gpu, randn(size_t(master_n), 131)), g(*cpu, *gpu, randn(size_t(total), 132)),
        m(*cpu, *gpu, VecF(size_t(owned))), v(*cpu, *gpu, VecF(size_t(owned))),
        c(*cpu, *gpu, VecF(size_t(total), 7.0f), t);
    for (int step = 1; step <= 2; ++step) {
      const float clip = step == 1 ? 0.37f : 1.0f;
      const AdamWParams a = adamw_params(step);
      cpu->adamw_segments({p.cpu.f32(), sharded, g.cpu.f32(), m.cpu.f32(), v.cpu.f32(), c.cpu.buf()}, segs, a, clip);
      gpu->adamw_segments({p.gpu.f32(), sharded, g.gpu.f32(), m.gpu.f32(), v.gpu.f32(), c.gpu.buf()}, segs, a, clip);
    }
    EXPECT_TRUE(close(p.gpu.host(), p.cpu.host(), 1e-6, 1e-7));
    EXPECT_TRUE(close(m.gpu.host(), m.cpu.host(), 1e-6, 1e-7));
    EXPECT_TRUE(close(v.gpu.host(), v.cpu.host(), 1e-6, 1e-9));
    const VecF cg = c.gpu.host();
    EXPECT_TRUE(close(cg, c.cpu.host(), 1e-6 + ulp(t), 1e-7));
    EXPECT_EQ(cg[size_t(total - 1)], 7.0f) << "the gaps of the table stay as they were";
    EXPECT_TRUE(bitwise(g.gpu.host(), g.cpu.host())) << "the gradients are read, never written";
  }
}

// The precision-aware optimizer's bf16 moments (optimizer.exp_avg_dtype / exp_avg_sq_dtype): the
// kernel reads them as fp32 and stores them rounded, as the CPU backend does -- alone, one of the
// two, and with remainders; within a bf16 step of the CPU where the fp32 math differs in its last bit.
TEST(GpuOptimizer, AdamWSegmentsWithBf16MomentsMatchCpu) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  std::vector<TensorSegment> segs;
  const int64_t total = make_table(segs, 600, 13);
  const int64_t owned = segs.back().local + segs.back().n;
  for (int variant = 0; variant < 3; ++variant) {  // both bf16; only exp_avg; only exp_avg_sq
    const DType tm = variant == 2 ? DType::F32 : DType::BF16, tv = variant == 1 ? DType::F32 : DType::BF16;
    SCOPED_TRACE("exp_avg " + std::string(dtype_name(tm)) + ", exp_avg_sq " + dtype_name(tv));
    Pair p(*cpu, *gpu, randn(size_t(owned), 161, 0.05f)), g(*cpu, *gpu, randn(size_t(total), 162)),
        m(*cpu, *gpu, VecF(size_t(owned)), tm), v(*cpu, *gpu, VecF(size_t(owned)), tv),
        c(*cpu, *gpu, VecF(size_t(total), 7.0f), DType::BF16);
    for (int step = 1; step <= 3; ++step) {
      const float clip = step == 1 ? 0.37f : 1.0f;
      const AdamWParams a = adamw_params(step);
      cpu->adamw_segments({p.cpu.f32(), true, g.cpu.f32(), m.cpu.buf(), v.cpu.buf(), c.cpu.buf()}, segs, a, clip);
      gpu->adamw_segments({p.gpu.f32(), true, g.gpu.f32(), m.gpu.buf(), v.gpu.buf(), c.gpu.buf()}, segs, a, clip);
    }
    // a moment that rounds one bf16 step apart changes that step's update m / sqrt(v) by up to a step
    // (measured on an H200: 3.8e-6 = 1.3e-3 lr after 3 steps): 3 steps x lr x ulp, far below one update (lr)
    EXPECT_TRUE(close(p.gpu.host(), p.cpu.host(), 1e-5, 3 * adamw_params(1).lr * ulp(DType::BF16)));
    EXPECT_TRUE(close(m.gpu.host(), m.cpu.host(), std::max(ulp(tm), 1e-6), 1e-9));
    EXPECT_TRUE(close(v.gpu.host(), v.cpu.host(), std::max(ulp(tv), 1e-6), 1e-12));
    const VecF mh = m.cpu.host();
    bool rounded = true;  // what is stored is a bf16 value (also seen through the fp32 view of the CPU)
    for (float x : mh) rounded = rounded && (tm == DType::F32 || (float_to_bits(x) & 0xFFFFu) == 0);
    EXPECT_TRUE(rounded);
    EXPECT_EQ(c.gpu.host()[size_t(total - 1)], 7.0f) << "the gaps of the table stay as they were";
  }
}

// Transformer Engine's scaled fp16 states (core/math.h adamw_state_step): fp16 moments and an fp16
// sharded master, 40 tensors across the table. The first pass's per-tensor amaxes (the kernel's
// atomic maxima against the CPU's sequential ones), then -- both backends given the CPU's scales, as
// after the trainer's reduction -- the stored codes and the compute copy, over three steps.
TEST(GpuOptimizer, AdamWSegmentsWithScaledFp16StatesMatchCpu) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  std::vector<TensorSegment> segs;
  const int64_t total = make_table(segs, 700, 17);
  const int64_t owned = segs.back().local + segs.back().n;
  constexpr int kTensors = 40;
  for (size_t j = 0; j < segs.size(); ++j) segs[j].tensor = int(j % kTensors);
  for (int variant = 0; variant < 2; ++variant) {  // fp16 moments with an fp32 master; all three fp16
    const DType tp = variant == 0 ? DType::F32 : DType::F16;
    SCOPED_TRACE(std::string("master ") + dtype_name(tp));
    Pair p(*cpu, *gpu, randn(size_t(owned), 171, 0.05f), tp), g(*cpu, *gpu, randn(size_t(total), 172)),
        m(*cpu, *gpu, VecF(size_t(owned)), DType::F16), v(*cpu, *gpu, VecF(size_t(owned)), DType::F16),
        c(*cpu, *gpu, VecF(size_t(total), 7.0f), DType::BF16);
    // the master's codes were uploaded as fp16(x): scale 1 decodes them (later scales from its amax)
    Pair scales(*cpu, *gpu, VecF(size_t(3 * kTensors), 1.0f)), amax(*cpu, *gpu, VecF(size_t(3 * kTensors)));
    Pair next(*cpu, *gpu, VecF(size_t(3 * kTensors)));
    auto buffers = [&](Dev& pp, Dev& gg, Dev& mm, Dev& vv, Dev& cc, Dev& ss, Dev& aa) {
      AdamWBuffers b{pp.buf(), true, gg.buf(), mm.buf(), vv.buf(), cc.buf()};
      b.scales = ss.f32();
      b.amax = aa.f32();
      b.tensors = kTensors;
      return b;
    };
    for (int step = 1; step <= 3; ++step) {
      const float clip = step == 1 ? 0.37f : 1.0f;
      const AdamWParams a = adamw_params(step);
      const AdamWBuffers bc = buffers(p.cpu, g.cpu, m.cpu, v.cpu, c.cpu, scales.cpu, amax.cpu),
                         bg = buffers(p.gpu, g.gpu, m.gpu, v.gpu, c.gpu, scales.gpu, amax.gpu);
      cpu->adamw_segments(bc, segs, a, clip);
      gpu->adamw_segments(bg, segs, a, clip);
      const VecF ac = amax.cpu.host();
      EXPECT_TRUE(close(amax.gpu.host(), ac, 1e-6, 0.0)) << "step " << step;
      VecF ns(ac.size());
      for (size_t i = 0; i < ac.size(); ++i) ns[i] = fp16_state_scale(ac[i]);
      next.cpu.upload(ns);
      next.gpu.upload(ns);
      cpu->adamw_store_scaled(bc, segs, a, clip, next.cpu.f32());
      gpu->adamw_store_scaled(bg, segs, a, clip, next.gpu.f32());
      scales.cpu.upload(ns);
      scales.gpu.upload(ns);
    }
    // codes within one fp16 step where the fp32 math differs in its last bit
    EXPECT_TRUE(close(m.gpu.host(), m.cpu.host(), ulp(DType::F16), 1.0));
    EXPECT_TRUE(close(v.gpu.host(), v.cpu.host(), ulp(DType::F16), 1.0));
    EXPECT_TRUE(close(p.gpu.host(), p.cpu.host(), tp == DType::F16 ? ulp(DType::F16) : 1e-5, tp == DType::F16 ? 1.0 : 1e-7));
    // the compute copy rounds the decoded master, whose code may be a step (1 / its scale) apart
    const VecF sc = scales.cpu.host();
    double code_step = 1e-7;
    for (int j = 0; j < kTensors; ++j) code_step = std::max(code_step, 1.0 / sc[size_t(3 * j + 2)]);
    EXPECT_TRUE(close(c.gpu.host(), c.cpu.host(), ulp(DType::BF16), tp == DType::F16 ? code_step : 1e-7));
    EXPECT_EQ(c.gpu.host()[size_t(total - 1)], 7.0f) << "the gaps of the table stay as they were";
    const VecF mc = m.cpu.host();
    EXPECT_GT(*std::max_element(mc.begin(), mc.end()), 16000.0f) << "codes use the fp16 range";
  }
}

// optimizer.store_param_remainders: the kernel over remainders (master = bf16 compute bits + low
// half) moves the weights bit for bit as the kernel over fp32 master weights with a bf16 compute
// copy, whole and sharded, and as the CPU backend's remainders within rounding.
TEST(GpuOptimizer, AdamWSegmentsWithRemaindersBitwiseAsFp32Master) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  std::vector<TensorSegment> segs;
  const int64_t total = make_table(segs, 700, 11);
  const int64_t owned = segs.back().local + segs.back().n;
  for (const bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "sharded" : "whole");
    const int64_t master_n = sharded ? owned : total;
    VecF master = randn(size_t(master_n), 151, 0.05f);
    for (size_t i = 0; i < master.size(); i += 3)  // exact ties of the bf16 rounding
      master[i] = bits_to_float((float_to_bits(master[i]) & 0xFFFF0000u) | 0x8000u);
    // the compute copy (by offset) of each owned element, and its remainder (indexed as master)
    std::vector<uint16_t> bits(static_cast<size_t>(total), 0), low(static_cast<size_t>(master_n), 0);
    for (const TensorSegment& t : segs)
      for (int64_t i = 0; i < t.n; ++i) {
        const float x = master[size_t((sharded ? t.local : t.offset) + i)];
        bits[size_t(t.offset + i)] = master_to_bf16(x);
        low[size_t((sharded ? t.local : t.offset) + i)] = master_remainder(x);
      }
    Pair p(*cpu, *gpu, master), g(*cpu, *gpu, randn(size_t(total), 152)), m(*cpu, *gpu, VecF(size_t(owned))),
        v(*cpu, *gpu, VecF(size_t(owned))), m2(*cpu, *gpu, VecF(size_t(owned))), v2(*cpu, *gpu, VecF(size_t(owned)));
    Dev c32(*gpu, size_t(total), DType::BF16), c16(*gpu, size_t(total), DType::BF16), c16c(*cpu, size_t(total), DType::BF16);
    Dev rem(*gpu, size_t(master_n), DType::BF16), remc(*cpu, size_t(master_n), DType::BF16);
    for (const Dev* d : {&c32, &c16}) gpu->to_device(d->buf(), bits.data(), total);
    cpu->to_device(c16c.buf(), bits.data(), total);
    gpu->to_device(rem.buf(), low.data(), master_n);
    cpu->to_device(remc.buf(), low.data(), master_n);
    auto* r = static_cast<uint16_t*>(rem.buf().p);
    auto* rc = static_cast<uint16_t*>(remc.buf().p);
    for (int step = 1; step <= 3; ++step) {
      const float clip = step == 1 ? 0.37f : 1.0f;
      const AdamWParams a = adamw_params(step);
      gpu->adamw_segments({p.gpu.f32(), sharded, g.gpu.f32(), m.gpu.f32(), v.gpu.f32(), c32.buf()}, segs, a, clip);
      gpu->adamw_segments({nullptr, sharded, g.gpu.f32(), m2.gpu.f32(), v2.gpu.f32(), c16.buf(), r}, segs, a, clip);
      cpu->adamw_segments({nullptr, sharded, g.cpu.f32(), m2.cpu.f32(), v2.cpu.f32(), c16c.buf(), rc}, segs, a, clip);
    }
    EXPECT_TRUE(bitwise(c16.host(), c32.host()));
    EXPECT_TRUE(bitwise(m2.gpu.host(), m.gpu.host()));
    EXPECT_TRUE(bitwise(v2.gpu.host(), v.gpu.host()));
    const size_t nt = size_t(total), nm = size_t(master_n);
    std::vector<uint16_t> b16(nt), l16(nm), b16c(nt), l16c(nm);
    gpu->to_host(b16.data(), c16.buf(), total);
    gpu->to_host(l16.data(), rem.buf(), master_n);
    cpu->to_host(b16c.data(), c16c.buf(), total);
    cpu->to_host(l16c.data(), remc.buf(), master_n);
    const VecF want = p.gpu.host();
    VecF merged(nm, 0.0f), merged_cpu(nm, 0.0f), want_owned(nm, 0.0f);
    for (const TensorSegment& t : segs)
      for (int64_t i = 0; i < t.n; ++i) {
        const size_t at = size_t((sharded ? t.local : t.offset) + i), off = size_t(t.offset + i);
        merged[at] = master_from_remainder(b16[off], l16[at]);
        merged_cpu[at] = master_from_remainder(b16c[off], l16c[at]);
        want_owned[at] = want[at];
      }
    EXPECT_TRUE(bitwise(merged, want_owned)) << "the merged master weights are the fp32 ones";
    EXPECT_TRUE(close(merged, merged_cpu, 1e-6, 1e-7));
  }
}

TEST(GpuReductions, GradStatsMatchCpu) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  std::vector<TensorSegment> segs;
  const int64_t total = make_table(segs, 1300, 9);
  VecF x = randn(size_t(total), 141);
  Pair a(*cpu, *gpu, x);
  const GradStats c = cpu->grad_stats(a.cpu, segs), g = gpu->grad_stats(a.gpu, segs);
  EXPECT_NEAR(g.sum_squares, c.sum_squares, 1e-12 * c.sum_squares);
  EXPECT_GT(c.sum_squares, 0.0);
  EXPECT_FALSE(g.nonfinite);
  EXPECT_EQ(gpu->grad_stats(a.gpu, {}).sum_squares, 0.0);
  // an inf in a gap is no one's; a nan in a segment left out of the norm still counts as non-finite
  const size_t gap = size_t(total - 1);
  size_t unflagged = 0;
  for (const TensorSegment& s : segs)
    if (!s.flag) unflagged = size_t(s.offset + s.n - 1);
  VecF y = x;
  y[gap] = std::numeric_limits<float>::infinity();
  Dev b(*gpu, y);
  EXPECT_FALSE(gpu->grad_stats(b, segs).nonfinite);
  y[unflagged] = std::numeric_limits<float>::quiet_NaN();
  b.upload(y);
  const GradStats bad = gpu->grad_stats(b, segs);
  EXPECT_TRUE(bad.nonfinite);
  EXPECT_NEAR(bad.sum_squares, c.sum_squares, 1e-12 * c.sum_squares) << "the norm skips the unflagged segment";
}

}  // namespace tpt::gpu_test
