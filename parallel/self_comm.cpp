// The groups of one rank (parallel/comm.h GroupOfOneComm) and SelfComm, the host one.
#include <cstring>
#include <string>

#include "core/error.h"
#include "parallel/comm.h"

namespace tpt {

void GroupOfOneComm::exchange(const std::vector<Message>& messages) {
  if (!messages.empty()) internal_error("send/recv within a group of one rank");
}

void GroupOfOneComm::do_all_gather(void* out, const void* in, int64_t n, DType t) { copy_block(out, in, n, t); }

void GroupOfOneComm::do_reduce_scatter(void* out, const void* in, int64_t n, DType t) { copy_block(out, in, n, t); }

void GroupOfOneComm::do_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                     const std::vector<int64_t>& recv_counts, DType t) {
  if (recv_counts[0] != send_counts[0])
    internal_error("all_to_all_v in a group of one rank: " + std::to_string(send_counts[0]) + " elements sent, " +
                   std::to_string(recv_counts[0]) + " expected");
  copy_block(recv, send, send_counts[0], t);
}

void GroupOfOneComm::copy_block(void* out, const void* in, int64_t n, DType t) {
  if (out != in && n > 0) copy(out, in, size_t(n) * size_t(dtype_bytes(t)));
}

namespace {

class SelfComm final : public GroupOfOneComm {
 public:
  void barrier() override {}

 protected:
  void copy(void* out, const void* in, size_t bytes) override {
    if (bytes > 0) std::memcpy(out, in, bytes);  // n = 0 may come with null buffers
  }
};

}  // namespace

std::unique_ptr<Comm> make_self_comm() { return std::make_unique<SelfComm>(); }

}  // namespace tpt
