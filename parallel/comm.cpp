// The typed collectives' argument checks (parallel/comm.h), shared by every backend.
#include "parallel/comm.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace tpt {
namespace {

const char* type_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

// Reductions take the 32- and 64-bit types, and BF16 sums (comm.h: the bf16 gradient buffer's, rounded
// at each addition in the backend's order); bytes are moved only.
void check_reducible(DType t, const char* what, ReduceOp op = ReduceOp::Sum) {
  if (t == DType::U8) internal_error(std::string(what) + " of u8 elements: bytes are moved, not reduced, by a communicator");
  if (t == DType::F16 || (t == DType::BF16 && op != ReduceOp::Sum))
    internal_error(std::string(what) + " of " + type_name(t) +
                   " elements: 16-bit values are moved, not reduced, by a communicator (but bf16 sums; reduce "
                   "them in fp32)");
}

void check_count(int64_t n, const char* what) {
  if (n < 0) internal_error(std::string(what) + ": negative element count " + std::to_string(n));
}

}  // namespace

std::vector<int64_t> all_to_all_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size() + 1, 0);
  for (size_t p = 0; p < counts.size(); ++p) offsets[p + 1] = offsets[p] + counts[p];
  return offsets;
}

std::vector<Comm::Message> all_to_all_messages(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                               const std::vector<int64_t>& recv_counts, DType t, int rank,
                                               int64_t max_count, int tag) {
  const std::vector<int64_t> so = all_to_all_offsets(send_counts), ro = all_to_all_offsets(recv_counts);
  const int64_t e = dtype_bytes(t);
  std::vector<Comm::Message> m;
  for (const bool is_send : {false, true})
    for (size_t p = 0; p < send_counts.size(); ++p) {
      if (int(p) == rank) continue;
      const int64_t count = is_send ? send_counts[p] : recv_counts[p];
      char* base = is_send ? const_cast<char*>(static_cast<const char*>(send)) + so[p] * e
                           : static_cast<char*>(recv) + ro[p] * e;
      for (int64_t off = 0; off < count; off += max_count)
        m.push_back({is_send, base + off * e, std::min(max_count, count - off), int(p), tag, t});
    }
  return m;
}

void Comm::all_reduce(void* buf, int64_t n, DType t, ReduceOp op) {
  check_reducible(t, "all_reduce", op);
  check_count(n, "all_reduce");
  do_all_reduce(buf, n, t, op);
}

void Comm::all_gather(void* out, const void* in, int64_t n, DType t) {
  check_count(n, "all_gather");
  do_all_gather(out, in, n, t);
}

void Comm::reduce_scatter(void* out, const void* in, int64_t n, DType t) {
  check_reducible(t, "reduce_scatter");
  check_count(n, "reduce_scatter");
  do_reduce_scatter(out, in, n, t);
}

void Comm::broadcast(void* buf, int64_t n, DType t, int root) {
  check_count(n, "broadcast");
  if (root < 0 || root >= size())
    internal_error("broadcast from root " + std::to_string(root) + " in a group of " + std::to_string(size()));
  do_broadcast(buf, n, t, root);
}

void Comm::all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                        const std::vector<int64_t>& recv_counts, DType t) {
  const size_t n = size_t(size());
  if (send_counts.size() != n || recv_counts.size() != n)
    internal_error("all_to_all_v: " + std::to_string(send_counts.size()) + " send and " +
                   std::to_string(recv_counts.size()) + " receive counts in a group of " + std::to_string(n) +
                   " ranks (one per rank)");
  for (size_t p = 0; p < n; ++p)
    if (send_counts[p] < 0 || recv_counts[p] < 0)
      internal_error("all_to_all_v: a negative count for peer " + std::to_string(p));
  const int64_t e = dtype_bytes(t);
  const auto s0 = reinterpret_cast<uintptr_t>(send), r0 = reinterpret_cast<uintptr_t>(recv);
  const auto s1 = s0 + uintptr_t(all_to_all_offsets(send_counts).back() * e);
  const auto r1 = r0 + uintptr_t(all_to_all_offsets(recv_counts).back() * e);
  if (s0 < r1 && r0 < s1) internal_error("all_to_all_v: the send and receive buffers overlap");
  do_all_to_all_v(send, send_counts, recv, recv_counts, t);
}

void Comm::all_to_all_counts(const int64_t* send_counts, int64_t* recv_counts) {
  const std::vector<int64_t> one(size_t(size()), 1);
  all_to_all_v(send_counts, one, recv_counts, one, DType::I64);
}

int64_t Comm::start_all_reduce(void* buf, int64_t n, DType t) {
  check_reducible(t, "start_all_reduce");
  check_count(n, "start_all_reduce");
  return do_start_all_reduce(buf, n, t);
}

int64_t Comm::start_reduce_scatter(void* out, const void* in, int64_t n, DType t) {
  check_reducible(t, "start_reduce_scatter");
  check_count(n, "start_reduce_scatter");
  return do_start_reduce_scatter(out, in, n, t);
}

int64_t Comm::start_all_gather(void* out, const void* in, int64_t n, DType t) {
  check_count(n, "start_all_gather");
  return do_start_all_gather(out, in, n, t);
}

}  // namespace tpt
