// NcclComm on two or more GPUs (ctest gpu_nccl_np2: mpirun -np 2, a GPU per rank; skipped on one
// rank): every collective against its definition, all_to_all_v of every element type, the
// pipeline's send/recv pairs, and the tiny GPT trained tensor-parallel over NCCL against the same
// GPT on one CPU rank.
#include <cmath>

#include "parallel/nccl_comm.h"
#include "parallel/runtime.h"
#include "tests/common/comm_elements.h"
#include "tiny_model.h"

namespace tpt::gpu_test {
namespace {

// The world as a host group (MPI) and as a device group (NCCL): a grid of TP = world, its GPU and
// device groups chosen by the trainer's code (the local rank on its host, parallel/grid.h).
struct World {
  Grid grid;
  Comm* dev = nullptr;
  World() : grid(make_grid(runtime_world_size(), 1, 1)) {
    if (!use_cuda_devices(Device::Cuda, grid)) internal_error("no GPU per rank");
    setup_cuda_devices(grid);
    dev = grid.tp_device.get();
  }
};

class GpuNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (runtime_world_size() < 2) GTEST_SKIP() << "needs two or more ranks (mpirun)";
    if (!nccl_built()) GTEST_SKIP() << "built without NCCL";
    // made on first use, collectively (every rank runs the same tests in order); never destroyed:
    // its MPI communicators would be freed after MPI_Finalize
    static World* w = new World;
    world = w;
  }
  World* world = nullptr;
};

TEST_F(GpuNccl, CollectivesOnDeviceBuffers) {
  Comm& c = *world->dev;
  const int r = c.rank(), n = c.size();
  auto gpu = make_cuda_ops(world->grid.cuda_device);
  const int64_t k = 1001;
  VecF mine(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) mine[size_t(i)] = float(r + 1) * float(i % 17) - float(r);
  {
    Dev b(*gpu, mine);
    c.all_reduce(b, k, ReduceOp::Sum);
    const VecF h = b.host();
    for (int64_t i = 0; i < k; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += float(q + 1) * float(i % 17) - float(q);
      ASSERT_EQ(h[size_t(i)], want) << "sum, element " << i;
    }
  }
  {
    Dev b(*gpu, mine);
    c.all_reduce(b, k, ReduceOp::Max);
    const VecF h = b.host();
    for (int64_t i = 0; i < k; ++i) {
      float want = -INFINITY;
      for (int q = 0; q < n; ++q) want = std::max(want, float(q + 1) * float(i % 17) - float(q));
      ASSERT_EQ(h[size_t(i)], want) << "max, element " << i;
    }
  }
  {
    Dev in(*gpu, mine), out(*gpu, size_t(k * n));
    c.all_gather(out, in, k);
    const VecF h = out.host();
    for (int q = 0; q < n; ++q) ASSERT_EQ(h[size_t(q * k + 5)], float(q + 1) * 5.0f - float(q)) << "gather " << q;
  }
  {
    VecF all(size_t(k * n));
    for (size_t i = 0; i < all.size(); ++i) all[i] = float(r) + float(i % 5);
    Dev in(*gpu, all), out(*gpu, size_t(k));
    c.reduce_scatter(out, in, k);
    const VecF h = out.host();
    for (int64_t i = 0; i < k; ++i)
      ASSERT_EQ(h[size_t(i)], float(n * (n - 1) / 2) + float(n) * float((r * k + i) % 5)) << "reduce_scatter " << i;
  }
  {
    Dev b(*gpu, mine);
    c.broadcast(b, k, n - 1);
    const VecF h = b.host();
    ASSERT_EQ(h[3], float(n) * 3.0f - float(n - 1)) << "broadcast from the last rank";
  }
  {
    std::vector<double> d = {double(r), 1.0};
    Dev b(*gpu, size_t(4));
    gpu->to_device(b, d.data(), 4);
    c.all_reduce(reinterpret_cast<double*>(b.f32()), 2, ReduceOp::Sum);
    gpu->to_host(d.data(), b, 4);
    EXPECT_EQ(d[0], double(n * (n - 1) / 2));
    EXPECT_EQ(d[1], double(n));
  }
  c.barrier();
}

// start_all_reduce runs on the communication stream after the compute stream's earlier work (the
// scale below), and wait_all orders the compute stream's later work (the accumulate) after it.
TEST_F(GpuNccl, StartedAllReducesOverlapAndFinishInOrder) {
  Comm& c = *world->dev;
  const int r = c.rank(), n = c.size();
  auto gpu = make_cuda_ops(world->grid.cuda_device);
  const int64_t k = 1 << 22;  // 16 MiB: long enough for the streams to overlap
  Dev a(*gpu, VecF(size_t(k), float(r + 1))), b(*gpu, VecF(size_t(k), 1.0f)), one(*gpu, VecF(size_t(k), 1.0f));
  for (int it = 0; it < 3; ++it) {
    gpu->scale(a, 2.0f, k);  // queued before the start: the sum must see it
    c.start_all_reduce(a, k);
    c.start_all_reduce(b, k);
    gpu->accumulate(one, one, k);  // unrelated compute meanwhile
    c.wait_all();
    gpu->accumulate(b, one, k);  // after finish: sees the summed b
  }
  // a: ((r+1)*2 summed) -> per iteration a = 2 * sum(a_q); b = n * b + one(2^it)
  double want_a = 0;
  for (int q = 0; q < n; ++q) want_a += double(q + 1);
  double want_b = 1.0, ones = 1.0;
  for (int it = 0; it < 3; ++it) {
    if (it > 0) want_a *= 2.0 * n;
    if (it == 0) want_a *= 2.0;
    ones *= 2.0;
    want_b = want_b * n + ones;
  }
  const VecF ha = a.host(), hb = b.host();
  EXPECT_EQ(double(ha[0]), want_a);
  EXPECT_EQ(double(ha[size_t(k - 1)]), want_a);
  EXPECT_EQ(double(hb[size_t(k / 2)]), want_b);
  c.barrier();
}

// The distributed optimizer's collectives: reduce-scatter of a bucket in place on the
// communication stream after the compute stream's earlier work, the in-place all-gather of the
// parameters, each waited for by ticket; the compute stream's later work sees the results.
TEST_F(GpuNccl, StartedReduceScatterAndAllGatherInPlaceByTicket) {
  Comm& c = *world->dev;
  const int r = c.rank(), n = c.size();
  auto gpu = make_cuda_ops(world->grid.cuda_device);
  const int64_t k = 1 << 20;  // per rank's block
  Dev grads(*gpu, VecF(size_t(k * n), float(r + 1))), params(*gpu, VecF(size_t(k * n), -1.0f)),
      mine(*gpu, VecF(size_t(k), float(10 * r))), one(*gpu, VecF(size_t(k), 1.0f));
  gpu->scale(grads, 2.0f, k * n);  // queued before the start: the reduce-scatter must see it
  const int64_t t0 = c.start_reduce_scatter(static_cast<float*>(grads) + r * k, grads, k);
  gpu->copy(static_cast<float*>(params) + r * k, mine, k);  // this rank's updated block
  const int64_t t1 = c.start_all_gather(params, static_cast<float*>(params) + r * k, k);
  gpu->accumulate(one, one, k);  // unrelated compute meanwhile
  c.wait(t0);
  gpu->accumulate(static_cast<float*>(grads) + r * k, one, k);  // after the wait: sees the sum
  c.wait(t1);
  const VecF hg = grads.host(), hp = params.host();
  double want = 0;
  for (int q = 0; q < n; ++q) want += 2.0 * (q + 1);
  EXPECT_EQ(double(hg[size_t(r * k)]), want + 2.0);
  EXPECT_EQ(double(hg[size_t(r * k + k - 1)]), want + 2.0);
  for (int q = 0; q < n; ++q) EXPECT_EQ(hp[size_t(q * k + k / 2)], float(10 * q)) << q;
  c.barrier();
}

TEST_F(GpuNccl, SendRecvPairsAroundARing) {
  Comm& c = *world->dev;
  const int r = c.rank(), n = c.size();
  auto gpu = make_cuda_ops(world->grid.cuda_device);
  const int64_t k = 4097;
  Dev send(*gpu, VecF(size_t(k), float(r))), recv(*gpu, size_t(k));
  c.send_recv(send, k, (r + 1) % n, recv, k, (r + n - 1) % n);
  EXPECT_EQ(recv.host()[size_t(k - 1)], float((r + n - 1) % n));
  // receive only / send only, as the pipeline's first and last stages do
  if (r == 0) c.send_recv(send, k, 1, nullptr, 0, -1);
  if (r == 1) {
    c.send_recv(nullptr, 0, -1, recv, k, 0);
    EXPECT_EQ(recv.host()[0], 0.0f);
  }
}

// all_to_all_v as one NCCL group of sends and receives on the compute stream (the own block a
// device copy), for every element type, with the uneven and zero counts of
// tests/common/comm_elements.h exchanged first on device buffers.
TEST_F(GpuNccl, AllToAllVOfEveryTypeAfterTheCountsExchange) {
  Comm& c = *world->dev;
  auto gpu = make_cuda_ops(world->grid.cuda_device);
  const test::AllToAllCase a = test::all_to_all_case(c.rank(), c.size());
  const int64_t n = c.size();
  Dev send_counts(*gpu, size_t(n), DType::I64), recv_counts(*gpu, size_t(n), DType::I64);
  gpu->to_device(send_counts, a.send_counts.data(), n);
  c.all_to_all_counts(static_cast<const int64_t*>(send_counts.buf().p), static_cast<int64_t*>(recv_counts.buf().p));
  std::vector<int64_t> got(size_t(n), -1);
  gpu->to_host(got.data(), recv_counts, n);
  EXPECT_EQ(got, a.recv_counts) << "the counts exchange";
  for (const DType t : test::kCommTypes) {
    SCOPED_TRACE(test::comm_type_name(t));
    const std::vector<char> host_send = test::id_elements(a.send_ids, t);
    Dev send(*gpu, std::max<size_t>(a.send_ids.size(), 1), t), recv(*gpu, std::max<size_t>(a.recv_ids.size(), 1), t);
    gpu->to_device(send, host_send.data(), int64_t(a.send_ids.size()));
    c.all_to_all_v(send.buf().p, a.send_counts, recv.buf().p, a.recv_counts, t);
    std::vector<char> host_recv(a.recv_ids.size() * size_t(dtype_bytes(t)));
    gpu->to_host(host_recv.data(), recv, int64_t(a.recv_ids.size()));
    EXPECT_EQ(test::element_ids(host_recv, t), a.recv_ids);
  }
  c.barrier();
}

TEST_F(GpuNccl, TensorParallelTrainingMatchesOneCpuRank) {
  Comm& c = *world->dev;
  auto cpu = make_cpu_ops(2);
  auto gpu = make_cuda_ops(world->grid.cuda_device);
  if (tiny_config().model.num_attention_heads % c.size() != 0) GTEST_SKIP() << "heads not divisible by the ranks";
  const auto self = make_self_comm();
  const Trained one = train(*cpu, *self, DType::F32, 3, 2);
  const Trained tp = train(*gpu, c, DType::F32, 3, 2);
  for (size_t k = 0; k < one.losses.size(); ++k)
    EXPECT_NEAR(tp.losses[k], one.losses[k], 1e-4 * std::fabs(one.losses[k])) << "step " << k + 1;
}

// bf16 storage: the row-parallel sums travel as 16-bit values (all-gathered, summed in rank order
// by sum_parts), against one CPU rank's bf16 run at the mixed-precision tolerance.
TEST_F(GpuNccl, Bf16TensorParallelTrainingWithinTheMixedPrecisionTolerance) {
  Comm& c = *world->dev;
  auto cpu = make_cpu_ops(2);
  auto gpu = make_cuda_ops(world->grid.cuda_device);
  if (tiny_config().model.num_attention_heads % c.size() != 0) GTEST_SKIP() << "heads not divisible by the ranks";
  const auto self = make_self_comm();
  const Trained one = train(*cpu, *self, DType::BF16, 3, 2);
  const Trained tp = train(*gpu, c, DType::BF16, 3, 2);
  for (size_t k = 0; k < one.losses.size(); ++k) {
    EXPECT_NEAR(tp.losses[k], one.losses[k], 2e-2) << "step " << k + 1;
    if (c.rank() == 0) std::printf("step %zu: loss 1 cpu rank bf16 %.6f, TP %d on GPUs bf16 %.6f\n", k + 1, one.losses[k], c.size(), tp.losses[k]);
  }
}

// Data parallel over NCCL: each rank trains its share of the micro-batches on its GPU, the gradient
// buckets summed on the communication stream while backward runs (GradSync, overlap on), against
// one CPU rank training on all of them.
TEST_F(GpuNccl, DataParallelTrainingWithOverlappedBucketsMatchesOneCpuRank) {
  Comm& c = *world->dev;
  auto cpu = make_cpu_ops(2);
  auto gpu = make_cuda_ops(world->grid.cuda_device);
  const auto self = make_self_comm();
  const auto self_dev = make_device_self_comm();
  const int micro = 2 * c.size();
  const Trained one = train(*cpu, *self, DType::F32, 3, micro);
  const Trained dp = train(*gpu, *self_dev, DType::F32, 3, micro, tiny_config(), {&c, world->grid.world.get()});
  for (size_t k = 0; k < one.losses.size(); ++k) {
    EXPECT_NEAR(dp.losses[k], one.losses[k], 1e-4 * std::fabs(one.losses[k])) << "step " << k + 1;
    if (c.rank() == 0) std::printf("step %zu: loss 1 cpu rank %.7f, DP %d on GPUs %.7f\n", k + 1, one.losses[k], c.size(), dp.losses[k]);
  }
  EXPECT_LT(relative_distance(dp.params, one.params, one.init), 1e-2) << "weights after the last step";
}

// NcclComm over groups of one rank, several in one process (no mpirun, one GPU): every call of the
// communicator runs for real -- the non-blocking creation, each collective, a send to itself in
// one group, the overlapped all-reduce, barrier, and the finalize-and-destroy of a normal end.
TEST(GpuNcclOneRank, EveryCallOfSeveralCommunicators) {
  if (!nccl_built()) GTEST_SKIP() << "built without NCCL";
  auto gpu = make_cuda_ops(0);
  const auto host_a = make_self_comm(), host_b = make_self_comm();
  auto a = make_nccl_comm(*host_a);
  auto b = make_nccl_comm(*host_b);
  const int64_t k = 1000;
  VecF x(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) x[size_t(i)] = float(i % 13) - 6.0f;
  for (Comm* c : {a.get(), b.get()}) {
    ASSERT_EQ(c->size(), 1);
    Dev d(*gpu, x), out(*gpu, size_t(k));
    c->all_reduce(d, k, ReduceOp::Sum);
    c->all_reduce(d, k, ReduceOp::Max);
    c->broadcast(d, k, 0);
    c->all_gather(out, d, k);
    EXPECT_EQ(out.host(), x);
    c->reduce_scatter(out, d, k);
    EXPECT_EQ(out.host(), x);
    Dev recv(*gpu, size_t(k));
    c->send_recv(d, k, 0, recv, k, 0);
    EXPECT_EQ(recv.host(), x);
    c->start_all_reduce(d, k);
    c->wait_all();
    gpu->accumulate(d, d, k);  // after the finished sum
    const VecF h = d.host();
    EXPECT_EQ(h[7], 2.0f * x[7]);
    c->barrier();
  }
  a.reset();  // finalize + destroy while b lives on
  Dev d(*gpu, x);
  b->all_reduce(d, k, ReduceOp::Sum);
  EXPECT_EQ(d.host(), x);
}

}  // namespace
}  // namespace tpt::gpu_test
