// The CP ring of parallel/context_parallel.h. Step s of a rank r holds the K/V block of rank
// (r - s) mod CP: step 0 its own (the diagonal, causal within), then the blocks of the ranks before
// it. Which queries see which keys follows from the chunks' global positions (RingBlock::visible):
// a block from a lower rank is seen whole by both local chunks' queries except the part of its
// second chunk, which lies after them; from a higher rank only by the second local chunk.
#include "parallel/context_parallel.h"


#include "core/error.h"

namespace tpt {

int64_t RingAttention::buffer_bytes(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType t) {
  const int64_t kv = B * T * 2 * KV * D;
  return 2 * dtype_size(kv, t) + 3 * 4 * kv + 4 * B * T * H * D;
}

RingAttention::RingAttention(Ops& ops, Comm& cp, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType t)
    : ops_(ops), cp_(cp), B_(B), T_(T), H_(H), KV_(KV), D_(D), t_(t) {
  TPT_CHECK(T % 2 == 0 && H % KV == 0);
  const int64_t kv = B * T * 2 * KV * D;
  for (int i = 0; i < 2; ++i) kv_[i] = ops.alloc(kv, t);
  for (int i = 0; i < 2; ++i) dkv_[i] = ops.alloc(size_t(kv));
  dloc_ = ops.alloc(size_t(kv));
  acc_ = ops.alloc(size_t(B * T * H * D));
}

RingAttention::~RingAttention() {
  for (int i = 0; i < 2; ++i) ops_.free(kv_[i].p), ops_.free(dkv_[i]);
  ops_.free(dloc_);
  ops_.free(acc_);
}

RingBlock RingAttention::block(int step) const {
  const int P = cp_.size(), r = cp_.rank();
  RingBlock b = cp_local_block(T_ / 2, P, r);
  const int src = ((r - step) % P + P) % P;
  b.k_chunks[0] = src;
  b.k_chunks[1] = 2 * P - 1 - src;
  return b;
}

int64_t RingAttention::pass(int from, bool grads) {
  const int P = cp_.size(), r = cp_.rank(), next = (r + 1) % P, prev = (r + P - 1) % P;
  const int64_t n = B_ * T_ * 2 * KV_ * D_;
  // tags: 0 the K/V blocks, 1 their gradients
  if (grads) return cp_.start_exchange({{true, dkv_[from], n, next, 1}, {false, dkv_[1 - from], n, prev, 1}});
  return cp_.start_exchange({{true, kv_[from].p, words_of(n, t_), next, 0},
                             {false, kv_[1 - from].p, words_of(n, t_), prev, 0}});
}

// Step s computes with K/V buffer cur while the next block arrives in the other (started before the
// step's attention, waited for after it): the compute reads kv_[cur], the messages read kv_[cur] and
// write kv_[1 - cur], which no step-s work touches.
void RingAttention::forward(Buf out, float* lse, CBuf qkv) {
  const int P = cp_.size();
  const int64_t N = B_ * T_, row = (H_ + 2 * KV_) * D_, kvw = 2 * KV_ * D_;
  ops_.copy_rows(kv_[0], kvw, qkv + H_ * D_, row, N, kvw);  // this rank's K/V block
  int cur = 0;
  for (int s = 0; s < P; ++s) {
    const bool more = s + 1 < P;
    const int64_t arriving = more ? pass(cur, false) : -1;
    RingBlock b = block(s);
    b.first = s == 0;  // the diagonal: every query sees itself, out and lse are written
    ops_.attention_block_forward(acc_, lse, qkv, kv_[cur], B_, T_, H_, KV_, D_, b);
    if (more) {
      cp_.wait(arriving);
      cur = 1 - cur;
    }
  }
  ops_.convert(out, acc_, N * H_ * D_);
}

// As forward, the next K/V block arrives during the step's attention. The gradients: step 0's
// (the own block) go straight into a buffer that is then sent on; from step 1 on the step's
// contributions go into dloc_ while the partial sums of the same block, sent by rank r - 1 after its
// previous step, arrive; then they are added (partial + this rank's) and sent on, overlapping the next
// step. After the last step the own block's complete gradient arrives from r - 1.
void RingAttention::backward(Buf dqkv, CBuf dout, CBuf qkv, CBuf out, const float* lse) {
  const int P = cp_.size();
  const int64_t N = B_ * T_, row = (H_ + 2 * KV_) * D_, kvw = 2 * KV_ * D_;
  ops_.copy_rows(kv_[0], kvw, qkv + H_ * D_, row, N, kvw);
  ops_.zero(acc_, N * H_ * D_);
  ops_.zero(dkv_[0], N * kvw);
  int cur = 0, dcur = 0;  // the K/V block in use; the gradient buffer last sent on
  int64_t grads = -1;     // that send's (and the next one's receive) ticket
  for (int s = 0; s < P; ++s) {
    const bool more = s + 1 < P;
    const int64_t arriving = more ? pass(cur, false) : -1;
    if (s > 0) ops_.zero(dloc_, N * kvw);
    ops_.attention_block_backward(acc_, s == 0 ? dkv_[0] : dloc_, dout, out, lse, qkv, kv_[cur], B_, T_, H_, KV_, D_,
                                  block(s));
    if (P == 1) break;
    if (s > 0) {  // the block's partial sums from r - 1, plus this rank's
      cp_.wait(grads);
      dcur = 1 - dcur;
      ops_.accumulate(dkv_[dcur], dloc_, N * kvw);
    }
    grads = pass(dcur, true);
    if (more) {
      cp_.wait(arriving);
      cur = 1 - cur;
    }
  }
  if (P > 1) {
    cp_.wait(grads);
    dcur = 1 - dcur;
  }
  ops_.copy_rows(dqkv, row, acc_, H_ * D_, N, H_ * D_);
  ops_.copy_rows(dqkv + H_ * D_, row, dkv_[dcur], kvw, N, kvw);
}

}  // namespace tpt
