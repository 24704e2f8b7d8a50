#include "parallel/grad_sync.h"

#include "core/error.h"

namespace tpt {

GradSync::GradSync(Ops& ops, float* grads, int64_t total, std::vector<GradRange> layers, Comm* dp, Comm* embedding,
                   GradRange word_embedding, bool overlap, int64_t bucket_size)
    : ops_(ops),
      grads_(grads),
      total_(total),
      dp_(dp && dp->size() > 1 ? dp : nullptr),
      embedding_(embedding),
      word_embedding_(word_embedding),
      overlap_(overlap && dp_ != nullptr) {
  TPT_CHECK(bucket_size >= 1);
  if (!overlap_) return;
  for (size_t i = 1; i < layers.size(); ++i) TPT_CHECK(layers[i].offset >= layers[i - 1].offset + layers[i - 1].n);
  // Buckets of whole layers, last layer first (backward's order); a bucket spans from its lowest
  // layer's start to its highest layer's end (alignment padding between tensors included).
  int64_t covered_end = layers.empty() ? 0 : layers.back().offset + layers.back().n, elems = 0;
  for (int i = int(layers.size()); i-- > 0;) {
    elems += layers[size_t(i)].n;
    if (elems >= bucket_size || i == 0) {
      const int64_t begin = layers[size_t(i)].offset;
      buckets_.push_back({{begin, covered_end - begin}, i, false});
      covered_end = begin;
      elems = 0;
    }
  }
  if (layers.empty()) {
    rest_.push_back({0, total});
  } else {
    const int64_t lo = layers.front().offset, hi = layers.back().offset + layers.back().n;
    if (lo > 0) rest_.push_back({0, lo});
    if (hi < total) rest_.push_back({hi, total - hi});
  }
}

void GradSync::start(Bucket& b) {
  if (b.started) return;
  dp_->start_all_reduce(grads_ + b.range.offset, b.range.n);
  b.started = true;
}

void GradSync::layer_done(int i) {
  if (!overlap_) return;
  for (Bucket& b : buckets_)
    if (b.first_layer == i) start(b);
}

void GradSync::finish() {
  if (dp_) {
    if (overlap_) {
      for (Bucket& b : buckets_) start(b);  // backward order, as on every DP peer
      for (const GradRange& r : rest_) dp_->start_all_reduce(grads_ + r.offset, r.n);
      dp_->finish_all_reduces();
      for (Bucket& b : buckets_) b.started = false;
    } else {
      dp_->all_reduce(grads_, total_, ReduceOp::Sum);
    }
    ops_.scale(grads_, 1.0f / float(dp_->size()), total_);
  }
  if (embedding_) embedding_->all_reduce(grads_ + word_embedding_.offset, word_embedding_.n, ReduceOp::Sum);
}

}  // namespace tpt
