#include "parallel/thread_comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#ifdef TPTRAIN_HAVE_CUDA  // device groups copy through the host on the thread's compute stream
#include "core/cuda/cuda_util.h"
#endif

namespace tpt {
namespace {

// Shared by every group of one run: set when a rank's body has failed.
struct Abort {
  std::atomic<bool> set{false};
};

// The shared state of one group: a reusable barrier, the buffers each member published for the
// current collective, and a mailbox per (sender, receiver).
class Group {
 public:
  Group(int size, const Abort& abort)
      : size_(size), abort_(abort), published_(size_t(size)), mail_(size_t(size) * size_t(size) * kTags) {}
  int size() const { return size_; }

  // Returns when every member has arrived (a generation barrier); throws if a rank failed.
  void arrive() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    while (generation_ == generation) wait(lock);
  }
  void publish(int rank, const void* p) { published_[size_t(rank)] = p; }  // read between two arrive()s
  template <class T>
  const T* published(int rank) const {
    return static_cast<const T*>(published_[size_t(rank)]);
  }

  // One mailbox per (sender, receiver, tag): messages of a tag arrive in posting order.
  static constexpr int kTags = 2;
  void post(int from, int to, int tag, std::vector<char> message) {
    std::lock_guard<std::mutex> lock(mutex_);
    mail_[box(from, to, tag)].push_back(std::move(message));
    cv_.notify_all();
  }
  std::vector<char> take(int from, int to, int tag) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& mail = mail_[box(from, to, tag)];
    while (mail.empty()) wait(lock);
    std::vector<char> m = std::move(mail.front());
    mail.pop_front();
    return m;
  }

 private:
  size_t box(int from, int to, int tag) const {
    TPT_CHECK(tag >= 0 && tag < kTags);
    return size_t((from * size_ + to) * kTags + tag);
  }
  void wait(std::unique_lock<std::mutex>& lock) {
    cv_.wait_for(lock, std::chrono::milliseconds(20));
    if (abort_.set.load()) internal_error("another rank of this threads-as-ranks run failed");
  }

  const int size_;
  const Abort& abort_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  std::vector<const void*> published_;
  std::vector<std::deque<std::vector<char>>> mail_;
};

// The base of a group member whose started collectives run at the wait (ThreadComm,
// StagedDeviceComm), in start order; a ticket's wait runs it and every earlier one. Deferred to
// the wait, a collective reads its buffers as late as an asynchronous one may, so a bucket written
// after its start gives a wrong result (what a race checker looks for).
class DeferringComm : public Comm {
 public:
  void wait(int64_t ticket) override { run(ticket); }
  void wait_all() override { run(INT64_MAX); }

 protected:
  int64_t do_start_all_reduce(void* buf, int64_t n, DType t) override { return add({Kind::AllReduce, buf, buf, n, t}); }
  int64_t do_start_reduce_scatter(void* out, const void* in, int64_t n, DType t) override {
    return add({Kind::ReduceScatter, out, in, n, t});
  }
  int64_t do_start_all_gather(void* out, const void* in, int64_t n, DType t) override {
    return add({Kind::AllGather, out, in, n, t});
  }
  int64_t do_start_exchange(const std::vector<Message>& messages) override {
    Op op{Kind::Exchange, nullptr, nullptr, 0, DType::F32};
    op.messages = messages;
    return add(std::move(op));
  }

 private:
  enum class Kind { AllReduce, ReduceScatter, AllGather, Exchange };  // the all-reduce in place, a sum
  struct Op {
    Kind kind;
    void* out;
    const void* in;
    int64_t n;
    DType t;
    int64_t ticket = 0;
    std::vector<Message> messages = {};  // Exchange's
  };
  int64_t add(Op op) {
    const int64_t ticket = op.ticket = next_++;
    ops_.push_back(std::move(op));
    return ticket;
  }
  void run(int64_t ticket) {
    while (!ops_.empty() && ops_.front().ticket <= ticket) {
      const Op op = std::move(ops_.front());
      ops_.pop_front();
      if (op.kind == Kind::Exchange) exchange(op.messages);
      else if (op.kind == Kind::AllReduce) all_reduce(op.out, op.n, op.t, ReduceOp::Sum);
      else if (op.kind == Kind::ReduceScatter) reduce_scatter(op.out, op.in, op.n, op.t);
      else all_gather(op.out, op.in, op.n, op.t);
    }
  }
  std::deque<Op> ops_;
  int64_t next_ = 0;
};

// result[i] = x_0[i] (+ or max) x_1[i] ... over the members' published buffers from element
// `offset` on, in rank order (every member gets the same bits), for the reducible types.
template <class T>
void reduce_published(T* result, const Group& g, int64_t offset, int64_t n, ReduceOp op) {
  std::copy_n(g.published<T>(0) + offset, n, result);
  for (int r = 1; r < g.size(); ++r) {
    const T* x = g.published<T>(r) + offset;
    for (int64_t i = 0; i < n; ++i) result[i] = op == ReduceOp::Sum ? result[i] + x[i] : std::max(result[i], x[i]);
  }
}
void reduce_published(void* result, DType t, const Group& g, int64_t offset, int64_t n, ReduceOp op) {
  switch (t) {
    case DType::F32: return reduce_published(static_cast<float*>(result), g, offset, n, op);
    case DType::F64: return reduce_published(static_cast<double*>(result), g, offset, n, op);
    case DType::I32: return reduce_published(static_cast<int32_t*>(result), g, offset, n, op);
    case DType::I64: return reduce_published(static_cast<int64_t*>(result), g, offset, n, op);
    case DType::BF16: {  // sums only (parallel/comm.h): each addition in fp32, rounded
      auto* out = static_cast<uint16_t*>(result);
      std::copy_n(g.published<uint16_t>(0) + offset, n, out);
      for (int r = 1; r < g.size(); ++r) {
        const uint16_t* x = g.published<uint16_t>(r) + offset;
        for (int64_t i = 0; i < n; ++i) out[i] = fp32_to_bf16(bf16_to_fp32(out[i]) + bf16_to_fp32(x[i]));
      }
      return;
    }
    case DType::F16:
    case DType::U8: break;  // never reduced (parallel/comm.h); Comm refuses them before
  }
  internal_error("threads as ranks: a reduction of f16 or u8 elements");
}

// What a member publishes for an all_to_all_v: its send buffer and counts.
struct Outgoing {
  const char* send;
  const int64_t* counts;
};

// A member of a group on host buffers.
class ThreadComm final : public DeferringComm {
 public:
  ThreadComm(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  // Sends first (posting never blocks), then each receive in turn.
  void exchange(const std::vector<Message>& messages) override {
    for (const Message& m : messages)
      if (m.send && m.n > 0) {
        std::vector<char> bytes(size_t(m.n) * size_t(dtype_bytes(m.t)));
        std::memcpy(bytes.data(), m.buf, bytes.size());
        g_->post(rank_, m.peer, m.tag, std::move(bytes));
      }
    for (const Message& m : messages)
      if (!m.send && m.n > 0) {
        const std::vector<char> bytes = g_->take(m.peer, rank_, m.tag);
        const size_t e = size_t(dtype_bytes(m.t));
        if (bytes.size() != size_t(m.n) * e)
          internal_error("send/recv: rank " + std::to_string(rank_) + " expected " + std::to_string(m.n) +
                         " elements from rank " + std::to_string(m.peer) + ", which sent " +
                         std::to_string(bytes.size() / e));
        std::memcpy(m.buf, bytes.data(), bytes.size());
      }
  }
  void barrier() override { g_->arrive(); }

 protected:
  void do_all_reduce(void* buf, int64_t n, DType t, ReduceOp op) override {
    collective(buf, buf, bytes(n, t), [&](char* result) { reduce_published(result, t, *g_, 0, n, op); });
  }
  void do_all_gather(void* out, const void* in, int64_t n, DType t) override {
    collective(in, out, bytes(size() * n, t), [&](char* result) {
      if (n > 0)
        for (int r = 0; r < size(); ++r) std::memcpy(result + bytes(r * n, t), g_->published<char>(r), bytes(n, t));
    });
  }
  void do_reduce_scatter(void* out, const void* in, int64_t n, DType t) override {
    collective(in, out, bytes(n, t),
               [&](char* result) { reduce_published(result, t, *g_, int64_t(rank_) * n, n, ReduceOp::Sum); });
  }
  void do_broadcast(void* buf, int64_t n, DType t, int root) override {
    collective(buf, buf, bytes(n, t),
               [&](char* result) {
                 if (n > 0) std::memcpy(result, g_->published<char>(root), bytes(n, t));
               });
  }
  // Each member copies its blocks out of the senders' published buffers, checking that each
  // sender's count for it is the one it expects.
  void do_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                       const std::vector<int64_t>& recv_counts, DType t) override {
    const Outgoing mine{static_cast<const char*>(send), send_counts.data()};
    const std::vector<int64_t> ro = all_to_all_offsets(recv_counts);
    // A mismatch is raised after the collective's second arrival: thrown inside it, this member's
    // counts and buffers were freed while the others still read them (ASan, 2026-12-06)
    std::string mismatch;
    collective(&mine, recv, bytes(ro.back(), t), [&](char* result) {
      for (int p = 0; p < size() && mismatch.empty(); ++p) {
        const Outgoing& peer = *g_->published<Outgoing>(p);
        const int64_t offset = std::accumulate(peer.counts, peer.counts + rank_, int64_t(0));
        if (peer.counts[rank_] != recv_counts[size_t(p)]) {
          mismatch = "all_to_all_v: rank " + std::to_string(rank_) + " expected " +
                     std::to_string(recv_counts[size_t(p)]) + " elements from rank " + std::to_string(p) +
                     ", which sends " + std::to_string(peer.counts[rank_]);
          break;
        }
        const size_t n = bytes(recv_counts[size_t(p)], t);  // a peer that sends none may pass null buffers
        if (n > 0) std::memcpy(result + bytes(ro[size_t(p)], t), peer.send + bytes(offset, t), n);
      }
    });
    if (!mismatch.empty()) internal_error(mismatch);
  }

 private:
  static size_t bytes(int64_t n, DType t) { return size_t(std::max<int64_t>(n, 0)) * size_t(dtype_bytes(t)); }
  // publish `in`, compute this member's result (out_bytes) from everyone's, wait until all have
  // read, write it
  template <class F>
  void collective(const void* in, void* out, size_t out_bytes, F compute) {
    g_->publish(rank_, in);
    g_->arrive();
    std::vector<char> result(out_bytes);
    compute(result.data());
    g_->arrive();
    if (out_bytes > 0) std::memcpy(out, result.data(), out_bytes);
  }

  std::shared_ptr<Group> g_;
  int rank_;
};

#ifdef TPTRAIN_HAVE_CUDA
// A member of a group on device buffers: copies them to the host on the calling thread's compute
// stream (after its queued kernels), runs the host member's collective, copies the result back.
// Its started collectives, deferred as ThreadComm's, read their buffers at the wait, in stream order.
class StagedDeviceComm final : public DeferringComm {
 public:
  explicit StagedDeviceComm(std::unique_ptr<Comm> host) : host_(std::move(host)) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  void exchange(const std::vector<Message>& messages) override {
    std::vector<std::vector<char>> host(messages.size());
    std::vector<Message> staged = messages;
    for (size_t i = 0; i < messages.size(); ++i) {
      const size_t n = bytes(messages[i].n, messages[i].t);
      host[i] = messages[i].send ? to_host(messages[i].buf, n) : std::vector<char>(n);
      staged[i].buf = host[i].data();
    }
    host_->exchange(staged);
    for (size_t i = 0; i < messages.size(); ++i)
      if (!messages[i].send) to_device(messages[i].buf, host[i]);
  }
  void barrier() override {
    cuda::stream_wait(cuda::compute_stream());
    host_->barrier();
  }

 protected:
  void do_all_reduce(void* buf, int64_t n, DType t, ReduceOp op) override {
    std::vector<char> h = to_host(buf, bytes(n, t));
    host_->all_reduce(h.data(), n, t, op);
    to_device(buf, h);
  }
  void do_all_gather(void* out, const void* in, int64_t n, DType t) override {
    std::vector<char> h_in = to_host(in, bytes(n, t)), h_out(bytes(size() * n, t));
    host_->all_gather(h_out.data(), h_in.data(), n, t);
    to_device(out, h_out);
  }
  void do_reduce_scatter(void* out, const void* in, int64_t n, DType t) override {
    std::vector<char> h_in = to_host(in, bytes(size() * n, t)), h_out(bytes(n, t));
    host_->reduce_scatter(h_out.data(), h_in.data(), n, t);
    to_device(out, h_out);
  }
  void do_broadcast(void* buf, int64_t n, DType t, int root) override {
    std::vector<char> h = to_host(buf, bytes(n, t));
    host_->broadcast(h.data(), n, t, root);
    to_device(buf, h);
  }
  void do_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                       const std::vector<int64_t>& recv_counts, DType t) override {
    std::vector<char> h_send = to_host(send, bytes(all_to_all_offsets(send_counts).back(), t));
    std::vector<char> h_recv(bytes(all_to_all_offsets(recv_counts).back(), t));
    host_->all_to_all_v(h_send.data(), send_counts, h_recv.data(), recv_counts, t);
    to_device(recv, h_recv);
  }

 private:
  static size_t bytes(int64_t n, DType t) { return size_t(std::max<int64_t>(n, 0)) * size_t(dtype_bytes(t)); }
  static std::vector<char> to_host(const void* dev, size_t n_bytes) {
    std::vector<char> h(n_bytes);
    if (n_bytes == 0) return h;
    const cudaStream_t s = cuda::compute_stream();
    TPT_CUDA_CHECK(cudaMemcpyAsync(h.data(), dev, n_bytes, cudaMemcpyDefault, s));
    cuda::stream_wait(s);
    return h;
  }
  static void to_device(void* dev, const std::vector<char>& h) {
    if (h.empty()) return;
    const cudaStream_t s = cuda::compute_stream();
    TPT_CUDA_CHECK(cudaMemcpyAsync(dev, h.data(), h.size(), cudaMemcpyDefault, s));
    cuda::stream_wait(s);  // h goes away on return
  }

  std::unique_ptr<Comm> host_;
};
#endif

}  // namespace

void run_thread_ranks(const GridShape& shape, bool device_groups, const std::function<void(Grid&)>& body) {
  TPT_CHECK(shape.tp >= 1 && shape.cp >= 1 && shape.pp >= 1 && shape.dp >= 1);
#ifndef TPTRAIN_HAVE_CUDA
  if (device_groups) internal_error("threads as ranks on a GPU: this tptrain was built without CUDA");
#endif
  const int world = shape.world();
  Abort abort;
  std::vector<std::unique_ptr<Grid>> grids;
  std::vector<std::vector<GroupSplit>> splits;  // [rank][group], the same groups on every rank
  for (int r = 0; r < world; ++r) {
    auto g = std::make_unique<Grid>();
    place_in_grid(*g, shape, r);
    g->local_rank = r;
    g->local_size = world;
    g->host = "thread " + std::to_string(r);
    grids.push_back(std::move(g));
    splits.push_back(grid_group_splits(shape, r));
  }
  // Each group as MPI_Comm_split makes it: the members of a color ordered by (key, world rank).
  // Device twins are groups of their own (a rendezvous apart from the host group's).
  auto add_groups = [&](size_t kind, bool device) {
    std::map<int, std::vector<std::pair<int, int>>> members;  // color -> (key, world rank)
    for (int r = 0; r < world; ++r) {
      const GroupSplit& s = splits[size_t(r)][kind];
      if (s.color >= 0) members[s.color].push_back({s.key, r});
    }
    for (auto& [color, m] : members) {
      std::sort(m.begin(), m.end());
      const auto group = std::make_shared<Group>(int(m.size()), abort);
      for (int rank = 0; rank < int(m.size()); ++rank) {
        Grid& g = *grids[size_t(m[size_t(rank)].second)];
        std::unique_ptr<Comm> c = std::make_unique<ThreadComm>(group, rank);
        const GroupSplit& s = splits[size_t(g.world_rank)][kind];
#ifdef TPTRAIN_HAVE_CUDA
        if (device) c = std::make_unique<StagedDeviceComm>(std::move(c));
#endif
        g.*(device ? s.device : s.host) = std::move(c);
      }
    }
  };
  const size_t kinds = splits[0].size();
  for (size_t k = 0; k < kinds; ++k) add_groups(k, false);
  if (device_groups)
    for (size_t k = 0; k < kinds; ++k)
      if (splits[0][k].device) add_groups(k, true);

  std::mutex failure_mutex;
  std::string failure;  // the first failure, "rank R: what"
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        body(*grids[size_t(r)]);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!abort.set.exchange(true)) failure = "rank " + std::to_string(r) + ": " + e.what();
      }
    });
  for (auto& t : threads) t.join();
  if (abort.set) internal_error(failure);
}

}  // namespace tpt
