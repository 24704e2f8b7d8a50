// The typed collectives and all_to_all_v of parallel/comm.h on thread ranks (parallel/thread_comm.h)
// and on the group of one rank: every element type moved byte for byte
// (tests/common/comm_elements.h) into a layout written out here by hand (uneven and zero counts, a
// rank that neither sends nor receives), the counts exchange, the op profile's wrapper, exact
// integer and double reductions, the refusal of 16-bit reductions, and the argument checks.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/op_profile.h"
#include "core/ops.h"
#include "parallel/profiled_comm.h"
#include "parallel/thread_comm.h"
#include "tests/common/comm_elements.h"

namespace tpt {
namespace {

using test::comm_type_name;
using test::element_ids;
using test::id_elements;

// Three ranks; rank r sends kCounts[r][p] elements to peer p, the j-th of them standing for
// 100 r + 10 p + j.
const std::vector<std::vector<int64_t>> kCounts = {{2, 0, 3}, {1, 1, 0}, {0, 4, 2}};
const std::vector<std::vector<int>> kSend = {{0, 1, 20, 21, 22}, {100, 110}, {210, 211, 212, 213, 220, 221}};
// What each rank receives, by hand: from peer 0, then 1, then 2.
const std::vector<std::vector<int64_t>> kRecvCounts = {{2, 1, 0}, {0, 1, 4}, {3, 0, 2}};
const std::vector<std::vector<int>> kRecv = {{0, 1, 100}, {110, 210, 211, 212, 213}, {20, 21, 22, 220, 221}};

TEST(AllToAllV, UnevenAndZeroCountsOfEveryTypeLandInRankOrder) {
  for (const DType t : test::kCommTypes) {
    SCOPED_TRACE(comm_type_name(t));
    run_thread_ranks(3, 1, 1, false, [&](Grid& g) {
      Comm& c = *g.world;
      const size_t r = size_t(c.rank());
      const std::vector<char> send = id_elements(kSend[r], t);
      std::vector<char> recv(kRecv[r].size() * size_t(dtype_bytes(t)), char(0x7f));
      c.all_to_all_v(send.data(), kCounts[r], recv.data(), kRecvCounts[r], t);
      EXPECT_EQ(element_ids(recv, t), kRecv[r]) << "rank " << r;
    });
  }
}

// The op profile's wrapper (parallel/profiled_comm.h) forwards the typed calls and names their spans.
TEST(AllToAllV, TheProfiledCommForwardsAndTimesIt) {
  run_thread_ranks(3, 1, 1, false, [&](Grid& g) {
    auto ops = make_cpu_ops(1);
    OpProfile profile(*ops, [] { return 0.0; });
    auto c = make_profiled_comm(*g.world, profile, "ep");
    const size_t r = size_t(c->rank());
    const std::vector<char> send = id_elements(kSend[r], DType::BF16);
    std::vector<char> recv(kRecv[r].size() * 2);
    c->all_to_all_v(send.data(), kCounts[r], recv.data(), kRecvCounts[r], DType::BF16);
    EXPECT_EQ(element_ids(recv, DType::BF16), kRecv[r]);
    int64_t x = int64_t(r) << 40;
    c->all_reduce(&x, 1, DType::I64, ReduceOp::Sum);
    EXPECT_EQ(x, int64_t(3) << 40);
    const std::vector<OpProfile::Timed> spans = profile.flush(false);
    ASSERT_EQ(spans.size(), 2u);
    EXPECT_EQ(spans[0].name, "ep all_to_all_v");
    EXPECT_EQ(spans[1].name, "ep all_reduce");
  });
}

TEST(AllToAllV, TheCountsExchangeGivesEachRankItsColumn) {
  run_thread_ranks(3, 1, 1, false, [&](Grid& g) {
    Comm& c = *g.world;
    const size_t r = size_t(c.rank());
    std::vector<int64_t> got(3, -1);
    c.all_to_all_counts(kCounts[r].data(), got.data());
    EXPECT_EQ(got, kRecvCounts[r]) << "rank " << r;
    // counts beyond 32 bits travel whole
    const std::vector<int64_t> big = {int64_t(5) << 40 | int64_t(r), int64_t(6) << 40 | int64_t(r),
                                      int64_t(7) << 40 | int64_t(r)};
    c.all_to_all_counts(big.data(), got.data());
    for (int64_t p = 0; p < 3; ++p) EXPECT_EQ(got[size_t(p)], (int64_t(5 + r) << 40) | p) << "from " << p;
  });
}

// Four ranks over the DP group of a TP 2 x DP 4 grid (two all-to-alls at once, one per TP rank):
// rank 3 neither sends nor receives; the others send (2 d + p) % 4 elements to each peer p < 3.
TEST(AllToAllV, ARankWithNothingToSendOrReceiveAndConcurrentGroups) {
  auto count = [](int from, int to) { return from == 3 || to == 3 ? 0 : (2 * from + to) % 4; };
  run_thread_ranks(2, 1, 4, false, [&](Grid& g) {
    Comm& c = *g.dp_group;
    const int d = c.rank(), n = c.size();
    ASSERT_EQ(n, 4);
    std::vector<int64_t> sc(4), rc(4);
    std::vector<int> send_ids, want;
    for (int p = 0; p < n; ++p) {
      sc[size_t(p)] = count(d, p);
      rc[size_t(p)] = count(p, d);
      for (int j = 0; j < count(d, p); ++j) send_ids.push_back(64 * g.tp_rank + 16 * d + 4 * p + j);
      for (int j = 0; j < count(p, d); ++j) want.push_back(64 * g.tp_rank + 16 * p + 4 * d + j);
    }
    for (const DType t : {DType::BF16, DType::I64}) {
      const std::vector<char> send = id_elements(send_ids, t);
      std::vector<char> recv(want.size() * size_t(dtype_bytes(t)));
      c.all_to_all_v(send.data(), sc, recv.data(), rc, t);
      EXPECT_EQ(element_ids(recv, t), want) << comm_type_name(t) << ", dp rank " << d << " tp rank " << g.tp_rank;
    }
  });
}

TEST(AllToAllV, CountsThatDoNotMatchThePeersAreAnError) {
  try {
    run_thread_ranks(2, 1, 1, false, [](Grid& g) {
      Comm& c = *g.world;
      const std::vector<int64_t> sc = {1, 1}, rc = {1, c.rank() == 0 ? 2 : 1};  // rank 0 expects 2 from 1
      std::vector<float> send(2, 1.0f), recv(3);
      c.all_to_all_v(send.data(), sc, recv.data(), rc, DType::F32);
    });
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("expected 2 elements from rank 1, which sends 1"), std::string::npos)
        << e.what();
  }
  try {
    run_thread_ranks(2, 1, 1, false, [](Grid& g) {
      std::vector<float> buf(4);
      g.world->all_to_all_v(buf.data(), {1, 1, 1}, buf.data() + 3, {1, 1}, DType::F32);
    });
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("one per rank"), std::string::npos) << e.what();
  }
}

TEST(AllToAllV, TheGroupOfOneRankCopiesItsOwnBlock) {
  auto self = make_self_comm();
  const std::vector<char> send = id_elements({7, 8, 9}, DType::F16);
  std::vector<char> recv(send.size());
  self->all_to_all_v(send.data(), {3}, recv.data(), {3}, DType::F16);
  EXPECT_EQ(element_ids(recv, DType::F16), (std::vector<int>{7, 8, 9}));
  EXPECT_THROW(self->all_to_all_v(send.data(), {3}, recv.data(), {2}, DType::F16), InternalError);
  EXPECT_THROW(self->all_to_all_v(send.data(), {3}, const_cast<char*>(send.data()) + 2, {3}, DType::F16),
               InternalError);  // overlapping buffers
  EXPECT_THROW(self->all_to_all_v(send.data(), {-1}, recv.data(), {-1}, DType::F16), InternalError);
}

// The reductions of the 32- and 64-bit types are exact; a float or a double would lose these low bits.
TEST(TypedCollectives, IntegerAndDoubleReductionsAreExact) {
  run_thread_ranks(1, 1, 3, false, [](Grid& g) {
    Comm& c = *g.world;
    const int r = c.rank();
    const int64_t big = int64_t(1) << 60;
    std::vector<int64_t> s64 = {big + r, -big + 3 * r}, m64 = s64;
    c.all_reduce(s64.data(), 2, DType::I64, ReduceOp::Sum);
    c.all_reduce(m64.data(), 2, DType::I64, ReduceOp::Max);
    EXPECT_EQ(s64, (std::vector<int64_t>{3 * big + 3, -3 * big + 9}));
    EXPECT_EQ(m64, (std::vector<int64_t>{big + 2, -big + 6}));
    std::vector<int32_t> s32 = {(1 << 29) + r, -7 * r};  // 2^29 + r: beyond a float's 24 bits
    c.all_reduce(s32.data(), 2, DType::I32, ReduceOp::Sum);
    EXPECT_EQ(s32, (std::vector<int32_t>{3 * (1 << 29) + 3, -21}));
    double d = 1099511627776.0 + r;  // 2^40 + r
    c.all_reduce(&d, 1, ReduceOp::Sum);
    EXPECT_EQ(d, 3 * 1099511627776.0 + 3);
    // reduce_scatter and a started all-reduce of int64: block r of the sums
    std::vector<int64_t> in = {big, 1, 2, 3, 4, 5 + r}, out(2);
    c.reduce_scatter(out.data(), in.data(), 2, DType::I64);
    const std::vector<std::vector<int64_t>> want = {{3 * big, 3}, {6, 9}, {12, 18}};
    EXPECT_EQ(out, want[size_t(r)]);
    std::vector<int64_t> x = {big + 1};
    c.wait(c.start_all_reduce(x.data(), 1, DType::I64));
    EXPECT_EQ(x[0], 3 * big + 3);
  });
}

// Started messages (Comm::start_exchange, the CP ring's K/V blocks) on thread ranks and on the
// group of one: a block round a ring of 3 with blocking messages of another tag between start and
// wait. Thread ranks defer the messages to the wait and read the send buffer then, as late as a
// non-blocking send may (a buffer written inside its window is seen); the group of one has nothing
// to send.
TEST(StartedMessages, ARingsBlocksArriveAtTheWaitReadAsLateAsAsynchronousOnes) {
  run_thread_ranks(1, 1, 3, false, [](Grid& g) {
    Comm& c = *g.world;
    const int r = c.rank(), next = (r + 1) % 3, prev = (r + 2) % 3;
    std::vector<float> block = {float(r), float(10 + r)}, arrived(2, -1.0f), grad = {float(-r)}, grad_in(1);
    const int64_t t = c.start_exchange({{true, block.data(), 2, next, 0}, {false, arrived.data(), 2, prev, 0}});
    c.exchange({{true, grad.data(), 1, next, 1}, {false, grad_in.data(), 1, prev, 1}});
    EXPECT_EQ(grad_in[0], float(-prev));
    block[1] = float(100 + r);  // inside the window: what a race looks like
    c.wait(t);
    EXPECT_EQ(arrived, (std::vector<float>{float(prev), float(100 + prev)}));
  });
  auto self = make_self_comm();
  EXPECT_EQ(self->start_exchange({}), -1);
}

TEST(TypedCollectives, SixteenBitValuesMoveBitForBit) {
  run_thread_ranks(1, 1, 2, false, [](Grid& g) {
    Comm& c = *g.world;
    const int r = c.rank();
    // a NaN payload, a negative zero and a subnormal: bits no arithmetic would keep
    std::vector<uint16_t> mine = {uint16_t(0x7fc1 + r), 0x8000, uint16_t(0x0001 + r)}, all(6);
    c.all_gather(all.data(), mine.data(), 3, DType::BF16);
    EXPECT_EQ(all, (std::vector<uint16_t>{0x7fc1, 0x8000, 0x0001, 0x7fc2, 0x8000, 0x0002}));
    std::vector<uint16_t> b = mine;
    c.broadcast(b.data(), 3, DType::F16, 1);
    EXPECT_EQ(b, (std::vector<uint16_t>{0x7fc2, 0x8000, 0x0002}));
    c.exchange({{true, mine.data(), 3, 1 - r, 0, DType::BF16}, {false, b.data(), 3, 1 - r, 0, DType::BF16}});
    EXPECT_EQ(b[0], uint16_t(0x7fc1 + (1 - r)));
  });
}

// bf16 sums (the bf16 gradient buffer, parallel/comm.h): each addition in fp32, rounded to bf16, in
// rank order on threads -- 1 + 2^-8 + 2^-8 is 1 (1 + 2^-8 is a tie, to even: 1; twice), where one
// rounding of the fp32 sum would give 1 + 2^-7. Every other 16-bit reduction is refused.
TEST(TypedCollectives, Bf16SumsRoundEachAdditionOtherSixteenBitReductionsAreRefused) {
  const uint16_t one = fp32_to_bf16(1.0f), tiny = fp32_to_bf16(1.0f / 256);
  ASSERT_EQ(bf16_to_fp32(tiny), 1.0f / 256);
  run_thread_ranks(1, 1, 3, false, [&](Grid& g) {
    Comm& c = *g.world;
    const uint16_t mine = c.rank() == 0 ? one : tiny;
    uint16_t x[2] = {mine, mine};
    c.all_reduce(x, 2, DType::BF16, ReduceOp::Sum);
    EXPECT_EQ(x[0], one);
    EXPECT_EQ(x[1], one);
    std::vector<uint16_t> in(3, mine), out(1);
    in[size_t(c.rank())] = fp32_to_bf16(2.0f);  // block b: 2 from rank b, the others' values
    c.wait(c.start_reduce_scatter(out.data(), in.data(), 1, DType::BF16));
    // block 0: 2 + 2^-8 + 2^-8 = 2; block 1: 1 + 2 + 2^-8 = 3; block 2: 1 + 2^-8 + 2 = 3 (each rounded)
    EXPECT_EQ(bf16_to_fp32(out[0]), c.rank() == 0 ? 2.0f : 3.0f) << c.rank();
  });
  auto self = make_self_comm();
  uint16_t x[4] = {};
  EXPECT_THROW(self->all_reduce(x, 2, DType::BF16, ReduceOp::Max), InternalError);
  EXPECT_NO_THROW(self->all_reduce(x, 2, DType::BF16, ReduceOp::Sum));
  EXPECT_THROW(self->all_reduce(x, 2, DType::F16, ReduceOp::Sum), InternalError);
  EXPECT_THROW(self->all_reduce(x, 2, DType::F16, ReduceOp::Max), InternalError);
  EXPECT_THROW(self->reduce_scatter(x, x + 2, 2, DType::F16), InternalError);
  EXPECT_THROW(self->start_all_reduce(x, 2, DType::F16), InternalError);
  EXPECT_THROW(self->start_reduce_scatter(x, x + 2, 2, DType::F16), InternalError);
  try {
    self->all_reduce(x, 1, DType::F16, ReduceOp::Sum);
    ADD_FAILURE() << "no error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("16-bit values are moved, not reduced"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tpt
