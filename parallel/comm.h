// Communicator interface (docs/ARCHITECTURE.md "Backends and communicators"): one group of ranks and the collectives the trainer
// needs. MpiComm works on host buffers; NcclComm (parallel/nccl_comm.h) implements the same interface on
// device buffers. A group of size 1 (SelfComm) makes every collective a copy or a no-op.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tpt {

enum class ReduceOp { Sum, Max };

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_reduce(float* buf, int64_t n, ReduceOp op) = 0;
  virtual void all_reduce(double* buf, int64_t n, ReduceOp op) = 0;
  // out (size * n) = concatenation of every rank's in (n), in rank order. in may be out + rank * n.
  virtual void all_gather(float* out, const float* in, int64_t n) = 0;
  // in (size * n) summed over ranks; this rank keeps block `rank` in out (n). out may be in + rank * n.
  virtual void reduce_scatter(float* out, const float* in, int64_t n) = 0;
  virtual void broadcast(float* buf, int64_t n, int root) = 0;
  // One point-to-point message of an exchange: `n` floats sent from / received into `buf`, to / from
  // `peer`; tag: which stream it belongs to (the pipeline's activations 0, gradients 1).
  struct Message {
    bool send = false;
    float* buf = nullptr;
    int64_t n = 0;
    int peer = -1;
    int tag = 0;
  };
  // Posts every message at once (non-blocking underneath) and returns when all have completed.
  // Messages between two ranks pair up in posting order per tag (NCCL has no tags: there per peer,
  // which the pipeline's schedules respect -- parallel/schedule.h simulate checks it).
  virtual void exchange(const std::vector<Message>& messages) = 0;
  // A matched pair: send to `send_peer`, receive from `recv_peer`; either may be empty (n = 0).
  void send_recv(const float* send_buf, int64_t send_n, int send_peer, float* recv_buf, int64_t recv_n,
                 int recv_peer) {
    std::vector<Message> m;
    if (send_n > 0) m.push_back({true, const_cast<float*>(send_buf), send_n, send_peer, 0});
    if (recv_n > 0) m.push_back({false, recv_buf, recv_n, recv_peer, 0});
    exchange(m);
  }
  virtual void barrier() = 0;

  // Non-blocking collectives (the DP gradient buckets; the distributed optimizer's parameter
  // buckets). start_* starts one and returns a ticket (device groups: on a communication stream,
  // after the work already queued on the compute stream); wait(ticket) returns when that one and
  // every one started before it on this group have completed (device groups: orders the compute
  // stream's later work after them); wait_all() waits for every started one. The buffers must not
  // be touched in between. By default blocking (ticket -1). In place: start_all_gather with in =
  // out + rank * n, start_reduce_scatter with out = in + rank * n.
  virtual int64_t start_all_reduce(float* buf, int64_t n) {
    all_reduce(buf, n, ReduceOp::Sum);
    return -1;
  }
  virtual int64_t start_reduce_scatter(float* out, const float* in, int64_t n) {
    reduce_scatter(out, in, n);
    return -1;
  }
  virtual int64_t start_all_gather(float* out, const float* in, int64_t n) {
    all_gather(out, in, n);
    return -1;
  }
  virtual void wait(int64_t /*ticket*/) {}
  virtual void wait_all() {}
};

// The group of one rank.
std::unique_ptr<Comm> make_self_comm();

}  // namespace tpt
