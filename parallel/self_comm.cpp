#include <cstring>
#include <string>

#include "core/error.h"
#include "parallel/comm.h"

namespace tpt {
namespace {

class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void exchange(const std::vector<Message>& m) override {
    if (!m.empty()) internal_error("send/recv within a group of one rank");
  }
  void barrier() override {}

 protected:
  void do_all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void do_all_gather(void* out, const void* in, int64_t n, DType t) override { copy(out, in, n, t); }
  void do_reduce_scatter(void* out, const void* in, int64_t n, DType t) override { copy(out, in, n, t); }
  void do_broadcast(void*, int64_t, DType, int) override {}
  void do_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                       const std::vector<int64_t>& recv_counts, DType t) override {
    if (recv_counts[0] != send_counts[0])
      internal_error("all_to_all_v in a group of one rank: " + std::to_string(send_counts[0]) + " elements sent, " +
                     std::to_string(recv_counts[0]) + " expected");
    copy(recv, send, send_counts[0], t);
  }

 private:
  static void copy(void* out, const void* in, int64_t n, DType t) {
    if (out != in && n > 0) std::memcpy(out, in, size_t(n) * size_t(dtype_bytes(t)));
  }
};

}  // namespace

std::unique_ptr<Comm> make_self_comm() { return std::make_unique<SelfComm>(); }

}  // namespace tpt
