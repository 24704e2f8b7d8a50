#include "parallel/profiled_comm.h"

namespace tpt {
namespace {

class ProfiledComm final : public Comm {
 public:
  ProfiledComm(Comm& inner, OpProfile& profile, std::string group)
      : in_(inner), prof_(profile), group_(std::move(group)) {}
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  void exchange(const std::vector<Message>& m) override {
    timed("send/recv (with waiting)", bytes(m), [&] { in_.exchange(m); });
  }
  void barrier() override {
    timed("barrier", 0, [&] { in_.barrier(); });
  }
  void wait(int64_t ticket) override {
    timed("wait (started)", 0, [&] { in_.wait(ticket); });
  }
  void wait_all() override {
    timed("wait (all started)", 0, [&] { in_.wait_all(); });
  }

 protected:
  void do_all_reduce(void* buf, int64_t n, DType t, ReduceOp op) override {
    timed("all_reduce", payload(n, t), [&] { in_.all_reduce(buf, n, t, op); });
  }
  void do_all_gather(void* out, const void* in, int64_t n, DType t) override {
    timed("all_gather", payload(n, t) * size(), [&] { in_.all_gather(out, in, n, t); });
  }
  void do_reduce_scatter(void* out, const void* in, int64_t n, DType t) override {
    timed("reduce_scatter", payload(n, t) * size(), [&] { in_.reduce_scatter(out, in, n, t); });
  }
  void do_broadcast(void* buf, int64_t n, DType t, int root) override {
    timed("broadcast", payload(n, t), [&] { in_.broadcast(buf, n, t, root); });
  }
  // payload: the bytes this rank sends
  void do_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                       const std::vector<int64_t>& recv_counts, DType t) override {
    timed("all_to_all_v", payload(all_to_all_offsets(send_counts).back(), t),
          [&] { in_.all_to_all_v(send, send_counts, recv, recv_counts, t); });
  }
  int64_t do_start_exchange(const std::vector<Message>& m) override {
    int64_t ticket = -1;
    timed("start send/recv", bytes(m), [&] { ticket = in_.start_exchange(m); });
    return ticket;
  }
  int64_t do_start_all_reduce(void* buf, int64_t n, DType t) override {
    int64_t ticket = -1;
    timed("start all_reduce (bucket)", payload(n, t), [&] { ticket = in_.start_all_reduce(buf, n, t); });
    return ticket;
  }
  int64_t do_start_reduce_scatter(void* out, const void* in, int64_t n, DType t) override {
    int64_t ticket = -1;
    timed("start reduce_scatter (bucket)", payload(n, t) * size(),
          [&] { ticket = in_.start_reduce_scatter(out, in, n, t); });
    return ticket;
  }
  int64_t do_start_all_gather(void* out, const void* in, int64_t n, DType t) override {
    int64_t ticket = -1;
    timed("start all_gather (bucket)", payload(n, t) * size(), [&] { ticket = in_.start_all_gather(out, in, n, t); });
    return ticket;
  }

 private:
  static double payload(int64_t n, DType t) { return double(n) * dtype_bytes(t); }
  static double bytes(const std::vector<Message>& m) {
    double b = 0;
    for (const Message& x : m) b += payload(x.n, x.t);
    return b;
  }
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
