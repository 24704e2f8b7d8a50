#include "parallel/profiled_comm.h"

namespace tpt {
namespace {

class ProfiledComm final : public Comm {
 public:
  ProfiledComm(Comm& inner, OpProfile& profile, std::string group)
      : in_(inner), prof_(profile), group_(std::move(group)) {}
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  void all_reduce(float* buf, int64_t n, ReduceOp op) override {
    timed("all_reduce", 4.0 * double(n), [&] { in_.all_reduce(buf, n, op); });
  }
  void all_reduce(double* buf, int64_t n, ReduceOp op) override {
    timed("all_reduce", 8.0 * double(n), [&] { in_.all_reduce(buf, n, op); });
  }
  void all_gather(float* out, const float* in, int64_t n) override {
    timed("all_gather", 4.0 * double(n) * size(), [&] { in_.all_gather(out, in, n); });
  }
  void reduce_scatter(float* out, const float* in, int64_t n) override {
    timed("reduce_scatter", 4.0 * double(n) * size(), [&] { in_.reduce_scatter(out, in, n); });
  }
  void broadcast(float* buf, int64_t n, int root) override {
    timed("broadcast", 4.0 * double(n), [&] { in_.broadcast(buf, n, root); });
  }
  void exchange(const std::vector<Message>& m) override {
    double words = 0;
    for (const Message& x : m) words += double(x.n);
    timed("send/recv (with waiting)", 4.0 * words, [&] { in_.exchange(m); });
  }
  void barrier() override {
    timed("barrier", 0, [&] { in_.barrier(); });
  }
  int64_t start_all_reduce(float* buf, int64_t n) override {
    int64_t t = -1;
    timed("start all_reduce (bucket)", 4.0 * double(n), [&] { t = in_.start_all_reduce(buf, n); });
    return t;
  }
  int64_t start_reduce_scatter(float* out, const float* in, int64_t n) override {
    int64_t t = -1;
    timed("start reduce_scatter (bucket)", 4.0 * double(n) * size(), [&] { t = in_.start_reduce_scatter(out, in, n); });
    return t;
  }
  int64_t start_all_gather(float* out, const float* in, int64_t n) override {
    int64_t t = -1;
    timed("start all_gather (bucket)", 4.0 * double(n) * size(), [&] { t = in_.start_all_gather(out, in, n); });
    return t;
  }
  void wait(int64_t ticket) override {
    timed("wait (bucket)", 0, [&] { in_.wait(ticket); });
  }
  void wait_all() override {
    timed("wait (all buckets)", 0, [&] { in_.wait_all(); });
  }

 private:
  template <class F>
  void timed(const char* what, double bytes, F&& f) {
    const int64_t m0 = prof_.begin();
    f();
    prof_.end(m0, group_ + " " + what, 0, bytes);
  }
  Comm& in_;
  OpProfile& prof_;
  std::string group_;
};

}  // namespace

std::unique_ptr<Comm> make_profiled_comm(Comm& inner, OpProfile& profile, std::string group) {
  return std::make_unique<ProfiledComm>(inner, profile, std::move(group));
}

}  // namespace tpt
