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

// Started collectives of a group member that run at the wait (ThreadComm, StagedDeviceComm), in
// start order; a ticket's wait runs it and every earlier one.
class Deferred {
 public:
  struct Op {
    float* out;
    const float* in;
    int64_t n;
    int kind;  // 0 all_reduce (in place), 1 reduce_scatter, 2 all_gather
    int64_t ticket = 0;
  };
  int64_t add(Op op) {
    op.ticket = next_++;
    ops_.push_back(op);
    return op.ticket;
  }
  void run(Comm& c, int64_t ticket) {
    while (!ops_.empty() && ops_.front().ticket <= ticket) {
      const Op op = ops_.front();
      ops_.pop_front();
      if (op.kind == 0) c.all_reduce(op.out, op.n, ReduceOp::Sum);
      else if (op.kind == 1) c.reduce_scatter(op.out, op.in, op.n);
      else c.all_gather(op.out, op.in, op.n);
    }
  }

 private:
  std::deque<Op> ops_;
  int64_t next_ = 0;
};

// A member of a group on host buffers.
class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  void all_reduce(float* buf, int64_t n, ReduceOp op) override { reduce(buf, n, op); }
  void all_reduce(double* buf, int64_t n, ReduceOp op) override { reduce(buf, n, op); }
  void all_gather(float* out, const float* in, int64_t n) override {
    collective(in, out, size() * n, [&](float* result) {
      for (int r = 0; r < size(); ++r) std::copy_n(g_->published<float>(r), n, result + int64_t(r) * n);
    });
  }
  void reduce_scatter(float* out, const float* in, int64_t n) override {
    collective(in, out, n, [&](float* result) {
      std::copy_n(g_->published<float>(0) + int64_t(rank_) * n, n, result);
      for (int r = 1; r < size(); ++r) {
        const float* x = g_->published<float>(r) + int64_t(rank_) * n;
        for (int64_t i = 0; i < n; ++i) result[i] += x[i];
      }
    });
  }
  void broadcast(float* buf, int64_t n, int root) override {
    collective(buf, buf, n, [&](float* result) { std::copy_n(g_->published<float>(root), n, result); });
  }
  // Sends first (posting never blocks), then each receive in turn.
  void exchange(const std::vector<Message>& messages) override {
    for (const Message& m : messages)
      if (m.send && m.n > 0) {
        std::vector<char> bytes(size_t(m.n) * sizeof(float));
        std::memcpy(bytes.data(), m.buf, bytes.size());
        g_->post(rank_, m.peer, m.tag, std::move(bytes));
      }
    for (const Message& m : messages)
      if (!m.send && m.n > 0) {
        const std::vector<char> bytes = g_->take(m.peer, rank_, m.tag);
        if (bytes.size() != size_t(m.n) * sizeof(float))
          internal_error("send/recv: rank " + std::to_string(rank_) + " expected " + std::to_string(m.n) +
                         " words from rank " + std::to_string(m.peer) + ", which sent " +
                         std::to_string(bytes.size() / sizeof(float)));
        std::memcpy(m.buf, bytes.data(), bytes.size());
      }
  }
  void barrier() override { g_->arrive(); }
  // Deferred to the wait: the collective reads its buffer as late as an asynchronous one may, so a
  // bucket written after its start gives a wrong result (what a race checker looks for).
  int64_t start_all_reduce(float* buf, int64_t n) override { return deferred_.add({buf, buf, n, 0}); }
  int64_t start_reduce_scatter(float* out, const float* in, int64_t n) override { return deferred_.add({out, in, n, 1}); }
  int64_t start_all_gather(float* out, const float* in, int64_t n) override { return deferred_.add({out, in, n, 2}); }
  void wait(int64_t ticket) override { deferred_.run(*this, ticket); }
  void wait_all() override { deferred_.run(*this, INT64_MAX); }

 private:
  template <class T>
  void reduce(T* buf, int64_t n, ReduceOp op) {
    collective(buf, buf, n, [&](T* result) {
      std::copy_n(g_->published<T>(0), n, result);
      for (int r = 1; r < size(); ++r) {
        const T* x = g_->published<T>(r);
        for (int64_t i = 0; i < n; ++i) result[i] = op == ReduceOp::Sum ? result[i] + x[i] : std::max(result[i], x[i]);
      }
    });
  }
  // publish `in`, compute this member's result from everyone's, wait until all have read, write it
  template <class T, class F>
  void collective(const T* in, T* out, int64_t out_n, F compute) {
    g_->publish(rank_, in);
    g_->arrive();
    std::vector<T> result(size_t(std::max<int64_t>(out_n, 0)));
    compute(result.data());
    g_->arrive();
    std::copy(result.begin(), result.end(), out);
  }

  std::shared_ptr<Group> g_;
  int rank_;
  Deferred deferred_;
};

#ifdef TPTRAIN_HAVE_CUDA
// A member of a group on device buffers: copies them to the host on the calling thread's compute
// stream (after its queued kernels), runs the host member's collective, copies the result back.
class StagedDeviceComm final : public Comm {
 public:
  explicit StagedDeviceComm(std::unique_ptr<Comm> host) : host_(std::move(host)) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  void all_reduce(float* buf, int64_t n, ReduceOp op) override { reduce(buf, n, op); }
  void all_reduce(double* buf, int64_t n, ReduceOp op) override { reduce(buf, n, op); }
  void all_gather(float* out, const float* in, int64_t n) override {
    std::vector<float> h_in = to_host(in, n), h_out(size_t(size()) * size_t(n));
    host_->all_gather(h_out.data(), h_in.data(), n);
    to_device(out, h_out);
  }
  void reduce_scatter(float* out, const float* in, int64_t n) override {
    std::vector<float> h_in = to_host(in, size() * n), h_out(static_cast<size_t>(n));
    host_->reduce_scatter(h_out.data(), h_in.data(), n);
    to_device(out, h_out);
  }
  void broadcast(float* buf, int64_t n, int root) override {
    std::vector<float> h = to_host(buf, n);
    host_->broadcast(h.data(), n, root);
    to_device(buf, h);
  }
  void exchange(const std::vector<Message>& messages) override {
    std::vector<std::vector<float>> host(messages.size());
    std::vector<Message> staged = messages;
    for (size_t i = 0; i < messages.size(); ++i) {
      host[i] = messages[i].send ? to_host(messages[i].buf, messages[i].n)
                                 : std::vector<float>(size_t(std::max<int64_t>(messages[i].n, 0)));
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
  // Deferred, as ThreadComm's: the buffers are read at the wait, in stream order there.
  int64_t start_all_reduce(float* buf, int64_t n) override { return deferred_.add({buf, buf, n, 0}); }
  int64_t start_reduce_scatter(float* out, const float* in, int64_t n) override { return deferred_.add({out, in, n, 1}); }
  int64_t start_all_gather(float* out, const float* in, int64_t n) override { return deferred_.add({out, in, n, 2}); }
  void wait(int64_t ticket) override { deferred_.run(*this, ticket); }
  void wait_all() override { deferred_.run(*this, INT64_MAX); }

 private:
  template <class T>
  void reduce(T* buf, int64_t n, ReduceOp op) {
    std::vector<T> h = to_host(buf, n);
    host_->all_reduce(h.data(), n, op);
    to_device(buf, h);
  }
  template <class T>
  static std::vector<T> to_host(const T* dev, int64_t n) {
    std::vector<T> h(size_t(std::max<int64_t>(n, 0)));
    if (n <= 0) return h;
    const cudaStream_t s = cuda::compute_stream();
    TPT_CUDA_CHECK(cudaMemcpyAsync(h.data(), dev, h.size() * sizeof(T), cudaMemcpyDefault, s));
    cuda::stream_wait(s);
    return h;
  }
  template <class T>
  static void to_device(T* dev, const std::vector<T>& h) {
    if (h.empty()) return;
    const cudaStream_t s = cuda::compute_stream();
    TPT_CUDA_CHECK(cudaMemcpyAsync(dev, h.data(), h.size() * sizeof(T), cudaMemcpyDefault, s));
    cuda::stream_wait(s);  // h goes away on return
  }

  std::unique_ptr<Comm> host_;
  Deferred deferred_;
};
#endif

// The groups of one kind over the world: every rank's color (its group) and key (its order in it).
struct Partition {
  std::map<int, std::vector<int>> members;  // color -> world ranks ordered by key
  std::map<int, std::shared_ptr<Group>> groups;
};

}  // namespace

void run_thread_ranks(int tp, int pp, int dp, bool device_groups, const std::function<void(Grid&)>& body) {
  TPT_CHECK(tp >= 1 && pp >= 1 && dp >= 1);
#ifndef TPTRAIN_HAVE_CUDA
  if (device_groups) internal_error("threads as ranks on a GPU: this tptrain was built without CUDA");
#endif
  const int world = tp * pp * dp;
  Abort abort;
  std::vector<std::unique_ptr<Grid>> grids;
  for (int r = 0; r < world; ++r) {
    auto g = std::make_unique<Grid>();
    g->world_size = world;
    g->world_rank = r;
    g->tp = tp, g->pp = pp, g->dp = dp;
    g->tp_rank = r % tp;
    g->dp_rank = (r / tp) % dp;
    g->pp_rank = r / (tp * dp);
    g->local_rank = r;
    g->local_size = world;
    g->host = "thread " + std::to_string(r);
    grids.push_back(std::move(g));
  }
  // color and key of each group kind, as make_grid's MPI_Comm_split (color < 0: not a member)
  using Key = std::function<std::pair<int, int>(const Grid&)>;
  auto add_groups = [&](const Key& key, std::unique_ptr<Comm> Grid::*field) {
    Partition part;
    for (auto& g : grids) {
      auto [color, order] = key(*g);
      if (color >= 0) part.members[color].push_back(order * world + g->world_rank);
    }
    for (auto& [color, m] : part.members) {
      std::sort(m.begin(), m.end());
      for (int& x : m) x %= world;
      part.groups[color] = std::make_shared<Group>(int(m.size()), abort);
    }
    for (auto& g : grids) {
      const int color = key(*g).first;
      if (color < 0) continue;
      const auto& m = part.members[color];
      const int rank = int(std::find(m.begin(), m.end(), g->world_rank) - m.begin());
      std::unique_ptr<Comm> c = std::make_unique<ThreadComm>(part.groups[color], rank);
#ifdef TPTRAIN_HAVE_CUDA
      const bool device = field == &Grid::tp_device || field == &Grid::pp_device || field == &Grid::dp_device ||
                          field == &Grid::embedding_device;
      if (device) c = std::make_unique<StagedDeviceComm>(std::move(c));
#endif
      (*g).*field = std::move(c);
    }
  };
  const Key world_key = [](const Grid& g) { return std::pair{0, g.world_rank}; };
  const Key tp_key = [](const Grid& g) { return std::pair{g.pp_rank * g.dp + g.dp_rank, g.tp_rank}; };
  const Key dp_key = [](const Grid& g) { return std::pair{g.pp_rank * g.tp + g.tp_rank, g.dp_rank}; };
  const Key pp_key = [](const Grid& g) { return std::pair{g.dp_rank * g.tp + g.tp_rank, g.pp_rank}; };
  const Key mp_key = [](const Grid& g) { return std::pair{g.dp_rank, g.pp_rank * g.tp + g.tp_rank}; };
  const Key embedding_key = [](const Grid& g) {
    const bool member = g.pp > 1 && (g.first_stage() || g.last_stage());
    return std::pair{member ? g.dp_rank * g.tp + g.tp_rank : -1, g.pp_rank};
  };
  add_groups(world_key, &Grid::world);
  add_groups(tp_key, &Grid::tp_group);
  add_groups(dp_key, &Grid::dp_group);
  add_groups(pp_key, &Grid::pp_group);
  add_groups(mp_key, &Grid::mp_group);
  add_groups(embedding_key, &Grid::embedding_group);
  if (device_groups) {
    add_groups(tp_key, &Grid::tp_device);
    add_groups(dp_key, &Grid::dp_device);
    add_groups(pp_key, &Grid::pp_device);
    add_groups(embedding_key, &Grid::embedding_device);
  }

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
