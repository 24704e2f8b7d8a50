// MpiComm: the Comm interface over an MPI communicator, on host buffers.
#ifdef TPTRAIN_HAVE_MPI
#include <mpi.h>

#include <algorithm>
#include <deque>
#include <climits>
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

// MPI counts are int: large buffers go in chunks.
constexpr int64_t kChunk = int64_t(1) << 30;

class MpiComm final : public Comm {
 public:
  explicit MpiComm(MPI_Comm c) : comm_(c) {
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

  void all_reduce(float* buf, int64_t n, ReduceOp op) override { reduce(buf, n, MPI_FLOAT, op); }
  void all_reduce(double* buf, int64_t n, ReduceOp op) override { reduce(buf, n, MPI_DOUBLE, op); }

  void broadcast(float* buf, int64_t n, int root) override {
    CommWait w("broadcast", peers_);
    for (int64_t off = 0; off < n; off += kChunk)
      check(MPI_Bcast(buf + off, int(std::min(kChunk, n - off)), MPI_FLOAT, root, comm_), "Bcast");
  }
  void exchange(const std::vector<Message>& messages) override {
    std::vector<MPI_Request> req;
    int send_peer = -1, recv_peer = -1;
    for (int pass = 0; pass < 2; ++pass)  // receives posted first
      for (const Message& m : messages) {
        if (m.n <= 0 || m.send != (pass == 1)) continue;
        TPT_CHECK(m.n <= INT_MAX);
        req.emplace_back();
        if (m.send) check(MPI_Isend(m.buf, int(m.n), MPI_FLOAT, m.peer, m.tag, comm_, &req.back()), "Isend"), send_peer = m.peer;
        else check(MPI_Irecv(m.buf, int(m.n), MPI_FLOAT, m.peer, m.tag, comm_, &req.back()), "Irecv"), recv_peer = m.peer;
      }
    CommWait w("a pipeline send/receive", "world ranks " + peer_list(send_peer, recv_peer));
    if (!req.empty()) check(MPI_Waitall(int(req.size()), req.data(), MPI_STATUSES_IGNORE), "Waitall");
  }
  void barrier() override {
    CommWait w("barrier", peers_);
    check(MPI_Barrier(comm_), "Barrier");
  }

  // Non-blocking: MPI_Iallreduce per chunk, MPI_Ireduce_scatter_block, MPI_Iallgather. They
  // progress inside the rank's later MPI calls (the next start, the pipeline's messages).
  int64_t start_all_reduce(float* buf, int64_t n) override {
    for (int64_t off = 0; off < n; off += kChunk) {
      Pending& p = add();
      check(MPI_Iallreduce(MPI_IN_PLACE, buf + off, int(std::min(kChunk, n - off)), MPI_FLOAT, MPI_SUM, comm_, &p.req),
            "Iallreduce");
    }
    return progress();
  }
  int64_t start_reduce_scatter(float* out, const float* in, int64_t n) override {
    TPT_CHECK(n <= INT_MAX);
    Pending& p = add();
    if (out == in + int64_t(rank_) * n) {  // in place: MPI's result goes to a buffer, copied at the wait
      p.tmp.resize(size_t(n));
      p.copy_to = out;
      out = p.tmp.data();
    }
    check(MPI_Ireduce_scatter_block(in, out, int(n), MPI_FLOAT, MPI_SUM, comm_, &p.req), "Ireduce_scatter_block");
    return progress();
  }
  int64_t start_all_gather(float* out, const float* in, int64_t n) override {
    TPT_CHECK(n <= INT_MAX);
    Pending& p = add();
    const void* send = in == out + int64_t(rank_) * n ? MPI_IN_PLACE : static_cast<const void*>(in);
    check(MPI_Iallgather(send, int(n), MPI_FLOAT, out, int(n), MPI_FLOAT, comm_, &p.req), "Iallgather");
    return progress();
  }
  void wait(int64_t ticket) override { complete(through(ticket), "the DP buckets' collectives"); }
  void wait_all() override { complete(pending_.size(), "the DP buckets' collectives"); }

  void all_gather(float* out, const float* in, int64_t n) override {
    TPT_CHECK(n <= INT_MAX);
    CommWait w("all_gather", peers_);
    const void* send = in == out + int64_t(rank_) * n ? MPI_IN_PLACE : static_cast<const void*>(in);
    check(MPI_Allgather(send, int(n), MPI_FLOAT, out, int(n), MPI_FLOAT, comm_), "Allgather");
  }
  void reduce_scatter(float* out, const float* in, int64_t n) override {
    complete(through(start_reduce_scatter(out, in, n)), "reduce_scatter");
  }

 private:
  void reduce(void* buf, int64_t n, MPI_Datatype t, ReduceOp op) {
    int esize = 0;
    MPI_Type_size(t, &esize);
    auto* p = static_cast<char*>(buf);
    CommWait w("all_reduce", peers_);
    for (int64_t off = 0; off < n; off += kChunk)
      check(MPI_Allreduce(MPI_IN_PLACE, p + off * esize, int(std::min(kChunk, n - off)), t,
                          op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, comm_),
            "Allreduce");
  }
  std::string peer_list(int a, int b) const {
    std::string s;
    for (int p : {a, b})
      if (p >= 0 && (s.empty() || p != b || a != b)) s += (s.empty() ? "" : ", ") + std::to_string(world_ranks_[size_t(p)]);
    return s;
  }
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;  // of this group's ranks
  std::string peers_;             // "world ranks 0, 2, ..." (the watchdog's message)
  // Started, unfinished collectives, in start order (MPI completes a group's collectives in order).
  struct Pending {
    MPI_Request req = MPI_REQUEST_NULL;
    int64_t ticket = 0;
    std::vector<float> tmp;   // an in-place reduce-scatter's result, copied to copy_to at the wait
    float* copy_to = nullptr;
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
      if (p.copy_to) std::copy(p.tmp.begin(), p.tmp.end(), p.copy_to);
      pending_.pop_front();
    }
  }
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(MPI_Comm c) { return std::make_unique<MpiComm>(c); }

}  // namespace tpt
#endif
