// Context parallelism (docs/ARCHITECTURE.md "Context parallelism"; Megatron's context_parallel_size
// with cp_comm_type p2p): the CP ranks of a group split every sequence of S tokens into 2 CP chunks
// of c = S / (2 CP); rank r holds chunks r and 2 CP - 1 - r (so every rank does the same causal
// work), T = 2c tokens, at their global positions. Everything but attention acts on a rank's tokens
// alone; attention is a ring: the K/V blocks (only the KV heads) travel round the CP group, each
// step's block merged into the output by its log-sum-exp, and in backward the blocks travel again
// with their dK/dV, which arrive back at their owner after the last step. Each step's K/V message
// is started before the step's attention and waited for after it (Comm::start_exchange: MPI's
// non-blocking messages, NCCL's communication stream), so the next block travels while the current
// one is computed; each block's gradient so far goes on (started) after the step, while the next step
// computes. It talks to the other
// ranks only through Comm, so CPU ranks (MpiComm) and GPUs (NcclComm) run the same code.
#pragma once
#include <cstdint>
#include <vector>

#include "core/ops.h"
#include "parallel/comm.h"

namespace tpt {

// The global chunk indices of CP rank r's two chunks.
inline RingBlock cp_local_block(int64_t c, int cp, int r) {
  RingBlock b;
  b.c = c;
  b.q_chunks[0] = b.k_chunks[0] = r;
  b.q_chunks[1] = b.k_chunks[1] = 2 * cp - 1 - r;
  return b;
}

// local (S / cp) = CP rank r's tokens of one sequence (S): its two chunks, in order.
template <typename T>
void cp_select(T* local, const T* seq, int64_t S, int cp, int r) {
  const int64_t c = S / (2 * cp);
  const int64_t first[2] = {r * c, (2 * cp - 1 - r) * c};
  for (int j = 0; j < 2; ++j)
    for (int64_t i = 0; i < c; ++i) local[j * c + i] = seq[first[j] + i];
}

// The ring of one stage: its buffers (allocated at construction, shared by every layer and
// micro-batch) and its forward and backward over micro-batches of B sequences of T local tokens.
class RingAttention {
 public:
  // cp: the CP group (device buffers on GPU runs); t: the compute dtype of qkv, out and the K/V
  // messages. H, KV: this TP rank's query and key/value heads, D the head dim.
  RingAttention(Ops& ops, Comm& cp, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType t);
  ~RingAttention();
  RingAttention(const RingAttention&) = delete;
  RingAttention& operator=(const RingAttention&) = delete;
  // What the constructor allocates: two K/V blocks (B, T, 2 KV D) in t (the one in use, the one
  // arriving), three fp32 gradient blocks (the one going on, the one arriving, the step's own
  // contributions), and one fp32 (B, T, H D) accumulator (forward's output, backward's dq).
  static int64_t buffer_bytes(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType t);
  // out (B, T, H D) in t, lse (B, H, T) fp32 of the causal attention of qkv (B, T, (H + 2 KV) D) over
  // the whole sequence of the CP group. Collective over the CP group.
  void forward(Buf out, float* lse, CBuf qkv);
  // dqkv (B, T, (H + 2 KV) D) from dout (B, T, H D) and forward's out and lse. Collective.
  void backward(Buf dqkv, CBuf dout, CBuf qkv, CBuf out, const float* lse);

 private:
  Ops& ops_;
  Comm& cp_;
  int64_t B_, T_, H_, KV_, D_;
  DType t_;
  Buf kv_[2];
  float* dkv_[2] = {nullptr, nullptr};
  float* dloc_ = nullptr;  // backward: a step's own dK/dV contributions (fp32)
  float* acc_ = nullptr;
  // the block of ring step s: the K/V chunks of rank (r - s) mod CP
  RingBlock block(int step) const;
  // starts sending buffer `from` of the K/V blocks (grads: of their gradients) to rank r + 1 and
  // receiving rank r - 1's into the other; returns the ticket for Comm::wait
  int64_t pass(int from, bool grads);
};

}  // namespace tpt
