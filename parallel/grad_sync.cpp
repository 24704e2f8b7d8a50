#include "parallel/grad_sync.h"

#include <algorithm>

#include "core/error.h"

namespace tpt {

namespace {
int64_t round_up(int64_t x, int64_t u) { return (x + u - 1) / u * u; }
int64_t round_down(int64_t x, int64_t u) { return x / u * u; }
}  // namespace

GradSync::GradSync(Ops& ops, Buf grads, int64_t total, std::vector<GradRange> layers, Comm* dp, Comm* embedding,
                   GradRange word_embedding, GradSyncOptions options)
    : GradSync(ops, grads,
               {GradGroup{dp, dp && dp->size() > 1 ? 1.0f / float(dp->size()) : 1.0f, {0, total}, std::move(layers)}},
               embedding, word_embedding, std::move(options)) {}

GradSync::GradSync(Ops& ops, Buf grads, std::vector<GradGroup> groups, Comm* embedding, GradRange word_embedding,
                   GradSyncOptions options)
    : ops_(ops),
      grads_(grads),
      embedding_(embedding),
      word_embedding_(word_embedding),
      overlap_(false),
      distributed_(false),
      overlap_param_gather_(false),
      tp_(options.tp && options.tp->size() > 1 ? options.tp : nullptr),
      tp_sum_(std::move(options.tp_sum)) {
  TPT_CHECK(options.bucket_size >= 1 && !groups.empty());
  num_layers_ = int(groups.front().layers.size());
  for (GradGroup& in : groups) {
    Group g;
    g.comm = in.comm && in.comm->size() > 1 ? in.comm : nullptr;
    g.scale = in.scale;
    g.span = in.span;
    g.layers = std::move(in.layers);
    g.fp8 = in.fp8;
    g.distributed = options.distributed_optimizer && g.comm != nullptr;
    const int64_t unit = g.distributed ? kShardAlign * g.comm->size() : 1;
    TPT_CHECK(g.span.offset % kShardAlign == 0 && g.span.n % unit == 0 && int(g.layers.size()) == num_layers_);
    TPT_CHECK(groups_.empty() || g.span.offset >= groups_.back().span.offset + groups_.back().span.n);
    for (size_t i = 0; i < g.layers.size(); ++i) {
      const GradRange& l = g.layers[i];
      TPT_CHECK(l.offset >= (i ? g.layers[i - 1].offset + g.layers[i - 1].n : g.span.offset) &&
                l.offset + l.n <= g.span.offset + g.span.n);
    }
    overlap_ = overlap_ || (options.overlap && g.comm);
    distributed_ = distributed_ || g.distributed;
    make_buckets(g, options.overlap, options.bucket_size);
    // What this rank's optimizer owns of the group: all of it, or its block of each bucket (in
    // offset order).
    if (g.distributed) {
      std::vector<GradRange> ranges;
      for (const Bucket& b : g.buckets) ranges.push_back(b.range);
      std::sort(ranges.begin(), ranges.end(), [](const GradRange& a, const GradRange& b) { return a.offset < b.offset; });
      for (const GradRange& r : ranges) {
        const int64_t block = r.n / g.comm->size();
        g.owned.push_back({r.offset + g.comm->rank() * block, block, owned_size_});
        owned_size_ += block;
      }
    } else {
      g.owned.push_back({g.span.offset, g.span.n, owned_size_});
      owned_size_ += g.span.n;
    }
    owned_.insert(owned_.end(), g.owned.begin(), g.owned.end());
    groups_.push_back(std::move(g));
  }
  overlap_param_gather_ = options.overlap_param_gather && distributed_;
}

void GradSync::make_buckets(Group& g, bool overlap, int64_t bucket_size) {
  const int64_t base = g.span.offset, end = g.span.offset + g.span.n;
  if (!overlap || !g.comm || g.layers.empty()) {
    g.buckets.push_back({g.span, -1});
    return;
  }
  // Buckets of whole layers, last layer first (backward's order); a bucket spans from its lowest
  // layer's start to its highest layer's end (alignment padding between tensors included). With
  // the distributed optimizer the boundaries move to multiples of `unit` from the span's start: a
  // bucket's start up (the few elements below it go to the bucket started later) and the top
  // layer's end down.
  const int64_t unit = g.distributed ? kShardAlign * g.comm->size() : 1;
  auto up = [&](int64_t x) { return base + round_up(x - base, unit); };
  auto down = [&](int64_t x) { return base + round_down(x - base, unit); };
  int64_t covered_end = down(g.layers.back().offset + g.layers.back().n), elems = 0;
  const int64_t top = covered_end;
  for (int i = int(g.layers.size()); i-- > 0;) {
    elems += g.layers[size_t(i)].n;
    if (elems >= bucket_size || i == 0) {
      const int64_t begin = std::min(up(g.layers[size_t(i)].offset), covered_end);
      if (begin < covered_end) g.buckets.push_back({{begin, covered_end - begin}, i});
      covered_end = begin;
      elems = 0;
    }
  }
  if (covered_end > base) g.buckets.push_back({{base, covered_end - base}, -1});
  if (top < end) g.buckets.push_back({{top, end - top}, -1});
}

int GradSync::num_buckets() const {
  int n = 0;
  for (const Group& g : groups_) n += int(g.buckets.size());
  return n;
}

std::vector<GradRange> GradSync::unique_ranges() const {
  std::vector<GradRange> out;
  for (const Group& g : groups_) {
    if (g.distributed)
      for (const ShardRange& r : g.owned) out.push_back({r.offset, r.n});
    else if (!g.comm || g.comm->rank() == 0)
      out.push_back(g.span);
  }
  return out;
}

void GradSync::start(Group& g, Bucket& b) {
  if (b.started) return;
  if (g.distributed) {
    const int64_t block = b.range.n / g.comm->size();
    const Buf in = grads_ + b.range.offset;
    g.comm->start_reduce_scatter((in + g.comm->rank() * block).p, in.p, block, grads_.t);
  } else {
    g.comm->start_all_reduce((grads_ + b.range.offset).p, b.range.n, grads_.t);
  }
  b.started = true;
}

void GradSync::layer_done(int i) {
  if (!overlap_) return;
  for (Group& g : groups_)
    if (g.comm)
      for (Bucket& b : g.buckets)
        if (b.first_layer == i) start(g, b);
}

void GradSync::finish() {
  // distributed optimizer: the tied embedding's sum comes first, as the first and the last stage
  // own different blocks of it
  bool embedding_first = false;
  for (const Group& g : groups_)
    if (word_embedding_.offset >= g.span.offset && word_embedding_.offset < g.span.offset + g.span.n)
      embedding_first = g.distributed;
  auto sum = [&](Comm& c, int64_t offset, int64_t n) { c.all_reduce((grads_ + offset).p, n, grads_.t, ReduceOp::Sum); };
  if (embedding_ && embedding_first) sum(*embedding_, word_embedding_.offset, word_embedding_.n);
  for (Group& g : groups_) {  // every group's collectives started before any is waited for
    if (!g.comm) continue;
    if (overlap_ || g.distributed) {
      for (Bucket& b : g.buckets) start(g, b);  // backward order, as on every peer
    } else {
      sum(*g.comm, g.span.offset, g.span.n);
    }
  }
  for (Group& g : groups_) {
    if (g.comm && (overlap_ || g.distributed)) {
      g.comm->wait_all();
      for (Bucket& b : g.buckets) b.started = false;
    }
    if (g.scale != 1.0f)
      for (const ShardRange& r : g.owned) ops_.scale(grads_ + r.offset, g.scale, r.n);
  }
  if (embedding_ && !embedding_first) sum(*embedding_, word_embedding_.offset, word_embedding_.n);
  sum_over_tp();
}

void GradSync::sum_over_tp() {
  if (!tp_) return;
  for (const GradRange& t : tp_sum_)
    for (const ShardRange& r : owned_) {
      const int64_t lo = std::max(t.offset, r.offset), hi = std::min(t.offset + t.n, r.offset + r.n);
      if (lo < hi) tp_->all_reduce((grads_ + lo).p, hi - lo, grads_.t, ReduceOp::Sum);
    }
}

void GradSync::start_param_gather(Buf params) {
  gather(false, static_cast<char*>(params.p), 0, dtype_size(1, params.t));
}

void GradSync::start_code_gather(uint8_t* codes) {
  gather(true, reinterpret_cast<char*>(codes), code_span().offset, 1);
}

GradRange GradSync::code_span() const {
  GradRange r;
  for (const Group& g : groups_)
    if (g.fp8) {
      if (r.n == 0) r.offset = g.span.offset;
      r.n = g.span.offset + g.span.n - r.offset;
    }
  return r;
}

void GradSync::gather(bool fp8, char* base, int64_t first, int64_t element_bytes) {
  if (!distributed_) return;
  bool started = false;
  for (Group& g : groups_) {
    if (!g.distributed || g.fp8 != fp8) continue;
    std::vector<Bucket*> order;  // forward order: ascending offsets
    for (Bucket& b : g.buckets) order.push_back(&b);
    std::sort(order.begin(), order.end(), [](const Bucket* a, const Bucket* b) { return a->range.offset < b->range.offset; });
    for (Bucket* b : order) {
      const int64_t block = b->range.n / g.comm->size();
      auto* out = reinterpret_cast<float*>(base + (b->range.offset - first) * element_bytes);
      const int64_t words = block * element_bytes / 4;  // block is a multiple of kShardAlign
      b->param_ticket = g.comm->start_all_gather(out, out + g.comm->rank() * words, words);
    }
    started = true;
  }
  if (!started) return;
  if (overlap_param_gather_) {
    params_pending_ = true;
  } else {
    for (Group& g : groups_)
      if (g.distributed && g.fp8 == fp8) g.comm->wait_all();
  }
}

void GradSync::wait_params(int i) {
  if (!params_pending_) return;
  if (i >= num_layers_ || num_layers_ == 0) {
    for (Group& g : groups_)
      if (g.distributed) {
        g.comm->wait_all();
        for (Bucket& b : g.buckets) b.param_ticket = -1;
      }
    params_pending_ = false;
    return;
  }
  for (Group& g : groups_) {
    if (!g.distributed) continue;
    const int64_t end = i < 0 ? g.layers.front().offset : g.layers[size_t(i)].offset + g.layers[size_t(i)].n;
    int64_t ticket = -1;  // the last-started bucket holding any element below `end`
    for (const Bucket& b : g.buckets)
      if (b.range.offset < end) ticket = std::max(ticket, b.param_ticket);
    if (ticket >= 0) g.comm->wait(ticket);
  }
}

}  // namespace tpt
