#include <algorithm>

#include "core/error.h"
#include "parallel/comm.h"

namespace tpt {
namespace {

class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(float*, int64_t, ReduceOp) override {}
  void all_reduce(double*, int64_t, ReduceOp) override {}
  void all_gather(float* out, const float* in, int64_t n) override {
    if (out != in) std::copy(in, in + n, out);
  }
  void reduce_scatter(float* out, const float* in, int64_t n) override {
    if (out != in) std::copy(in, in + n, out);
  }
  void broadcast(float*, int64_t, int) override {}
  void exchange(const std::vector<Message>& m) override {
    if (!m.empty()) internal_error("send/recv within a group of one rank");
  }
  void barrier() override {}
};

}  // namespace

std::unique_ptr<Comm> make_self_comm() { return std::make_unique<SelfComm>(); }

}  // namespace tpt
