// MpiComm: the Comm interface over an MPI communicator, on host buffers.
#ifdef TPTRAIN_HAVE_MPI
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "core/error.h"
#include "parallel/comm.h"
#include "parallel/mpi_comm.h"

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
  }
  ~MpiComm() override {
    if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(float* buf, int64_t n, ReduceOp op) override { reduce(buf, n, MPI_FLOAT, op); }
  void all_reduce(double* buf, int64_t n, ReduceOp op) override { reduce(buf, n, MPI_DOUBLE, op); }

  void all_gather(float* out, const float* in, int64_t n) override {
    TPT_CHECK(n <= INT_MAX);
    check(MPI_Allgather(in, int(n), MPI_FLOAT, out, int(n), MPI_FLOAT, comm_), "Allgather");
  }
  void reduce_scatter(float* out, const float* in, int64_t n) override {
    TPT_CHECK(n <= INT_MAX);
    check(MPI_Reduce_scatter_block(in, out, int(n), MPI_FLOAT, MPI_SUM, comm_), "Reduce_scatter_block");
  }
  void broadcast(float* buf, int64_t n, int root) override {
    for (int64_t off = 0; off < n; off += kChunk)
      check(MPI_Bcast(buf + off, int(std::min(kChunk, n - off)), MPI_FLOAT, root, comm_), "Bcast");
  }
  void send_recv(const float* send_buf, int64_t send_n, int send_peer, float* recv_buf, int64_t recv_n,
                 int recv_peer) override {
    TPT_CHECK(send_n <= INT_MAX && recv_n <= INT_MAX);
    MPI_Request req[2];
    int k = 0;
    if (recv_n > 0) check(MPI_Irecv(recv_buf, int(recv_n), MPI_FLOAT, recv_peer, 0, comm_, &req[k++]), "Irecv");
    if (send_n > 0)
      check(MPI_Isend(send_buf, int(send_n), MPI_FLOAT, send_peer, 0, comm_, &req[k++]), "Isend");
    if (k) check(MPI_Waitall(k, req, MPI_STATUSES_IGNORE), "Waitall");
  }
  void barrier() override { check(MPI_Barrier(comm_), "Barrier"); }

  // MPI_Iallreduce per chunk; they progress inside the rank's later MPI calls (the next start, the
  // pipeline's messages)
  void start_all_reduce(float* buf, int64_t n) override {
    for (int64_t off = 0; off < n; off += kChunk) {
      pending_.emplace_back();
      check(MPI_Iallreduce(MPI_IN_PLACE, buf + off, int(std::min(kChunk, n - off)), MPI_FLOAT, MPI_SUM, comm_,
                           &pending_.back()),
            "Iallreduce");
    }
    // MPI progresses non-blocking collectives only inside MPI calls: drive the started ones now
    int done = 0;
    check(MPI_Testall(int(pending_.size()), pending_.data(), &done, MPI_STATUSES_IGNORE), "Testall");
    if (done) pending_.clear();
  }
  void finish_all_reduces() override {
    if (pending_.empty()) return;
    check(MPI_Waitall(int(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE), "Waitall");
    pending_.clear();
  }

 private:
  void reduce(void* buf, int64_t n, MPI_Datatype t, ReduceOp op) {
    int esize = 0;
    MPI_Type_size(t, &esize);
    auto* p = static_cast<char*>(buf);
    for (int64_t off = 0; off < n; off += kChunk)
      check(MPI_Allreduce(MPI_IN_PLACE, p + off * esize, int(std::min(kChunk, n - off)), t,
                          op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, comm_),
            "Allreduce");
  }
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> pending_;  // started, unfinished all-reduces
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(MPI_Comm c) { return std::make_unique<MpiComm>(c); }

}  // namespace tpt
#endif
