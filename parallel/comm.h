// Communicator interface (docs/ARCHITECTURE.md "Backends and communicators"): one group of ranks and the collectives the trainer
// needs, typed by the element type of core/dtype.h. MpiComm works on host buffers; NcclComm
// (parallel/nccl_comm.h) implements the same interface on device buffers. A group of size 1
// (SelfComm) makes every collective a copy or a no-op.
//
// Element types: F32, F64, I32 and I64 move and reduce (Sum, Max). BF16 and F16 move (gather,
// broadcast, all-to-all, messages); F16 is never reduced, BF16 only summed, and only for the bf16
// gradient buffer (parallel.grad_reduce_in_bf16, Megatron's bf16 reduction through NCCL): each
// addition of two values in fp32, rounded to bf16 (nearest even), in the backend's order -- NCCL's
// ring, MPI's algorithm (a user op), the threads' rank order. So such a sum is not the same bits
// on every backend or group size; any other 16-bit reduction is an internal_error. Where a sum must
// be exact to one rounding, gather the values and sum in fp32, as the TP wire formats do
// (parallel/tensor_parallel.h).
//
// The typed collectives check their arguments here, once for every backend, then call the
// backend's do_* function; the float / double forms are thin wrappers of the typed ones.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tpt {

enum class ReduceOp { Sum, Max };

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // ---- collectives on n elements of type t ----
  void all_reduce(void* buf, int64_t n, DType t, ReduceOp op);
  // out (size * n) = concatenation of every rank's in (n), in rank order. in may be out + rank * n.
  void all_gather(void* out, const void* in, int64_t n, DType t);
  // in (size * n) summed over ranks; this rank keeps block `rank` in out (n). out may be in + rank * n.
  void reduce_scatter(void* out, const void* in, int64_t n, DType t);
  void broadcast(void* buf, int64_t n, DType t, int root);
  // All-to-all with a count per peer (MoE's token dispatch): this rank sends send_counts[p]
  // elements to peer p and receives recv_counts[p] from peer p (counts in elements, one per rank
  // of the group). The blocks lie back to back in rank order: peer p's in send starts at element
  // send_counts[0] + ... + send_counts[p - 1], and likewise in recv (the displacements are implied).
  // recv_counts[p] must be peer p's send_counts[rank] (all_to_all_counts gives them); send and recv
  // must not overlap. Zero counts are allowed anywhere.
  void all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                    const std::vector<int64_t>& recv_counts, DType t);
  // The counts exchange before an all_to_all_v: recv_counts[p] = peer p's send_counts[rank]. Both
  // hold size() int64s in this group's memory (host buffers for host groups, device buffers for
  // device groups); an all-to-all of one I64 per peer.
  void all_to_all_counts(const int64_t* send_counts, int64_t* recv_counts);

  // fp32 and fp64 forms (the trainer's tensors; losses, norms and flags)
  void all_reduce(float* buf, int64_t n, ReduceOp op) { all_reduce(buf, n, DType::F32, op); }
  void all_reduce(double* buf, int64_t n, ReduceOp op) { all_reduce(buf, n, DType::F64, op); }
  void all_gather(float* out, const float* in, int64_t n) { all_gather(out, in, n, DType::F32); }
  void reduce_scatter(float* out, const float* in, int64_t n) { reduce_scatter(out, in, n, DType::F32); }
  void broadcast(float* buf, int64_t n, int root) { broadcast(buf, n, DType::F32, root); }

  // One point-to-point message of an exchange: `n` elements of type t sent from / received into
  // `buf`, to / from `peer`; tag: which stream it belongs to (the pipeline's activations 0,
  // gradients 1).
  struct Message {
    bool send = false;
    void* buf = nullptr;
    int64_t n = 0;
    int peer = -1;
    int tag = 0;
    DType t = DType::F32;
  };
  // Posts every message at once (non-blocking underneath) and returns when all have completed.
  // Messages between two ranks pair up in posting order per tag (NCCL has no tags: there per peer,
  // which the pipeline's schedules respect -- parallel/schedule.h simulate checks it).
  virtual void exchange(const std::vector<Message>& messages) = 0;
  // A matched pair of fp32 messages: send to `send_peer`, receive from `recv_peer`; either may be
  // empty (n = 0).
  void send_recv(const float* send_buf, int64_t send_n, int send_peer, float* recv_buf, int64_t recv_n,
                 int recv_peer) {
    std::vector<Message> m;
    if (send_n > 0) m.push_back({true, const_cast<float*>(send_buf), send_n, send_peer, 0});
    if (recv_n > 0) m.push_back({false, recv_buf, recv_n, recv_peer, 0});
    exchange(m);
  }
  virtual void barrier() = 0;
  // A non-blocking exchange (the CP ring's next K/V block while the current one is computed): posts
  // the messages and returns a ticket that wait() completes, in one order with the start_*
  // collectives below (device groups: on the communication stream, after the compute stream's queued
  // work). Its buffers must not be touched until then. By default blocking (ticket -1).
  int64_t start_exchange(const std::vector<Message>& messages) { return do_start_exchange(messages); }

  // Non-blocking collectives (the DP gradient buckets; the distributed optimizer's parameter
  // buckets). start_* starts one and returns a ticket (device groups: on a communication stream,
  // after the work already queued on the compute stream); wait(ticket) returns when that one and
  // every one started before it on this group have completed (device groups: orders the compute
  // stream's later work after them); wait_all() waits for every started one. The buffers must not
  // be touched in between. By default blocking (ticket -1). In place: start_all_gather with in =
  // out + rank * n, start_reduce_scatter with out = in + rank * n. The reductions are sums.
  int64_t start_all_reduce(void* buf, int64_t n, DType t);
  int64_t start_reduce_scatter(void* out, const void* in, int64_t n, DType t);
  int64_t start_all_gather(void* out, const void* in, int64_t n, DType t);
  int64_t start_all_reduce(float* buf, int64_t n) { return start_all_reduce(buf, n, DType::F32); }
  int64_t start_reduce_scatter(float* out, const float* in, int64_t n) {
    return start_reduce_scatter(out, in, n, DType::F32);
  }
  int64_t start_all_gather(float* out, const float* in, int64_t n) { return start_all_gather(out, in, n, DType::F32); }
  virtual void wait(int64_t /*ticket*/) {}
  virtual void wait_all() {}

 protected:
  // What a backend implements, with checked arguments: a reduction is not of F16, of BF16 only a Sum; an
  // all-to-all's counts are one per rank, none negative.
  virtual void do_all_reduce(void* buf, int64_t n, DType t, ReduceOp op) = 0;
  virtual void do_all_gather(void* out, const void* in, int64_t n, DType t) = 0;
  virtual void do_reduce_scatter(void* out, const void* in, int64_t n, DType t) = 0;
  virtual void do_broadcast(void* buf, int64_t n, DType t, int root) = 0;
  virtual void do_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                               const std::vector<int64_t>& recv_counts, DType t) = 0;
  virtual int64_t do_start_exchange(const std::vector<Message>& messages) {
    exchange(messages);
    return -1;
  }
  virtual int64_t do_start_all_reduce(void* buf, int64_t n, DType t) {
    do_all_reduce(buf, n, t, ReduceOp::Sum);
    return -1;
  }
  virtual int64_t do_start_reduce_scatter(void* out, const void* in, int64_t n, DType t) {
    do_reduce_scatter(out, in, n, t);
    return -1;
  }
  virtual int64_t do_start_all_gather(void* out, const void* in, int64_t n, DType t) {
    do_all_gather(out, in, n, t);
    return -1;
  }
};

// Where each peer's block starts in an all_to_all_v buffer: offsets[p] = counts[0] + ... +
// counts[p - 1], for p = 0 .. counts.size() (the last one: the whole buffer's length), in elements.
std::vector<int64_t> all_to_all_offsets(const std::vector<int64_t>& counts);

// For the backends: the point-to-point messages of an all_to_all_v without the own block (which the
// caller copies), receives first, in pieces of at most max_count elements, each with tag `tag`.
std::vector<Comm::Message> all_to_all_messages(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                               const std::vector<int64_t>& recv_counts, DType t, int rank,
                                               int64_t max_count, int tag);

// The base of the groups of one rank, on host (make_self_comm) or device buffers
// (make_device_self_comm): a reduction or broadcast leaves the buffer as it is; a gather, a
// reduce-scatter and an all-to-all copy their one block with copy(), unless in place.
class GroupOfOneComm : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void exchange(const std::vector<Message>& messages) override;  // an error unless empty

 protected:
  virtual void copy(void* out, const void* in, size_t bytes) = 0;
  void do_all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void do_all_gather(void* out, const void* in, int64_t n, DType t) override;
  void do_reduce_scatter(void* out, const void* in, int64_t n, DType t) override;
  void do_broadcast(void*, int64_t, DType, int) override {}
  void do_all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                       const std::vector<int64_t>& recv_counts, DType t) override;

 private:
  void copy_block(void* out, const void* in, int64_t n, DType t);
};

// The group of one rank.
std::unique_ptr<Comm> make_self_comm();

}  // namespace tpt
