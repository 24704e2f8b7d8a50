// MpiComm's typed collectives and all_to_all_v (parallel/comm.h) on 2 or 4 MPI ranks: every element
// type moved byte for byte (tests/common/comm_elements.h) into the layout its counts imply, with
// MPI_Alltoallv and with the point-to-point path of counts beyond one MPI call (a communicator
// whose max_count is lowered to 3 elements); the counts exchange; exact integer and double
// reductions, also in chunks; 16-bit values gathered, broadcast and sent bit for bit, and refused
// by the reductions but bf16 sums (the user op, each addition rounded).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/mpi_comm.h"
#include "parallel/runtime.h"
#include "tests/common/comm_elements.h"

namespace tpt {
namespace {

using test::element_ids;
using test::id_elements;

// The world as a communicator whose operations go in pieces of at most max_count elements.
std::unique_ptr<Comm> world_comm(int64_t max_count) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return make_mpi_comm(c, max_count);
}

// The all-to-all of tests/common/comm_elements.h, its counts exchanged first; ids offset by `base`.
void check_all_to_all(Comm& c, DType t, int base = 0) {
  const test::AllToAllCase a = test::all_to_all_case(c.rank(), c.size(), base);
  std::vector<int64_t> rc(a.recv_counts.size(), -1);
  c.all_to_all_counts(a.send_counts.data(), rc.data());
  EXPECT_EQ(rc, a.recv_counts) << "the counts exchange";
  const std::vector<char> send = id_elements(a.send_ids, t);
  std::vector<char> recv(a.recv_ids.size() * size_t(dtype_bytes(t)), char(0x7f));
  c.all_to_all_v(send.data(), a.send_counts, recv.data(), a.recv_counts, t);
  EXPECT_EQ(element_ids(recv, t), a.recv_ids);
}

TEST(MpiTypedComm, AllToAllVOfEveryTypeInBothPaths) {
  ASSERT_GE(runtime_world_size(), 2) << "run under mpirun -np 2 or 4";
  Grid g = make_grid(runtime_world_size(), 1, 1);
  auto pieces = world_comm(3);  // every block of more than 3 elements, and every total, beyond one call
  for (const DType t : test::kCommTypes) {
    SCOPED_TRACE(test::comm_type_name(t));
    {
      SCOPED_TRACE("MPI_Alltoallv");
      check_all_to_all(*g.world, t);
    }
    {
      SCOPED_TRACE("point-to-point pieces of 3 elements");
      check_all_to_all(*pieces, t);
    }
  }
}

// The TP groups of a TP 2 grid: with 4 ranks two all-to-alls at once, each over its own members
// (their ids offset by 128 per group, so a block from the other group would show).
TEST(MpiTypedComm, AllToAllVOverTheGridsGroups) {
  const int world = runtime_world_size();
  Grid g = make_grid(2, 1, world / 2);
  check_all_to_all(*g.tp_group, DType::I32, 128 * g.dp_rank);
}

TEST(MpiTypedComm, IntegerAndDoubleReductionsAreExactAlsoInChunks) {
  const int n = runtime_world_size();
  const int r = runtime_world_rank();
  Grid g = make_grid(n, 1, 1);
  auto pieces = world_comm(2);
  const int64_t big = int64_t(1) << 60;
  for (Comm* c : {g.world.get(), pieces.get()}) {
    std::vector<int64_t> s64 = {big + r, -big + 3 * r, 5, int64_t(r) << 40, 7}, m64 = s64;
    c->all_reduce(s64.data(), 5, DType::I64, ReduceOp::Sum);
    c->all_reduce(m64.data(), 5, DType::I64, ReduceOp::Max);
    const int64_t ranks = int64_t(n) * (n - 1) / 2;
    EXPECT_EQ(s64, (std::vector<int64_t>{n * big + ranks, -n * big + 3 * ranks, 5 * n, ranks << 40, 7 * n}));
    EXPECT_EQ(m64, (std::vector<int64_t>{big + n - 1, -big + 3 * (n - 1), 5, int64_t(n - 1) << 40, 7}));
    std::vector<int32_t> s32 = {(1 << 28) + r, -r, 1};
    c->all_reduce(s32.data(), 3, DType::I32, ReduceOp::Sum);
    EXPECT_EQ(s32, (std::vector<int32_t>{n * (1 << 28) + int32_t(ranks), -int32_t(ranks), n}));
    std::vector<double> d = {1099511627776.0 + r, 0.5, -1.0 * r};
    c->all_reduce(d.data(), 3, DType::F64, ReduceOp::Max);
    EXPECT_EQ(d, (std::vector<double>{1099511627776.0 + n - 1, 0.5, 0.0}));
    // a started all-reduce of int32 (in pieces on the second) and a reduce-scatter of int64
    std::vector<int32_t> x = {1, 2, 3, 4, 5, r};
    c->wait(c->start_all_reduce(x.data(), 6, DType::I32));
    EXPECT_EQ(x, (std::vector<int32_t>{n, 2 * n, 3 * n, 4 * n, 5 * n, int32_t(ranks)}));
    std::vector<int64_t> in(size_t(2 * n)), out(2);
    for (int64_t i = 0; i < 2 * n; ++i) in[size_t(i)] = big + i * 10 + r;
    c->reduce_scatter(out.data(), in.data(), 2, DType::I64);
    for (int64_t i = 0; i < 2; ++i) EXPECT_EQ(out[size_t(i)], n * (big + (2 * r + i) * 10) + ranks) << i;
    // fp32 broadcast in pieces
    std::vector<float> b(7);
    for (int i = 0; i < 7; ++i) b[size_t(i)] = float(100 * r + i);
    c->broadcast(b.data(), 7, n - 1);
    for (int i = 0; i < 7; ++i) EXPECT_EQ(b[size_t(i)], float(100 * (n - 1) + i));
  }
}

TEST(MpiTypedComm, SixteenBitValuesMoveBitForBitAndAreNotReduced) {
  const int n = runtime_world_size();
  const int r = runtime_world_rank();
  Grid g = make_grid(n, 1, 1);
  Comm& c = *g.world;
  // a NaN payload, a negative zero and a subnormal: bits no arithmetic would keep
  const std::vector<uint16_t> mine = {uint16_t(0x7fc1 + r), 0x8000, uint16_t(0x0001 + r)};
  std::vector<uint16_t> all(size_t(3 * n));
  c.all_gather(all.data(), mine.data(), 3, DType::BF16);
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(all[size_t(3 * q)], uint16_t(0x7fc1 + q));
    EXPECT_EQ(all[size_t(3 * q + 1)], 0x8000);
    EXPECT_EQ(all[size_t(3 * q + 2)], uint16_t(0x0001 + q));
  }
  std::vector<uint16_t> b = mine;
  c.broadcast(b.data(), 3, DType::F16, n - 1);
  EXPECT_EQ(b[0], uint16_t(0x7fc1 + n - 1));
  // a ring of bf16 messages
  std::vector<uint16_t> in(3, 0);
  c.exchange({{true, const_cast<uint16_t*>(mine.data()), 3, (r + 1) % n, 0, DType::BF16},
              {false, in.data(), 3, (r + n - 1) % n, 0, DType::BF16}});
  EXPECT_EQ(in[2], uint16_t(0x0001 + (r + n - 1) % n));
  EXPECT_THROW(c.all_reduce(b.data(), 3, DType::F16, ReduceOp::Sum), InternalError);
  EXPECT_THROW(c.all_reduce(b.data(), 3, DType::BF16, ReduceOp::Max), InternalError);
  EXPECT_THROW(c.reduce_scatter(b.data(), all.data(), 3, DType::F16), InternalError);
}

// bf16 sums (the bf16 gradient buffer; parallel/comm.h): MPI's user op adds in fp32 and rounds each
// addition -- small integers exact in any order, blocking, started, in chunks and reduce-scattered;
// 1 + 2^-8 (a tie) rounds to even, 1.
TEST(MpiTypedComm, Bf16SumsThroughTheUserOp) {
  const int n = runtime_world_size();
  const int r = runtime_world_rank();
  auto c = world_comm(3);
  std::vector<uint16_t> x(7, fp32_to_bf16(float(r + 1)));
  c->all_reduce(x.data(), 7, DType::BF16, ReduceOp::Sum);
  for (uint16_t v : x) EXPECT_EQ(bf16_to_fp32(v), float(n * (n + 1) / 2));
  std::vector<uint16_t> in(size_t(2 * n)), out(2);
  for (int i = 0; i < 2 * n; ++i) in[size_t(i)] = fp32_to_bf16(float(i + r));
  c->wait(c->start_reduce_scatter(out.data(), in.data(), 2, DType::BF16));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(bf16_to_fp32(out[size_t(i)]), float(n * (2 * r + i) + n * (n - 1) / 2));
  uint16_t tie = fp32_to_bf16(r == 0 ? 1.0f : r == 1 ? 1.0f / 256 : 0.0f);
  c->wait(c->start_all_reduce(&tie, 1, DType::BF16));
  EXPECT_EQ(bf16_to_fp32(tie), 1.0f);
}

}  // namespace
}  // namespace tpt
