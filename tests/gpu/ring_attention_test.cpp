// Context parallelism's ring attention on the GPU (core/cuda/attention/ring_attention.cu) against the CPU
// backend (whose ring is checked against a direct attention in tests/unit/ring_attention_test.cpp):
// every kind of ring block (the diagonal, a lower rank's, a higher rank's) of CP 1..4, forward
// merged into running outputs and backward into dq / dkv, in fp32 and bf16, with G < H; the strided
// row copy; RingAttention itself at CP 1 against the GPU's full causal attention, and at CP 2 and 4
// on CP threads of one GPU (device groups) against the same ring on CPU threads.
#include <limits>

#include "gpu_test_util.h"
#include "parallel/context_parallel.h"
#include "parallel/nccl_comm.h"
#include "parallel/thread_comm.h"

namespace tpt::gpu_test {
namespace {

TEST(GpuRingAttention, BlocksMatchCpu) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  const int64_t B = 2, H = 4, KV = 2;
  for (DType t : {DType::F32, DType::BF16})
    for (int64_t D : {8, 64, 80})
      for (int cp = 1; cp <= 4; ++cp) {
        const int64_t c = 5, T = 2 * c;
        SCOPED_TRACE(std::string(dtype_name(t)) + " D " + std::to_string(D) + " cp " + std::to_string(cp));
        const size_t nq = size_t(B * T * (H + 2 * KV) * D), nkv = size_t(B * T * 2 * KV * D), no = size_t(B * T * H * D),
                     nl = size_t(B * H * T);
        const double tol = t == DType::F32 ? 1e-5 : 1e-2;
        for (int r = 0; r < cp; ++r) {
          Pair qkv(*cpu, *gpu, randn(nq, 51 + r), t), kv(*cpu, *gpu, randn(nkv, 61 + r), t);
          Pair out(*cpu, *gpu, VecF(no, 0.0f)), lse(*cpu, *gpu, VecF(nl, -std::numeric_limits<float>::infinity()));
          // every source rank's block in ring order, the first (own) one written, the rest merged
          for (int s = 0; s < cp; ++s) {
            RingBlock b = cp_local_block(c, cp, r);
            const int src = ((r - s) % cp + cp) % cp;
            b.k_chunks[0] = src, b.k_chunks[1] = 2 * cp - 1 - src;
            b.first = s == 0;
            cpu->attention_block_forward(out.cpu, lse.cpu, qkv.cpu, kv.cpu, B, T, H, KV, D, b);
            gpu->attention_block_forward(out.gpu, lse.gpu, qkv.gpu, kv.gpu, B, T, H, KV, D, b);
          }
          EXPECT_TRUE(close(out.gpu.host(), out.cpu.host(), tol, tol)) << "out, rank " << r;
          EXPECT_TRUE(close(lse.gpu.host(), lse.cpu.host(), tol, tol)) << "lse, rank " << r;
          const VecF out_t = out.cpu.host();  // the output as the compute dtype stores it
          Pair outs(*cpu, *gpu, out_t, t), dout(*cpu, *gpu, randn(no, 71 + r), t);
          Pair dq(*cpu, *gpu, randn(no, 81)), dkv(*cpu, *gpu, randn(nkv, 82));
          for (int s = 0; s < cp; ++s) {
            RingBlock b = cp_local_block(c, cp, r);
            const int src = ((r - s) % cp + cp) % cp;
            b.k_chunks[0] = src, b.k_chunks[1] = 2 * cp - 1 - src;
            cpu->attention_block_backward(dq.cpu, dkv.cpu, dout.cpu, outs.cpu, lse.cpu, qkv.cpu, kv.cpu, B, T, H, KV, D, b);
            gpu->attention_block_backward(dq.gpu, dkv.gpu, dout.gpu, outs.gpu, lse.gpu, qkv.gpu, kv.gpu, B, T, H, KV, D, b);
          }
          EXPECT_TRUE(close(dq.gpu.host(), dq.cpu.host(), 10 * tol, 10 * tol)) << "dq (+=), rank " << r;
          EXPECT_TRUE(close(dkv.gpu.host(), dkv.cpu.host(), 10 * tol, 10 * tol)) << "dkv (+=), rank " << r;
        }
      }
}

TEST(GpuRingAttention, CopyRowsConvertsWithStrides) {
  auto cpu = cpu_ops();
  auto gpu = gpu_ops();
  const int64_t rows = 37, cols = 12, ss = 20, ds = 15;
  Pair src(*cpu, *gpu, randn(size_t(rows * ss), 91)), dst(*cpu, *gpu, randn(size_t(rows * ds), 92), DType::BF16);
  cpu->copy_rows(dst.cpu, ds, src.cpu.buf() + 3, ss, rows, cols);
  gpu->copy_rows(dst.gpu, ds, src.gpu.buf() + 3, ss, rows, cols);
  EXPECT_TRUE(bitwise(dst.gpu.host(), dst.cpu.host()));
}

// One CP rank: the ring is the whole causal attention (flash kernels / cuDNN on the same GPU).
TEST(GpuRingAttention, RingAtCp1IsCausalAttention) {
  auto gpu = gpu_ops();
  auto self = make_device_self_comm();
  const int64_t B = 2, T = 64, H = 4, KV = 2, D = 32;
  Dev qkv(*gpu, randn(size_t(B * T * (H + 2 * KV) * D), 95)), dout(*gpu, randn(size_t(B * T * H * D), 96));
  Dev out(*gpu, size_t(B * T * H * D)), lse(*gpu, size_t(B * H * T)), dqkv(*gpu, size_t(B * T * (H + 2 * KV) * D));
  Dev ref_out(*gpu, size_t(B * T * H * D)), ref_lse(*gpu, size_t(B * H * T)), ref_d(*gpu, size_t(B * T * (H + 2 * KV) * D)),
      scratch(*gpu, size_t(B * H * T));
  RingAttention ring(*gpu, *self, B, T, H, KV, D, DType::F32);
  ring.forward(out, lse, qkv);
  ring.backward(dqkv, dout, qkv, out, lse);
  gpu->attention_forward(ref_out, ref_lse, qkv, B, T, H, KV, D);
  gpu->attention_backward(ref_d, scratch, dout, qkv, ref_out, ref_lse, B, T, H, KV, D);
  EXPECT_TRUE(close(out.host(), ref_out.host(), 1e-5, 1e-5)) << "out";
  EXPECT_TRUE(close(lse.host(), ref_lse.host(), 1e-5, 1e-5)) << "lse";
  EXPECT_TRUE(close(dqkv.host(), ref_d.host(), 1e-4, 2e-5)) << "dqkv";
}

// The ring on cp thread ranks, each with its own backend (cuda: CudaOps on GPU 0 with its own
// stream, the ring over the device group), for its rank's rows of qkv and dout: out, lse, dqkv.
struct RingResult {
  VecF out, lse, dqkv;
};
std::vector<RingResult> thread_ring(bool cuda, int cp, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                    DType t) {
  std::vector<RingResult> res(static_cast<size_t>(cp));
  run_thread_ranks(cp, 1, 1, cuda, [&](Grid& g) {
    if (cuda) cuda_set_device(0);
    const int r = g.tp_rank;
    auto ops = cuda ? gpu_ops() : cpu_ops();
    Dev qkv(*ops, randn(size_t(B * T * (H + 2 * KV) * D), 100 + r), t), dout(*ops, randn(size_t(B * T * H * D), 200 + r), t);
    Dev out(*ops, size_t(B * T * H * D), t), lse(*ops, size_t(B * H * T)), dqkv(*ops, size_t(B * T * (H + 2 * KV) * D), t);
    {
      RingAttention ring(*ops, cuda ? *g.tp_device : *g.tp_group, B, T, H, KV, D, t);
      ring.forward(out, lse, qkv);
      ring.backward(dqkv, dout, qkv, out, lse);
    }
    res[size_t(r)] = {out.host(), lse.host(), dqkv.host()};
  });
  return res;
}

TEST(GpuRingAttention, RingOnGpuThreadsMatchesCpuThreads) {
  for (DType t : {DType::F32, DType::BF16})
    for (int cp : {2, 4}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " cp " + std::to_string(cp));
      const int64_t B = 2, T = 16, H = 4, KV = 2, D = 32;
      const double tol = t == DType::F32 ? 1e-4 : 2e-2;
      const std::vector<RingResult> g = thread_ring(true, cp, B, T, H, KV, D, t), c = thread_ring(false, cp, B, T, H, KV, D, t);
      for (int r = 0; r < cp; ++r) {
        EXPECT_TRUE(close(g[size_t(r)].out, c[size_t(r)].out, tol, tol)) << "out, rank " << r;
        EXPECT_TRUE(close(g[size_t(r)].lse, c[size_t(r)].lse, tol, tol)) << "lse, rank " << r;
        EXPECT_TRUE(close(g[size_t(r)].dqkv, c[size_t(r)].dqkv, 10 * tol, 10 * tol)) << "dqkv, rank " << r;
      }
    }
}

}  // namespace
}  // namespace tpt::gpu_test
