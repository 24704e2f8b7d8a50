#include "parallel/grad_sync.h"

#include <algorithm>

#include "core/error.h"

namespace tpt {

namespace {
int64_t round_up(int64_t x, int64_t u) { return (x + u - 1) / u * u; }
int64_t round_down(int64_t x, int64_t u) { return x / u * u; }
}  // namespace

GradSync::GradSync(Ops& ops, float* grads, int64_t total, std::vector<GradRange> layers, Comm* dp, Comm* embedding,
                   GradRange word_embedding, GradSyncOptions options)
    : ops_(ops),
      grads_(grads),
      total_(total),
      layers_(std::move(layers)),
      dp_(dp && dp->size() > 1 ? dp : nullptr),
      embedding_(embedding),
      word_embedding_(word_embedding),
      overlap_(options.overlap && dp_ != nullptr),
      distributed_(options.distributed_optimizer && dp_ != nullptr),
      overlap_param_gather_(options.overlap_param_gather && distributed_),
      tp_(options.tp && options.tp->size() > 1 ? options.tp : nullptr),
      tp_sum_(std::move(options.tp_sum)) {
  TPT_CHECK(options.bucket_size >= 1);
  const int64_t unit = distributed_ ? kShardAlign * dp_->size() : 1;
  TPT_CHECK(total % unit == 0);
  for (size_t i = 1; i < layers_.size(); ++i) TPT_CHECK(layers_[i].offset >= layers_[i - 1].offset + layers_[i - 1].n);
  if (overlap_ && !layers_.empty()) {
    // Buckets of whole layers, last layer first (backward's order); a bucket spans from its lowest
    // layer's start to its highest layer's end (alignment padding between tensors included). With
    // the distributed optimizer the boundaries move to multiples of `unit`: a bucket's start up
    // (the few elements below it go to the bucket started later) and the top layer's end down.
    int64_t covered_end = round_down(layers_.back().offset + layers_.back().n, unit), elems = 0;
    const int64_t top = covered_end;
    for (int i = int(layers_.size()); i-- > 0;) {
      elems += layers_[size_t(i)].n;
      if (elems >= options.bucket_size || i == 0) {
        const int64_t begin = std::min(round_up(layers_[size_t(i)].offset, unit), covered_end);
        if (begin < covered_end) buckets_.push_back({{begin, covered_end - begin}, i});
        covered_end = begin;
        elems = 0;
      }
    }
    if (covered_end > 0) buckets_.push_back({{0, covered_end}, -1});
    if (top < total) buckets_.push_back({{top, total - top}, -1});
  } else {
    buckets_.push_back({{0, total}, -1});
  }
  // What this rank's optimizer owns: everything, or its block of each bucket (in offset order).
  if (distributed_) {
    std::vector<GradRange> ranges;
    for (const Bucket& b : buckets_) ranges.push_back(b.range);
    std::sort(ranges.begin(), ranges.end(), [](const GradRange& a, const GradRange& b) { return a.offset < b.offset; });
    for (const GradRange& r : ranges) {
      const int64_t block = r.n / dp_->size();
      owned_.push_back({r.offset + dp_->rank() * block, block, owned_size_});
      owned_size_ += block;
    }
  } else {
    owned_.push_back({0, total, 0});
    owned_size_ = total;
  }
}

void GradSync::start(Bucket& b) {
  if (b.started) return;
  if (distributed_) {
    const int64_t block = b.range.n / dp_->size();
    float* in = grads_ + b.range.offset;
    dp_->start_reduce_scatter(in + dp_->rank() * block, in, block);
  } else {
    dp_->start_all_reduce(grads_ + b.range.offset, b.range.n);
  }
  b.started = true;
}

void GradSync::layer_done(int i) {
  if (!overlap_) return;
  for (Bucket& b : buckets_)
    if (b.first_layer == i) start(b);
}

void GradSync::finish() {
  // distributed optimizer: the tied embedding's sum comes first, as the first and the last stage
  // own different blocks of it
  const bool embedding_first = distributed_;
  if (embedding_ && embedding_first)
    embedding_->all_reduce(grads_ + word_embedding_.offset, word_embedding_.n, ReduceOp::Sum);
  if (dp_) {
    if (overlap_ || distributed_) {
      for (Bucket& b : buckets_) start(b);  // backward order, as on every DP peer
      dp_->wait_all();
      for (Bucket& b : buckets_) b.started = false;
    } else {
      dp_->all_reduce(grads_, total_, ReduceOp::Sum);
    }
    for (const ShardRange& r : owned_) ops_.scale(grads_ + r.offset, 1.0f / float(dp_->size()), r.n);
  }
  if (embedding_ && !embedding_first)
    embedding_->all_reduce(grads_ + word_embedding_.offset, word_embedding_.n, ReduceOp::Sum);
  sum_over_tp();
}

void GradSync::sum_over_tp() {
  if (!tp_) return;
  for (const GradRange& t : tp_sum_)
    for (const ShardRange& r : owned_) {
      const int64_t lo = std::max(t.offset, r.offset), hi = std::min(t.offset + t.n, r.offset + r.n);
      if (lo < hi) tp_->all_reduce(grads_ + lo, hi - lo, ReduceOp::Sum);
    }
}

void GradSync::start_param_gather(Buf params) {
  if (!distributed_) return;
  std::vector<Bucket*> order;  // forward order: ascending offsets
  for (Bucket& b : buckets_) order.push_back(&b);
  std::sort(order.begin(), order.end(), [](const Bucket* a, const Bucket* b) { return a->range.offset < b->range.offset; });
  for (Bucket* b : order) {
    const int64_t block = b->range.n / dp_->size();
    auto* out = reinterpret_cast<float*>(static_cast<char*>(params.p) + dtype_size(b->range.offset, params.t));
    const int64_t words = dtype_size(block, params.t) / 4;  // block is a multiple of kShardAlign
    b->param_ticket = dp_->start_all_gather(out, out + dp_->rank() * words, words);
  }
  if (overlap_param_gather_) params_pending_ = true;
  else dp_->wait_all();
}

void GradSync::wait_params(int i) {
  if (!params_pending_) return;
  if (i >= int(layers_.size()) || layers_.empty()) {
    dp_->wait_all();
    params_pending_ = false;
    return;
  }
  const int64_t end = i < 0 ? layers_.front().offset : layers_[size_t(i)].offset + layers_[size_t(i)].n;
  int64_t ticket = -1;  // the last-started bucket holding any element below `end`
  for (const Bucket& b : buckets_)
    if (b.range.offset < end) ticket = std::max(ticket, b.param_ticket);
  if (ticket >= 0) dp_->wait(ticket);
}

}  // namespace tpt
