// NcclComm and the device-side group of one rank (parallel/nccl_comm.h).
#ifdef TPTRAIN_HAVE_CUDA
#include "parallel/nccl_comm.h"

#include <cstring>
#include <iterator>
#include <string>

#include "core/cuda/cuda_util.h"
#include "core/error.h"

#ifdef TPTRAIN_HAVE_NCCL
#include <nccl.h>
#endif

namespace tpt {
namespace {

class DeviceSelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(float*, int64_t, ReduceOp) override {}
  void all_reduce(double*, int64_t, ReduceOp) override {}
  void all_gather(float* out, const float* in, int64_t n) override { copy(out, in, n); }
  void reduce_scatter(float* out, const float* in, int64_t n) override { copy(out, in, n); }
  void broadcast(float*, int64_t, int) override {}
  void send_recv(const float*, int64_t send_n, int, float*, int64_t recv_n, int) override {
    if (send_n || recv_n) internal_error("send/recv within a group of one rank");
  }
  void barrier() override { TPT_CUDA_CHECK(cudaStreamSynchronize(cuda::compute_stream())); }

 private:
  static void copy(float* out, const float* in, int64_t n) {
    if (out != in && n > 0)
      TPT_CUDA_CHECK(cudaMemcpyAsync(out, in, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                     cuda::compute_stream()));
  }
};

#ifdef TPTRAIN_HAVE_NCCL
class NcclComm final : public Comm {
 public:
  explicit NcclComm(Comm& host) : host_(host), rank_(host.rank()), size_(host.size()), stream_(cuda::compute_stream()) {
    ncclUniqueId id{};
    if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    // The id's bytes travel verbatim over the host group (MPI copies a broadcast's bytes as they are).
    static_assert(sizeof(id) % sizeof(float) == 0);
    float words[sizeof(id) / sizeof(float)];
    std::memcpy(words, &id, sizeof(id));
    host_.broadcast(words, int64_t(std::size(words)), 0);
    std::memcpy(&id, words, sizeof(id));
    check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }
  ~NcclComm() override {
    if (comm_) ncclCommDestroy(comm_);
    if (ready_) cudaEventDestroy(ready_);
    if (done_) cudaEventDestroy(done_);
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(float* buf, int64_t n, ReduceOp op) override {
    if (n > 0) check(ncclAllReduce(buf, buf, size_t(n), ncclFloat, nccl_op(op), comm_, stream_), "ncclAllReduce");
  }
  void all_reduce(double* buf, int64_t n, ReduceOp op) override {
    if (n > 0) check(ncclAllReduce(buf, buf, size_t(n), ncclDouble, nccl_op(op), comm_, stream_), "ncclAllReduce");
  }
  void all_gather(float* out, const float* in, int64_t n) override {
    if (n > 0) check(ncclAllGather(in, out, size_t(n), ncclFloat, comm_, stream_), "ncclAllGather");
  }
  void reduce_scatter(float* out, const float* in, int64_t n) override {
    if (n > 0) check(ncclReduceScatter(in, out, size_t(n), ncclFloat, ncclSum, comm_, stream_), "ncclReduceScatter");
  }
  void broadcast(float* buf, int64_t n, int root) override {
    if (n > 0) check(ncclBroadcast(buf, buf, size_t(n), ncclFloat, root, comm_, stream_), "ncclBroadcast");
  }
  void send_recv(const float* send_buf, int64_t send_n, int send_peer, float* recv_buf, int64_t recv_n,
                 int recv_peer) override {
    if (send_n <= 0 && recv_n <= 0) return;
    check(ncclGroupStart(), "ncclGroupStart");
    if (send_n > 0) check(ncclSend(send_buf, size_t(send_n), ncclFloat, send_peer, comm_, stream_), "ncclSend");
    if (recv_n > 0) check(ncclRecv(recv_buf, size_t(recv_n), ncclFloat, recv_peer, comm_, stream_), "ncclRecv");
    check(ncclGroupEnd(), "ncclGroupEnd");
  }
  void barrier() override {
    finish_all_reduces();
    TPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    host_.barrier();
  }

  // On the communication stream, after what the compute stream has queued so far (an event), so
  // the compute stream goes on with backward while the sum runs.
  void start_all_reduce(float* buf, int64_t n) override {
    if (n <= 0) return;
    if (!comm_stream_) {
      TPT_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
      TPT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
      TPT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    }
    TPT_CUDA_CHECK(cudaEventRecord(ready_, stream_));
    TPT_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_, 0));
    check(ncclAllReduce(buf, buf, size_t(n), ncclFloat, ncclSum, comm_, comm_stream_), "ncclAllReduce");
    started_ = true;
  }
  void finish_all_reduces() override {
    if (!started_) return;
    TPT_CUDA_CHECK(cudaEventRecord(done_, comm_stream_));
    TPT_CUDA_CHECK(cudaStreamWaitEvent(stream_, done_, 0));
    started_ = false;
  }

 private:
  static ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }
  void check(ncclResult_t r, const char* what) const {
    if (r == ncclSuccess || r == ncclInProgress) return;
    std::string msg = std::string("NCCL ") + what + " failed: " + ncclGetErrorString(r);
    if (comm_) {
      const char* last = ncclGetLastError(comm_);
      if (last && *last) msg += std::string(" (") + last + ")";
    }
    internal_error(msg + " (rank " + std::to_string(rank_) + " of a group of " + std::to_string(size_) + ")");
  }

  Comm& host_;
  int rank_, size_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;            // start_all_reduce's stream, made on first use
  cudaEvent_t ready_ = nullptr, done_ = nullptr;  // compute -> communication, and back
  bool started_ = false;
};
#endif

}  // namespace

#ifdef TPTRAIN_HAVE_NCCL
bool nccl_built() { return true; }
std::unique_ptr<Comm> make_nccl_comm(Comm& host_group) { return std::make_unique<NcclComm>(host_group); }
#else
bool nccl_built() { return false; }
std::unique_ptr<Comm> make_nccl_comm(Comm& host_group) {
  if (host_group.size() == 1) return make_device_self_comm();
  internal_error("a device-side communicator over " + std::to_string(host_group.size()) +
                 " ranks needs NCCL, and this tptrain was built without it (install NCCL and rebuild)");
}
#endif

std::unique_ptr<Comm> make_device_self_comm() { return std::make_unique<DeviceSelfComm>(); }

}  // namespace tpt
#endif  // TPTRAIN_HAVE_CUDA
