// NcclComm and the device-side group of one rank (parallel/nccl_comm.h).
#ifdef TPTRAIN_HAVE_CUDA
#include "parallel/nccl_comm.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda/cuda_util.h"
#include "core/error.h"
#include "core/watchdog.h"

#ifdef TPTRAIN_HAVE_NCCL
#include <nccl.h>
#endif

namespace tpt {
namespace {

class DeviceSelfComm final : public GroupOfOneComm {
 public:
  void barrier() override { cuda::stream_wait(cuda::compute_stream()); }

 protected:
  void copy(void* out, const void* in, size_t bytes) override {
    TPT_CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, cuda::compute_stream()));
  }
};

#ifdef TPTRAIN_HAVE_NCCL
// Non-blocking NCCL communicators (config.blocking = 0): no NCCL call blocks the host. A call that
// answers ncclInProgress is followed by polling ncclCommGetAsyncError until the communicator is
// ready (NCCL's rule before the next call), inside a CommWait, so the watchdog bounds it; the host's
// waits for the GPU poll every live communicator's asynchronous error (cuda::set_wait_poll). On
// failure the job is aborted with ncclCommAbort (nccl_abort_all, from runtime_abort), never a
// destroy that would flush collectives a dead peer will never complete.
class NcclComm;
std::mutex g_live_mutex;
std::vector<NcclComm*> g_live;  // every NcclComm not yet destroyed or aborted

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
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
    std::lock_guard<std::mutex> lock(g_live_mutex);
    g_live.push_back(this);
    cuda::set_wait_poll(&poll_async_errors);
  }
  // Normal end of a run: finalize (flushes this rank's operations; bounded by the watchdog), then
  // destroy; an error on the way aborts instead.
  ~NcclComm() override {
    const ncclComm_t c = release();
    if (c) {
      CommWait wait("ncclCommFinalize", "the ranks of an NCCL group of " + std::to_string(size_));
      ncclResult_t state = ncclCommFinalize(c);
      while (state == ncclInProgress || state == ncclSuccess) {
        if (ncclCommGetAsyncError(c, &state) != ncclSuccess) state = ncclInternalError;
        if (state == ncclSuccess) break;
        if (state == ncclInProgress) std::this_thread::yield();
      }
      if (state == ncclSuccess) ncclCommDestroy(c);
      else ncclCommAbort(c);
    }
    if (ready_) cudaEventDestroy(ready_);
    for (auto& [ticket, e] : started_) cudaEventDestroy(e);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // One group of the messages on the compute stream (post).
  void exchange(const std::vector<Message>& messages) override {
    const char* what = "";
    const ncclResult_t r = post(messages, stream_, &what);
    check(r, what);
  }
  void barrier() override {
    wait_all();
    cuda::stream_wait(stream_);
    host_.barrier();
  }

  void wait(int64_t ticket) override {
    cudaEvent_t last = nullptr;
    while (!started_.empty() && started_.front().first <= ticket) {
      if (last) free_events_.push_back(last);
      last = started_.front().second;
      started_.pop_front();
    }
    if (!last) return;
    TPT_CUDA_CHECK(cudaStreamWaitEvent(stream_, last, 0));
    free_events_.push_back(last);
  }
  void wait_all() override { wait(INT64_MAX); }

  // ncclCommAbort of every live communicator (the failure path; runtime_abort). Never throws.
  static void abort_all() {
    std::vector<ncclComm_t> comms;
    {
      std::lock_guard<std::mutex> lock(g_live_mutex);
      for (NcclComm* c : g_live) comms.push_back(std::exchange(c->comm_, nullptr));
      g_live.clear();
    }
    for (ncclComm_t c : comms)
      if (c) ncclCommAbort(c);
  }

 protected:
  void do_all_reduce(void* buf, int64_t n, DType t, ReduceOp op) override {
    if (n > 0) check(ncclAllReduce(buf, buf, size_t(n), nccl_type(t), nccl_op(op), comm(), stream_), "ncclAllReduce");
  }
  void do_all_gather(void* out, const void* in, int64_t n, DType t) override {
    if (n > 0) check(ncclAllGather(in, out, size_t(n), nccl_type(t), comm(), stream_), "ncclAllGather");
  }
  void do_reduce_scatter(void* out, const void* in, int64_t n, DType t) override {
    if (n > 0)
      check(ncclReduceScatter(in, out, size_t(n), nccl_type(t), ncclSum, comm(), stream_), "ncclReduceScatter");
  }
  void do_broadcast(void* buf, int64_t n, DType t, int root) override {
    if (n > 0) check(ncclBroadcast(buf, buf, size_t(n), nccl_type(t), root, comm(), stream_), "ncclBroadcast");
  }
  // As Megatron's all-to-all token dispatcher: one NCCL group of a send and a receive per peer
  // (exchange), on the compute stream; NCCL's counts are size_t, so no chunks. The own block is a
  // device copy.
  void do_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                       const std::vector<int64_t>& recv_counts, DType t) override {
    const size_t me = size_t(rank_), e = size_t(dtype_bytes(t));
    TPT_CHECK(send_counts[me] == recv_counts[me]);
    if (send_counts[me] > 0)
      TPT_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(recv) + size_t(all_to_all_offsets(recv_counts)[me]) * e,
                                     static_cast<const char*>(send) + size_t(all_to_all_offsets(send_counts)[me]) * e,
                                     size_t(send_counts[me]) * e, cudaMemcpyDeviceToDevice, stream_));
    exchange(all_to_all_messages(send, send_counts, recv, recv_counts, t, rank_, INT64_MAX, 0));
  }

  // The messages on the communication stream (as the collectives below): the CP ring's next K/V block.
  int64_t do_start_exchange(const std::vector<Message>& messages) override {
    int64_t n = 0;
    for (const Message& m : messages) n += std::max<int64_t>(m.n, 0);
    const char* what = "";
    return start(n, [&] { return post(messages, comm_stream_, &what); });
  }
  // On the communication stream, after what the compute stream has queued so far (an event), so
  // the compute stream goes on (backward, the next forward) while the collective runs; an event
  // recorded after it is what wait() orders the compute stream behind.
  int64_t do_start_all_reduce(void* buf, int64_t n, DType t) override {
    return start(n, [&] { return ncclAllReduce(buf, buf, size_t(n), nccl_type(t), ncclSum, comm(), comm_stream_); });
  }
  int64_t do_start_reduce_scatter(void* out, const void* in, int64_t n, DType t) override {
    return start(n, [&] { return ncclReduceScatter(in, out, size_t(n), nccl_type(t), ncclSum, comm(), comm_stream_); });
  }
  int64_t do_start_all_gather(void* out, const void* in, int64_t n, DType t) override {
    return start(n, [&] { return ncclAllGather(in, out, size_t(n), nccl_type(t), comm(), comm_stream_); });
  }

 private:
  // One NCCL group of the messages on `stream`, in the given order (NCCL pairs a peer's sends and
  // receives in order; it has no tags). The group is closed whatever fails inside it; returns the
  // first failure, named in *what.
  ncclResult_t post(const std::vector<Message>& messages, cudaStream_t stream, const char** what) {
    if (messages.empty()) return ncclSuccess;
    *what = "ncclGroupStart";
    ncclResult_t r = ncclGroupStart();
    if (failed(r)) return r;
    for (const Message& m : messages) {
      if (m.n <= 0) continue;
      r = m.send ? ncclSend(m.buf, size_t(m.n), nccl_type(m.t), m.peer, comm(), stream)
                 : ncclRecv(m.buf, size_t(m.n), nccl_type(m.t), m.peer, comm(), stream);
      *what = m.send ? "ncclSend" : "ncclRecv";
      if (failed(r)) break;
    }
    const ncclResult_t end = ncclGroupEnd();
    if (failed(r)) return r;
    *what = "ncclGroupEnd";
    return end;
  }
  static ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }
  static ncclDataType_t nccl_type(DType t) {
    switch (t) {
      case DType::F32: return ncclFloat;
      case DType::F64: return ncclDouble;
      case DType::I32: return ncclInt32;
      case DType::I64: return ncclInt64;
      case DType::BF16: return ncclBfloat16;
      case DType::F16: return ncclFloat16;
      case DType::U8: return ncclUint8;
    }
    return ncclUint8;
  }
  static bool failed(ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; }
  ncclComm_t comm() const {
    if (!comm_) internal_error("NCCL communicator used after the job was aborted");
    return comm_;
  }
  // Unregisters this communicator; returns its handle (null once aborted).
  ncclComm_t release() {
    std::lock_guard<std::mutex> lock(g_live_mutex);
    g_live.erase(std::remove(g_live.begin(), g_live.end(), this), g_live.end());
    return std::exchange(comm_, nullptr);
  }
  std::string describe(const char* what, ncclResult_t r) const {
    std::string msg = std::string("NCCL ") + what + " failed: " + ncclGetErrorString(r);
    const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
    if (last && *last) msg += std::string(" (") + last + ")";
    return msg + " (rank " + std::to_string(rank_) + " of a group of " + std::to_string(size_) + ")";
  }
  void check(ncclResult_t r, const char* what) const {
    if (r == ncclInProgress) r = wait_ready(what);
    if (r != ncclSuccess) internal_error(describe(what, r));
  }
  // Polls until the communicator has finished its pending call; returns its final state.
  ncclResult_t wait_ready(const char* what) const {
    if (!comm_) return ncclSuccess;
    CommWait wait(what, "the ranks of an NCCL group of " + std::to_string(size_));
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) return q;
      if (state != ncclInProgress) return state;
      std::this_thread::yield();
    }
  }
  // The poll hook of cuda::stream_wait: the first live communicator with an asynchronous error.
  static void poll_async_errors() {
    std::string error;
    {
      std::lock_guard<std::mutex> lock(g_live_mutex);
      for (NcclComm* c : g_live) {
        ncclResult_t state = ncclSuccess;
        if (!c->comm_ || ncclCommGetAsyncError(c->comm_, &state) != ncclSuccess) continue;
        if (failed(state)) {
          error = c->describe("asynchronous operation", state);
          break;
        }
      }
    }
    if (!error.empty()) internal_error(error);
  }

  Comm& host_;
  int rank_, size_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  template <class F>
  int64_t start(int64_t n, F launch) {
    const int64_t ticket = next_ticket_++;
    if (n <= 0) return ticket;
    if (!comm_stream_) {
      TPT_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
      TPT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    }
    TPT_CUDA_CHECK(cudaEventRecord(ready_, stream_));
    TPT_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_, 0));
    check(launch(), "a non-blocking collective");
    cudaEvent_t done = nullptr;
    if (free_events_.empty()) {
      TPT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    } else {
      done = free_events_.back();
      free_events_.pop_back();
    }
    TPT_CUDA_CHECK(cudaEventRecord(done, comm_stream_));
    started_.emplace_back(ticket, done);
    return ticket;
  }
  cudaStream_t comm_stream_ = nullptr;  // the non-blocking collectives' stream, made on first use
  cudaEvent_t ready_ = nullptr;         // compute -> communication
  std::deque<std::pair<int64_t, cudaEvent_t>> started_;  // (ticket, done event), in start order
  std::vector<cudaEvent_t> free_events_;
  int64_t next_ticket_ = 0;
};
#endif

}  // namespace

#ifdef TPTRAIN_HAVE_NCCL
bool nccl_built() { return true; }
void nccl_abort_all() { NcclComm::abort_all(); }
std::unique_ptr<Comm> make_nccl_comm(Comm& host_group) { return std::make_unique<NcclComm>(host_group); }
#else
bool nccl_built() { return false; }
void nccl_abort_all() {}
std::unique_ptr<Comm> make_nccl_comm(Comm& host_group) {
  if (host_group.size() == 1) return make_device_self_comm();
  internal_error("a device-side communicator over " + std::to_string(host_group.size()) +
                 " ranks needs NCCL, and this tptrain was built without it (install NCCL and rebuild)");
}
#endif

std::unique_ptr<Comm> make_device_self_comm() { return std::make_unique<DeviceSelfComm>(); }

}  // namespace tpt
#endif  // TPTRAIN_HAVE_CUDA
