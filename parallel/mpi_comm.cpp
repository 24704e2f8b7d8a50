// MpiComm: the Comm interface over an MPI communicator, on host buffers.
#ifdef TPTRAIN_HAVE_MPI
#include <mpi.h>

#include <algorithm>
#include <deque>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/comm.h"
#include "parallel/mpi_comm.h"
#include "core/watchdog.h"

namespace tpt {
namespace {

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    internal_error(std::string("MPI ") + what + " failed: " + std::string(msg, size_t(len)));
  }
}

// The MPI type of an element type. 16-bit values travel as their bits (bf16 sums: mpi_sum below).
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;
    case DType::U8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

// The sum of bf16 values (parallel/comm.h): each addition in fp32, rounded to nearest even.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = fp32_to_bf16(bf16_to_fp32(a[i]) + bf16_to_fp32(b[i]));
}
// MPI's op for a sum of elements of t: MPI_SUM, or for bf16 the user op above (made once, commutative)
MPI_Op mpi_sum(DType t) {
  if (t != DType::BF16) return MPI_SUM;
  static const MPI_Op op = [] {
    MPI_Op o;
    check(MPI_Op_create(&bf16_sum, 1, &o), "Op_create");
    return o;
  }();
  return op;
}

// What a wait for started operations names to the watchdog.
constexpr const char* kStarted = "the started collectives and messages (DP buckets, the CP ring's K/V blocks)";

// The tag of all_to_all_v's point-to-point messages (exchange's tags are the pipeline's 0 and 1).
constexpr int kAllToAllTag = 1000;

class MpiComm final : public Comm {
 public:
  MpiComm(MPI_Comm c, int64_t max_count) : comm_(c), max_count_(max_count) {
    TPT_CHECK(max_count >= 1 && max_count <= INT_MAX);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // the group's world ranks, for the watchdog's message (core/watchdog.h)
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_Comm_group(comm_, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> mine(static_cast<size_t>(size_)), theirs(static_cast<size_t>(size_));
    for (int i = 0; i < size_; ++i) mine[size_t(i)] = i;
    MPI_Group_translate_ranks(group, size_, mine.data(), world, theirs.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    world_ranks_ = theirs;
    peers_ = "world ranks ";
    for (int i = 0; i < size_ && i < 16; ++i) peers_ += (i ? ", " : "") + std::to_string(theirs[size_t(i)]);
    if (size_ > 16) peers_ += ", ... (" + std::to_string(size_) + " ranks)";
  }
  ~MpiComm() override {
    if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void exchange(const std::vector<Message>& messages) override { post(messages, "a pipeline send/receive"); }
  void barrier() override {
    CommWait w("barrier", peers_);
    check(MPI_Barrier(comm_), "Barrier");
  }
  void wait(int64_t ticket) override { complete(through(ticket), kStarted); }
  void wait_all() override { complete(pending_.size(), kStarted); }

 protected:
  void do_all_reduce(void* buf, int64_t n, DType t, ReduceOp op) override {
    const int64_t e = dtype_bytes(t);
    auto* p = static_cast<char*>(buf);
    CommWait w("all_reduce", peers_);
    for (int64_t off = 0; off < n; off += max_count_)
      check(MPI_Allreduce(MPI_IN_PLACE, p + off * e, int(std::min(max_count_, n - off)), mpi_type(t),
                          op == ReduceOp::Sum ? mpi_sum(t) : MPI_MAX, comm_),
            "Allreduce");
  }
  void do_broadcast(void* buf, int64_t n, DType t, int root) override {
    const int64_t e = dtype_bytes(t);
    auto* p = static_cast<char*>(buf);
    CommWait w("broadcast", peers_);
    for (int64_t off = 0; off < n; off += max_count_)
      check(MPI_Bcast(p + off * e, int(std::min(max_count_, n - off)), mpi_type(t), root, comm_), "Bcast");
  }
  void do_all_gather(void* out, const void* in, int64_t n, DType t) override {
    TPT_CHECK(n <= INT_MAX);
    CommWait w("all_gather", peers_);
    check(MPI_Allgather(in_place_gather(out, in, n, t), int(n), mpi_type(t), out, int(n), mpi_type(t), comm_),
          "Allgather");
  }
  void do_reduce_scatter(void* out, const void* in, int64_t n, DType t) override {
    complete(through(do_start_reduce_scatter(out, in, n, t)), "reduce_scatter");
  }
  // MPI_Alltoallv where every count and displacement fits max_count (an int); beyond, point-to-point
  // messages of at most max_count elements (MPI 3 has no 64-bit counts), the own block copied.
  void do_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                       const std::vector<int64_t>& recv_counts, DType t) override {
    const std::vector<int64_t> so = all_to_all_offsets(send_counts), ro = all_to_all_offsets(recv_counts);
    const MPI_Datatype type = mpi_type(t);
    if (so.back() <= max_count_ && ro.back() <= max_count_) {
      CommWait w("all_to_all_v", peers_);
      std::vector<int> sc(send_counts.begin(), send_counts.end()), rc(recv_counts.begin(), recv_counts.end());
      std::vector<int> sd(so.begin(), so.end() - 1), rd(ro.begin(), ro.end() - 1);
      check(MPI_Alltoallv(send, sc.data(), sd.data(), type, recv, rc.data(), rd.data(), type, comm_), "Alltoallv");
      return;
    }
    const size_t me = size_t(rank_), e = size_t(dtype_bytes(t));
    TPT_CHECK(send_counts[me] == recv_counts[me]);
    if (send_counts[me] > 0)
      std::memcpy(static_cast<char*>(recv) + size_t(ro[me]) * e, static_cast<const char*>(send) + size_t(so[me]) * e,
                  size_t(send_counts[me]) * e);
    post(all_to_all_messages(send, send_counts, recv, recv_counts, t, rank_, max_count_, kAllToAllTag), "all_to_all_v");
  }

  // Non-blocking messages: MPI_Irecv / MPI_Isend (receives first), one ticket for all.
  int64_t do_start_exchange(const std::vector<Message>& messages) override {
    for (int pass = 0; pass < 2; ++pass)
      for (const Message& m : messages) {
        if (m.n <= 0 || m.send != (pass == 1)) continue;
        TPT_CHECK(m.n <= INT_MAX);
        Pending& p = add();
        if (m.send) check(MPI_Isend(m.buf, int(m.n), mpi_type(m.t), m.peer, m.tag, comm_, &p.req), "Isend");
        else check(MPI_Irecv(m.buf, int(m.n), mpi_type(m.t), m.peer, m.tag, comm_, &p.req), "Irecv");
      }
    return progress();
  }
  // Non-blocking: MPI_Iallreduce per chunk, MPI_Ireduce_scatter_block, MPI_Iallgather. They
  // progress inside the rank's later MPI calls (the next start, the pipeline's messages).
  int64_t do_start_all_reduce(void* buf, int64_t n, DType t) override {
    const int64_t e = dtype_bytes(t);
    auto* b = static_cast<char*>(buf);
    for (int64_t off = 0; off < n; off += max_count_) {
      Pending& p = add();
      check(MPI_Iallreduce(MPI_IN_PLACE, b + off * e, int(std::min(max_count_, n - off)), mpi_type(t), mpi_sum(t), comm_,
                           &p.req),
            "Iallreduce");
    }
    return progress();
  }
  int64_t do_start_reduce_scatter(void* out, const void* in, int64_t n, DType t) override {
    TPT_CHECK(n <= INT_MAX);
    const size_t bytes = size_t(n) * size_t(dtype_bytes(t));
    Pending& p = add();
    // in place: MPI's result goes to a buffer, copied at the wait
    if (out == static_cast<const char*>(in) + int64_t(rank_) * int64_t(bytes)) {
      p.tmp.resize(bytes);
      p.copy_to = out;
      out = p.tmp.data();
    }
    check(MPI_Ireduce_scatter_block(in, out, int(n), mpi_type(t), mpi_sum(t), comm_, &p.req), "Ireduce_scatter_block");
    return progress();
  }
  int64_t do_start_all_gather(void* out, const void* in, int64_t n, DType t) override {
    TPT_CHECK(n <= INT_MAX);
    Pending& p = add();
    check(MPI_Iallgather(in_place_gather(out, in, n, t), int(n), mpi_type(t), out, int(n), mpi_type(t), comm_, &p.req),
          "Iallgather");
    return progress();
  }

 private:
  // Posts the messages (receives first) and waits for all; `what` names them for the watchdog.
  void post(const std::vector<Message>& messages, const char* what) {
    std::vector<MPI_Request> req;
    int send_peer = -1, recv_peer = -1;
    for (int pass = 0; pass < 2; ++pass)  // receives posted first
      for (const Message& m : messages) {
        if (m.n <= 0 || m.send != (pass == 1)) continue;
        TPT_CHECK(m.n <= INT_MAX);
        req.emplace_back();
        const MPI_Datatype t = mpi_type(m.t);
        if (m.send) {
          check(MPI_Isend(m.buf, int(m.n), t, m.peer, m.tag, comm_, &req.back()), "Isend");
          send_peer = m.peer;
        } else {
          check(MPI_Irecv(m.buf, int(m.n), t, m.peer, m.tag, comm_, &req.back()), "Irecv");
          recv_peer = m.peer;
        }
      }
    CommWait w(what, "world ranks " + peer_list(send_peer, recv_peer));
    if (!req.empty()) check(MPI_Waitall(int(req.size()), req.data(), MPI_STATUSES_IGNORE), "Waitall");
  }
  // MPI_IN_PLACE when this rank's block already lies in place in out, else in.
  const void* in_place_gather(void* out, const void* in, int64_t n, DType t) const {
    return in == static_cast<const char*>(out) + int64_t(rank_) * n * dtype_bytes(t) ? MPI_IN_PLACE : in;
  }
  std::string peer_list(int a, int b) const {
    std::string s;
    for (int p : {a, b})
      if (p >= 0 && (s.empty() || p != b || a != b)) s += (s.empty() ? "" : ", ") + std::to_string(world_ranks_[size_t(p)]);
    return s;
  }
  MPI_Comm comm_;
  int64_t max_count_;  // elements per MPI call of the chunked operations
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;  // of this group's ranks
  std::string peers_;             // "world ranks 0, 2, ..." (the watchdog's message)
  // Started, unfinished collectives, in start order (MPI completes a group's collectives in order).
  struct Pending {
    MPI_Request req = MPI_REQUEST_NULL;
    int64_t ticket = 0;
    std::vector<char> tmp;  // an in-place reduce-scatter's result, copied to copy_to at the wait
    void* copy_to = nullptr;
  };
  std::deque<Pending> pending_;
  int64_t next_ticket_ = 0;
  Pending& add() {
    pending_.emplace_back();
    pending_.back().ticket = next_ticket_;
    return pending_.back();
  }
  // Drives the started ones (MPI progresses non-blocking collectives only inside MPI calls) and
  // returns the ticket of the last one.
  int64_t progress() {
    for (Pending& p : pending_) {
      int done = 0;
      if (p.req != MPI_REQUEST_NULL) check(MPI_Test(&p.req, &done, MPI_STATUS_IGNORE), "Test");
    }
    return next_ticket_++;
  }
  // How many pending collectives have tickets up to `ticket`.
  size_t through(int64_t ticket) const {
    size_t k = 0;
    while (k < pending_.size() && pending_[k].ticket <= ticket) ++k;
    return k;
  }
  // Completes the first k pending collectives.
  void complete(size_t k, const char* what) {
    if (k == 0) return;
    CommWait w(what, peers_);
    for (size_t i = 0; i < k; ++i) {
      Pending& p = pending_.front();
      check(MPI_Wait(&p.req, MPI_STATUS_IGNORE), "Wait");
      if (p.copy_to) std::memcpy(p.copy_to, p.tmp.data(), p.tmp.size());
      pending_.pop_front();
    }
  }
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(MPI_Comm c, int64_t max_count) { return std::make_unique<MpiComm>(c, max_count); }

}  // namespace tpt
#endif
