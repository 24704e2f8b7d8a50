// Every CudaOps method against the CPU backend on random inputs of awkward sizes (no multiples of
// 8, 16 or 32): same arguments, same initial contents of "+=" outputs, results compared element by
// element. fp32 GEMMs with TF32 off agree to summation order; the embedding gradient, casts and
// the AdamW update agree bit for bit or nearly.
#include <limits>

#include "core/cuda/kernels.h"
#include "gpu_test_util.h"

namespace tpt::gpu_test {
namespace {

struct LinearCase {
  int64_t N, I, O;
  bool bias, epilogues;
};

class GpuLinear : public ::testing::TestWithParam<LinearCase> {};

TEST_P(GpuLinear, ForwardAndBackwardMatchCpu) {
  const LinearCase c = GetParam();
  auto cpu = cpu_ops();
  CudaOptions opt;
  opt.gemm_epilogues = c.epilogues;
  auto gpu = gpu_ops(opt);
  Pair inp(*cpu, *gpu, randn(size_t(c.N * c.I), 1)), w(*cpu, *gpu, randn(size_t(c.O * c.I), 2, 0.3f)),
      b(*cpu, *gpu, randn(size_t(c.O), 3)), out(*cpu, *gpu, randn(size_t(c.N * c.O), 4));
  // sums of K products in another order: errors grow like sqrt(K) (a wrong index is off by O(1))
  auto atol = [](int64_t K) { return 2e-5 * std::sqrt(double(K)); };
  cpu->linear_forward(out.cpu, inp.cpu, w.cpu, c.bias ? b.cpu.get() : nullptr, c.N, c.I, c.O);
  gpu->linear_forward(out.gpu, inp.gpu, w.gpu, c.bias ? b.gpu.get() : nullptr, c.N, c.I, c.O);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-5, atol(c.I)));

  Pair dout(*cpu, *gpu, randn(size_t(c.N * c.O), 5)), dinp(*cpu, *gpu, randn(size_t(c.N * c.I), 6)),
      dw(*cpu, *gpu, randn(size_t(c.O * c.I), 7)), db(*cpu, *gpu, randn(size_t(c.O), 8));
  for (bool acc : {false, true}) {
    SCOPED_TRACE(acc ? "accumulate dinp" : "assign dinp");
    cpu->linear_backward(dinp.cpu, dw.cpu, c.bias ? db.cpu.get() : nullptr, dout.cpu, inp.cpu, w.cpu, c.N, c.I, c.O, acc);
    gpu->linear_backward(dinp.gpu, dw.gpu, c.bias ? db.gpu.get() : nullptr, dout.gpu, inp.gpu, w.gpu, c.N, c.I, c.O, acc);
    EXPECT_TRUE(close(dinp.gpu.host(), dinp.cpu.host(), 1e-5, atol(c.O))) << "dinp";
    EXPECT_TRUE(close(dw.gpu.host(), dw.cpu.host(), 1e-5, 3 * atol(c.N))) << "dw";
    EXPECT_TRUE(close(db.gpu.host(), db.cpu.host(), 1e-5, 3 * atol(c.N))) << "dbias";
  }
  // no input gradient (the first layer's)
  cpu->linear_backward(nullptr, dw.cpu, nullptr, dout.cpu, inp.cpu, w.cpu, c.N, c.I, c.O, false);
  gpu->linear_backward(nullptr, dw.gpu, nullptr, dout.gpu, inp.gpu, w.gpu, c.N, c.I, c.O, false);
  EXPECT_TRUE(close(dw.gpu.host(), dw.cpu.host(), 1e-5, 5 * atol(c.N))) << "dw without dinp";
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuLinear,
                         ::testing::Values(LinearCase{37, 45, 67, true, true}, LinearCase{37, 45, 67, true, false},
                                           LinearCase{37, 45, 67, false, true}, LinearCase{1, 3, 5, true, true},
                                           LinearCase{257, 130, 771, true, true},
                                           LinearCase{300, 769, 2307, true, true}));

// 16-bit GEMMs on values representable in the type (mixed precision's operands): the same products
// as the fp32 GEMMs of the CPU backend, summed in fp32.
TEST(GpuLinear16, RepresentableOperandsGiveTheFp32Result) {
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(t == DType::BF16 ? "bf16" : "fp16");
    const int64_t N = 53, I = 99, O = 131;
    auto cpu = cpu_ops();
    CudaOptions opt;
    opt.gemm_inputs = t;
    auto gpu = gpu_ops(opt);
    Pair inp(*cpu, *gpu, rounded(randn(size_t(N * I), 11), t)), w(*cpu, *gpu, rounded(randn(size_t(O * I), 12, 0.2f), t)),
        b(*cpu, *gpu, randn(size_t(O), 13)), out(*cpu, *gpu, VecF(size_t(N * O)));
    cpu->linear_forward(out.cpu, inp.cpu, w.cpu, b.cpu, N, I, O);
    gpu->linear_forward(out.gpu, inp.gpu, w.gpu, b.gpu, N, I, O);
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-5, 2e-4));
    Pair dout(*cpu, *gpu, rounded(randn(size_t(N * O), 14), t)), dinp(*cpu, *gpu, VecF(size_t(N * I))),
        dw(*cpu, *gpu, VecF(size_t(O * I))), db(*cpu, *gpu, VecF(size_t(O)));
    cpu->linear_backward(dinp.cpu, dw.cpu, db.cpu, dout.cpu, inp.cpu, w.cpu, N, I, O, false);
    gpu->linear_backward(dinp.gpu, dw.gpu, db.gpu, dout.gpu, inp.gpu, w.gpu, N, I, O, false);
    EXPECT_TRUE(close(dinp.gpu.host(), dinp.cpu.host(), 1e-5, 2e-4));
    EXPECT_TRUE(close(dw.gpu.host(), dw.cpu.host(), 1e-5, 2e-4));
    EXPECT_TRUE(close(db.gpu.host(), db.cpu.host(), 1e-5, 2e-4));
  }
}

TEST(GpuLinearTf32, CloseToFp32) {
  const int64_t N = 61, I = 250, O = 77;
  auto cpu = cpu_ops();
  CudaOptions opt;
  opt.tf32 = true;
  auto gpu = gpu_ops(opt);
  Pair inp(*cpu, *gpu, randn(size_t(N * I), 21)), w(*cpu, *gpu, randn(size_t(O * I), 22, 0.1f)),
      out(*cpu, *gpu, VecF(size_t(N * O)));
  cpu->linear_forward(out.cpu, inp.cpu, w.cpu, nullptr, N, I, O);
  gpu->linear_forward(out.gpu, inp.gpu, w.gpu, nullptr, N, I, O);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-2, 1e-2));  // TF32: 10-bit mantissa products
}

TEST(GpuLayerNorm, ForwardAndBackwardMatchCpu) {
  for (int64_t C : {int64_t(77), int64_t(1031), int64_t(5)}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const int64_t N = 43;
    auto cpu = cpu_ops();
    auto gpu = gpu_ops();
    VecF x = randn(size_t(N * C), 31, 2.0f);
    for (float& v : x) v += 3.0f;  // a mean far from 0
    Pair inp(*cpu, *gpu, x), w(*cpu, *gpu, randn(size_t(C), 32)), b(*cpu, *gpu, randn(size_t(C), 33)),
        out(*cpu, *gpu, VecF(size_t(N * C))), mean(*cpu, *gpu, VecF(size_t(N))), rstd(*cpu, *gpu, VecF(size_t(N)));
    cpu->layernorm_forward(out.cpu, mean.cpu, rstd.cpu, inp.cpu, w.cpu, b.cpu, N, C, 1e-5f);
    gpu->layernorm_forward(out.gpu, mean.gpu, rstd.gpu, inp.gpu, w.gpu, b.gpu, N, C, 1e-5f);
    EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-5, 1e-5));
    EXPECT_TRUE(close(mean.gpu.host(), mean.cpu.host(), 1e-6, 1e-6));
    EXPECT_TRUE(close(rstd.gpu.host(), rstd.cpu.host(), 1e-6, 1e-6));
    Pair dout(*cpu, *gpu, randn(size_t(N * C), 34)), dinp(*cpu, *gpu, randn(size_t(N * C), 35)),
        dw(*cpu, *gpu, randn(size_t(C), 36)), db(*cpu, *gpu, randn(size_t(C), 37));
    cpu->layernorm_backward(dinp.cpu, dw.cpu, db.cpu, dout.cpu, inp.cpu, w.cpu, mean.cpu, rstd.cpu, N, C);
    gpu->layernorm_backward(dinp.gpu, dw.gpu, db.gpu, dout.gpu, inp.gpu, w.gpu, mean.gpu,
                            rstd.gpu, N, C);
    EXPECT_TRUE(close(dinp.gpu.host(), dinp.cpu.host(), 1e-5, 2e-5));
    EXPECT_TRUE(close(dw.gpu.host(), dw.cpu.host(), 1e-5, 5e-5));
    EXPECT_TRUE(close(db.gpu.host(), db.cpu.host(), 1e-5, 5e-5));
  }
}

struct AttnCase {
  int64_t B, T, H, D;
};

class GpuAttention : public ::testing::TestWithParam<AttnCase> {};

// The Ops methods (flash-style kernels) against the CPU backend, and against the naive reference
// kernels on a (B, H, T, T) buffer.
TEST_P(GpuAttention, ForwardAndBackwardMatchCpuAndReference) {
  const auto [B, T, H, D] = GetParam();
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  const size_t nqkv = size_t(B * T * 3 * H * D), nout = size_t(B * T * H * D), nl = size_t(B * H * T),
               np = size_t(B * H * T * T);
  Pair qkv(*cpu, *gpu, randn(nqkv, 41)), out(*cpu, *gpu, randn(nout, 42)), lse(*cpu, *gpu, randn(nl, 43));
  cpu->attention_forward(out.cpu, lse.cpu, qkv.cpu, B, T, H, D);
  gpu->attention_forward(out.gpu, lse.gpu, qkv.gpu, B, T, H, D);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-5, 1e-5)) << "out";
  EXPECT_TRUE(close(lse.gpu.host(), lse.cpu.host(), 1e-5, 1e-5)) << "lse";
  Pair dout(*cpu, *gpu, randn(nout, 44)), dqkv(*cpu, *gpu, randn(nqkv, 45)), scratch(*cpu, *gpu, randn(nl, 46));
  cpu->attention_backward(dqkv.cpu, scratch.cpu, dout.cpu, qkv.cpu, out.cpu, lse.cpu, B, T, H, D);
  gpu->attention_backward(dqkv.gpu, scratch.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, B, T, H, D);
  EXPECT_TRUE(close(dqkv.gpu.host(), dqkv.cpu.host(), 1e-4, 2e-5)) << "dqkv";

  Buf ref_out(*gpu, nout), ref_lse(*gpu, nl), probs(*gpu, np), dscores(*gpu, np), ref_dqkv(*gpu, nqkv);
  cudaStream_t s = cuda::compute_stream();
  cuda::reference_attention_forward(ref_out, ref_lse, probs, qkv.gpu, B, T, H, D, s);
  cuda::reference_attention_backward(ref_dqkv, dscores, dout.gpu, qkv.gpu, probs, B, T, H, D, s);
  EXPECT_TRUE(close(out.gpu.host(), ref_out.host(), 1e-5, 1e-5)) << "out vs reference";
  EXPECT_TRUE(close(lse.gpu.host(), ref_lse.host(), 1e-5, 1e-5)) << "lse vs reference";
  EXPECT_TRUE(close(dqkv.gpu.host(), ref_dqkv.host(), 1e-4, 2e-5)) << "dqkv vs reference";
  EXPECT_TRUE(close(ref_dqkv.host(), dqkv.cpu.host(), 1e-4, 2e-5)) << "reference dqkv vs cpu";
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttention,
                         ::testing::Values(AttnCase{2, 37, 3, 5}, AttnCase{1, 1, 1, 7}, AttnCase{3, 70, 2, 16},
                                           AttnCase{2, 129, 4, 64}, AttnCase{1, 100, 2, 128},
                                           AttnCase{1, 300, 1, 33}));

// bf16 runs: q, k, v and dout are bf16 values; the kernels compute in fp32 as the CPU does.
TEST(GpuAttention16, Bf16ValuesMatchCpu) {
  const int64_t B = 2, T = 45, H = 3, D = 24;
  const DType t = DType::BF16;
  auto cpu = cpu_ops();
  CudaOptions opt;
  opt.gemm_inputs = t;
  auto gpu = gpu_ops(opt);
  const size_t nqkv = size_t(B * T * 3 * H * D), nout = size_t(B * T * H * D), nl = size_t(B * H * T);
  Pair qkv(*cpu, *gpu, rounded(randn(nqkv, 51), t)), out(*cpu, *gpu, VecF(nout)), lse(*cpu, *gpu, VecF(nl));
  cpu->attention_forward(out.cpu, lse.cpu, qkv.cpu, B, T, H, D);
  gpu->attention_forward(out.gpu, lse.gpu, qkv.gpu, B, T, H, D);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-5, 1e-5));
  cpu->round_to(out.cpu, int64_t(nout), t);  // as the model stores it
  gpu->round_to(out.gpu, int64_t(nout), t);
  Pair dout(*cpu, *gpu, rounded(randn(nout, 52), t)), dqkv(*cpu, *gpu, VecF(nqkv)), scratch(*cpu, *gpu, VecF(nl));
  cpu->attention_backward(dqkv.cpu, scratch.cpu, dout.cpu, qkv.cpu, out.cpu, lse.cpu, B, T, H, D);
  gpu->attention_backward(dqkv.gpu, scratch.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, B, T, H, D);
  // the GPU's softmax-backward term sum(dout * out) reads the bf16-rounded out; the CPU's sum(p * dp) does not
  EXPECT_TRUE(close(dqkv.gpu.host(), dqkv.cpu.host(), 2e-2, 2e-2));
}

// The tensor-core kernels on 16-bit values: against the CPU backend (which keeps the probabilities
// and their gradient in fp32: bf16 / fp16 rounding apart) and the fp32 flash kernels on the GPU.
struct TcCase {
  int64_t B, T, H, D;
  DType t;
};
class GpuTcAttention : public ::testing::TestWithParam<TcCase> {};

TEST_P(GpuTcAttention, MatchCpuAndFp32Kernels) {
  const auto [B, T, H, D, t] = GetParam();
  if (!cuda::tc_attention_supported(D, t)) GTEST_SKIP() << "head dimension " << D << ": too little shared memory here";
  auto cpu = cpu_ops();
  CudaOptions opt;
  opt.gemm_inputs = t;
  auto gpu = gpu_ops(opt);  // attention_forward / backward take the tensor-core path
  const size_t nqkv = size_t(B * T * 3 * H * D), nout = size_t(B * T * H * D), nl = size_t(B * H * T);
  Pair qkv(*cpu, *gpu, rounded(randn(nqkv, 71), t)), out(*cpu, *gpu, VecF(nout)), lse(*cpu, *gpu, VecF(nl));
  cpu->attention_forward(out.cpu, lse.cpu, qkv.cpu, B, T, H, D);
  gpu->attention_forward(out.gpu, lse.gpu, qkv.gpu, B, T, H, D);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-2, 1e-2)) << "out";  // probabilities rounded for P @ V
  EXPECT_TRUE(close(lse.gpu.host(), lse.cpu.host(), 1e-5, 1e-5)) << "lse";  // scores and sums in fp32
  cpu->round_to(out.cpu, int64_t(nout), t);  // as the model stores it; both backwards get the CPU's out
  gpu->to_device(out.gpu, out.cpu.host().data(), nout);
  gpu->to_device(lse.gpu, lse.cpu.host().data(), nl);
  Pair dout(*cpu, *gpu, rounded(randn(nout, 72), t)), dqkv(*cpu, *gpu, VecF(nqkv)), scratch(*cpu, *gpu, VecF(nl));
  cpu->attention_backward(dqkv.cpu, scratch.cpu, dout.cpu, qkv.cpu, out.cpu, lse.cpu, B, T, H, D);
  gpu->attention_backward(dqkv.gpu, scratch.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, B, T, H, D);
  EXPECT_TRUE(close(dqkv.gpu.host(), dqkv.cpu.host(), 2e-2, 2e-2)) << "dqkv";  // dscores rounded
  // the fp32 kernels on the same inputs: the same up to the 16-bit rounding of P and dS
  Buf out32(*gpu, nout), lse32(*gpu, nl), dqkv32(*gpu, nqkv), delta32(*gpu, nl);
  cudaStream_t s = cuda::compute_stream();
  cuda::flash_attention_forward(out32, lse32, qkv.gpu, B, T, H, D, s);
  cuda::flash_attention_backward(dqkv32, delta32, dout.gpu, qkv.gpu, out.gpu, lse.gpu, B, T, H, D, s);
  EXPECT_TRUE(close(lse.cpu.host(), lse32.host(), 1e-5, 1e-5)) << "fp32 kernel lse";
  EXPECT_TRUE(close(dqkv.gpu.host(), dqkv32.host(), 2e-2, 2e-2)) << "dqkv vs fp32 kernels";
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuTcAttention,
                         ::testing::Values(TcCase{2, 100, 3, 64, DType::BF16}, TcCase{1, 129, 2, 128, DType::BF16},
                                           TcCase{3, 64, 2, 32, DType::BF16}, TcCase{1, 1, 1, 64, DType::BF16},
                                           TcCase{2, 200, 1, 32, DType::F16}, TcCase{1, 300, 2, 64, DType::F16},
                                           TcCase{1, 65, 1, 128, DType::F16}));

TEST(GpuElementwise, MatchCpu) {
  const int64_t n = 100003;
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  VecF x = randn(size_t(n), 61, 3.0f);
  x[0] = 0.0f, x[1] = -12.0f, x[2] = 12.0f, x[3] = 100.0f, x[4] = -100.0f;
  Pair a(*cpu, *gpu, x), b(*cpu, *gpu, randn(size_t(n), 62)), out(*cpu, *gpu, VecF(size_t(n)));
  cpu->gelu_forward(out.cpu, a.cpu, n);
  gpu->gelu_forward(out.gpu, a.gpu, n);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-6, 1e-7)) << "gelu";
  cpu->gelu_backward(out.cpu, b.cpu, a.cpu, n);
  gpu->gelu_backward(out.gpu, b.gpu, a.gpu, n);
  EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), 1e-6, 1e-7)) << "gelu backward";
  cpu->add(out.cpu, a.cpu, b.cpu, n);
  gpu->add(out.gpu, a.gpu, b.gpu, n);
  EXPECT_TRUE(bitwise(out.gpu.host(), out.cpu.host())) << "add";
  cpu->accumulate(out.cpu, a.cpu, n);
  gpu->accumulate(out.gpu, a.gpu, n);
  EXPECT_TRUE(bitwise(out.gpu.host(), out.cpu.host())) << "accumulate";
  cpu->scale(out.cpu, 0.37f, n);
  gpu->scale(out.gpu, 0.37f, n);
  EXPECT_TRUE(bitwise(out.gpu.host(), out.cpu.host())) << "scale";
}

TEST(GpuEmbedding, VocabParallelForwardBackward) {
  const int64_t N = 67, C = 45, v0 = 40, rows = 37;  // this shard: ids [40, 77)
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  std::mt19937 gen(71);
  std::uniform_int_distribution<int32_t> tok(0, 100);
  std::vector<int32_t> tokens(static_cast<size_t>(N));
  for (auto& t : tokens) t = tok(gen);
  tokens[3] = tokens[9] = tokens[30] = tokens[66] = 41;  // repeats inside the shard
  tokens[4] = 40, tokens[5] = 76, tokens[6] = 77, tokens[7] = 39;  // both edges
  Pair tk(*cpu, *gpu, tokens), wte(*cpu, *gpu, randn(size_t(rows * C), 72)), out(*cpu, *gpu, randn(size_t(N * C), 73));
  cpu->embedding_forward(out.cpu, tk.cpu.ints(), wte.cpu, N, C, v0, rows);
  gpu->embedding_forward(out.gpu, tk.gpu.ints(), wte.gpu, N, C, v0, rows);
  EXPECT_TRUE(bitwise(out.gpu.host(), out.cpu.host()));
  Pair dout(*cpu, *gpu, randn(size_t(N * C), 74)), dwte(*cpu, *gpu, randn(size_t(rows * C), 75));
  cpu->embedding_backward(dwte.cpu, tk.cpu.ints(), dout.cpu, N, C, v0, rows);
  gpu->embedding_backward(dwte.gpu, tk.gpu.ints(), dout.gpu, N, C, v0, rows);
  EXPECT_TRUE(bitwise(dwte.gpu.host(), dwte.cpu.host())) << "sums in position order, as on the CPU";
}

TEST(GpuEmbedding, PositionForwardBackward) {
  const int64_t B = 3, T = 19, C = 23;
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  Pair wpe(*cpu, *gpu, randn(size_t(T * C), 81)), out(*cpu, *gpu, randn(size_t(B * T * C), 82));
  cpu->add_position_embedding(out.cpu, wpe.cpu, B, T, C);
  gpu->add_position_embedding(out.gpu, wpe.gpu, B, T, C);
  EXPECT_TRUE(bitwise(out.gpu.host(), out.cpu.host()));
  cpu->position_embedding_backward(wpe.cpu, out.cpu, B, T, C);
  gpu->position_embedding_backward(wpe.gpu, out.gpu, B, T, C);
  EXPECT_TRUE(bitwise(wpe.gpu.host(), wpe.cpu.host()));
}

// The three vocab-parallel cross-entropy steps on one shard: columns [v0, v0 + Vl) of a padded
// vocabulary whose valid ids end inside (or before) the shard.
void check_xent(int64_t Vl, int64_t v0, int64_t valid_vocab) {
  const int64_t N = 29;
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  std::mt19937 gen(91);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(valid_vocab) - 1);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (auto& t : targets) t = tok(gen);
  targets[0] = int32_t(v0), targets[1] = int32_t(valid_vocab - 1);
  Pair tg(*cpu, *gpu, targets), logits(*cpu, *gpu, randn(size_t(N * Vl), 92, 4.0f)),
      stats(*cpu, *gpu, VecF(size_t(4 * N)));
  auto run = [&](Ops& ops, Buf& l, Buf& st, Buf& t, bool want_grad) {
    float *row_max = st, *target_logit = st.get() + N, *sum_exp = st.get() + 2 * N, *losses = st.get() + 3 * N;
    ops.xent_local_max(row_max, target_logit, l, t.ints(), N, Vl, v0, valid_vocab);
    ops.xent_local_sumexp(sum_exp, l, row_max, N, Vl, v0, valid_vocab);
    ops.xent_backward_inplace(l, losses, row_max, sum_exp, target_logit, t.ints(), N, Vl, v0, valid_vocab, 0.125f,
                              want_grad);
  };
  for (bool want_grad : {false, true}) {
    SCOPED_TRACE(want_grad ? "with gradient" : "loss only");
    const VecF l = randn(size_t(N * Vl), want_grad ? 92 : 93, 4.0f);
    cpu->to_device(logits.cpu, l.data(), l.size());
    gpu->to_device(logits.gpu, l.data(), l.size());
    run(*cpu, logits.cpu, stats.cpu, tg.cpu, want_grad);
    run(*gpu, logits.gpu, stats.gpu, tg.gpu, want_grad);
    EXPECT_TRUE(close(stats.gpu.host(), stats.cpu.host(), 1e-5, 1e-6)) << "max, target logit, sum exp, loss";
    EXPECT_TRUE(close(logits.gpu.host(), logits.cpu.host(), 1e-5, 1e-7)) << (want_grad ? "dlogits" : "exps");
  }
}

TEST(GpuCrossEntropy, FirstShardNoPadding) { check_xent(53, 0, 200); }
TEST(GpuCrossEntropy, ShardWithPadding) { check_xent(53, 159, 200); }
TEST(GpuCrossEntropy, AllPaddingShard) { check_xent(53, 212, 200); }
TEST(GpuCrossEntropy, WideRow) { check_xent(50304, 0, 50257); }

TEST(GpuPrecision, CastsAreBitwiseTheSharedConversions) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  const float inf = std::numeric_limits<float>::infinity();
  VecF x = randn(10007, 101, 100.0f);
  const float specials[] = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 65504.0f, 65520.0f,
                            1e-8f, -3e-7f, 5.9604645e-8f, 2.9802322e-8f, 3.4e38f, 1.17e-38f, 1.0f + 1.0f / 256.0f};
  for (size_t i = 0; i < std::size(specials); ++i) x[i] = specials[i];
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(t == DType::BF16 ? "bf16" : "fp16");
    const int64_t n = int64_t(x.size());
    Pair a(*cpu, *gpu, x), packed(*cpu, *gpu, VecF(x.size() / 2 + 1)), back(*cpu, *gpu, VecF(x.size()));
    cpu->round_to(a.cpu, n, t);
    gpu->round_to(a.gpu, n, t);
    EXPECT_TRUE(bitwise(a.gpu.host(), a.cpu.host())) << "round_to";
    Pair b(*cpu, *gpu, x);
    cpu->pack_half(packed.cpu.halves(), b.cpu, n, t);
    gpu->pack_half(packed.gpu.halves(), b.gpu, n, t);
    EXPECT_TRUE(bitwise(packed.gpu.host(), packed.cpu.host())) << "pack_half";
    cpu->unpack_half(back.cpu, packed.cpu.halves(), n, t);
    gpu->unpack_half(back.gpu, packed.gpu.halves(), n, t);
    EXPECT_TRUE(bitwise(back.gpu.host(), back.cpu.host())) << "unpack_half";
  }
}

TEST(GpuReductions, SumSquaresAndNonfinite) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  for (int64_t n : {int64_t(1), int64_t(1000003), int64_t(7)}) {
    VecF x = randn(size_t(n), 111);
    Pair a(*cpu, *gpu, x);
    const double c = cpu->sum_squares(a.cpu, n), g = gpu->sum_squares(a.gpu, n);
    EXPECT_NEAR(g, c, 1e-12 * c + 1e-30) << "n = " << n;
    EXPECT_FALSE(gpu->has_nonfinite(a.gpu, n));
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      VecF y = x;
      y[size_t(n - 1)] = bad;
      Buf b(*gpu, y);
      EXPECT_TRUE(gpu->has_nonfinite(b, n));
      EXPECT_FALSE(gpu->has_nonfinite(b, n - 1));
    }
  }
  EXPECT_EQ(gpu->sum_squares(nullptr, 0), 0.0);
}

TEST(GpuOptimizer, AdamWMatchesCpu) {
  const int64_t n = 1001;
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  AdamWParams a{};
  a.lr = 3e-3f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f;
  a.one_minus_beta1 = float(1.0 - 0.9), a.one_minus_beta2 = float(1.0 - 0.95);
  Pair p(*cpu, *gpu, randn(size_t(n), 121)), g(*cpu, *gpu, randn(size_t(n), 122)), m(*cpu, *gpu, randn(size_t(n), 123, 0.1f)),
      v(*cpu, *gpu, VecF(size_t(n), 0.01f)), c(*cpu, *gpu, VecF(size_t(n)));
  for (int step = 1; step <= 3; ++step) {
    a.bias_correction1 = float(1.0 - std::pow(0.9, step));
    a.bias_correction2 = float(1.0 - std::pow(0.95, step));
    cpu->adamw(p.cpu, g.cpu, m.cpu, v.cpu, n, a, step != 2, c.cpu, DType::F16);
    gpu->adamw(p.gpu, g.gpu, m.gpu, v.gpu, n, a, step != 2, c.gpu, DType::F16);
  }
  EXPECT_TRUE(close(c.gpu.host(), c.cpu.host(), 1e-3, 1e-7));  // fp16 copies of p (equal unless p straddles a rounding edge)
  EXPECT_TRUE(close(p.gpu.host(), p.cpu.host(), 1e-6, 1e-7));
  EXPECT_TRUE(close(m.gpu.host(), m.cpu.host(), 1e-6, 1e-7));
  EXPECT_TRUE(close(v.gpu.host(), v.cpu.host(), 1e-6, 1e-9));
}

TEST(GpuMemory, AllocZeroCopyTransfersAndAccounting) {
  auto gpu = gpu_ops();
  const int64_t before = gpu->allocated_bytes();
  const size_t n = 1237;
  float* a = gpu->alloc(n);
  float* b = gpu->alloc(n);
  EXPECT_GE(gpu->allocated_bytes() - before, int64_t(2 * n * sizeof(float)));
  VecF h(n, 1.0f);
  gpu->to_host(h.data(), a, n);
  EXPECT_TRUE(std::all_of(h.begin(), h.end(), [](float v) { return v == 0.0f; })) << "alloc zeroes";
  VecF x = randn(n, 131);
  gpu->to_device(a, x.data(), n);
  gpu->copy(b, a, n);
  gpu->to_host(h.data(), b, n);
  EXPECT_EQ(h, x);
  gpu->zero(b + 10, n - 20);
  gpu->to_host(h.data(), b, n);
  EXPECT_EQ(h[9], x[9]);
  EXPECT_EQ(h[10], 0.0f);
  EXPECT_EQ(h[n - 11], 0.0f);
  EXPECT_EQ(h[n - 10], x[n - 10]);
  gpu->free(a);
  gpu->free(b);
  EXPECT_EQ(gpu->allocated_bytes(), before);
  EXPECT_GE(gpu->peak_allocated_bytes(), int64_t(2 * n * sizeof(float)));
  EXPECT_NE(gpu->name().find("cuda"), std::string::npos);
}

}  // namespace
}  // namespace tpt::gpu_test
