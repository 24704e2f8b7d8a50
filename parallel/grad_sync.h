// Data-parallel synchronisation of one stage's gradient buffer (docs/ARCHITECTURE.md "One
// iteration"), Megatron's DDP with its distributed optimizer:
//
//   without the distributed optimizer: the gradient buffer summed over the DP group (all-reduce)
//     and divided by DP, then the tied word embedding's gradient summed over the embedding group
//     (first and last stage);
//   with it (parallel.distributed_optimizer): the tied word embedding summed first, then every
//     bucket reduce-scattered over DP: this DP rank keeps the sum of its contiguous 1/DP block of
//     each bucket (owned()), where the optimizer keeps fp32 master weights and Adam moments and
//     steps; after the step each bucket's updated parameters are all-gathered (start_param_gather),
//     per bucket before the forward needs it with parallel.overlap_param_gather.
//
// Buckets: with parallel.overlap_grad_reduce the transformer layers' gradients go in buckets of at
// least parallel.ddp_bucket_size elements, each started (non-blocking; on GPUs a separate stream)
// as soon as the last micro-batch's backward has finished its layers, while backward goes on with
// the earlier layers; what no layer bucket covers (embeddings, final LayerNorm) is reduced at
// finish(). Without overlap, one bucket: the whole buffer. With the distributed optimizer every
// bucket boundary is a multiple of kShardAlign * DP elements (rounded towards the layers that
// finish later, so a started bucket never holds an unfinished gradient) and the buffer is padded
// to one (buffer_size()).
//
// With sequence parallelism the gradients of TP-replicated tensors (LayerNorms, row-parallel
// biases, position embedding) are partial sums over this TP rank's tokens: finish() sums them over
// the TP group (on the owned blocks) after the DP reduction.
#pragma once
#include <cstdint>
#include <vector>

#include "core/ops.h"
#include "parallel/comm.h"

namespace tpt {

struct GradRange {
  int64_t offset = 0, n = 0;  // elements of the gradient buffer
};

// Part of the buffer this DP rank owns: elements [offset, offset + n) of the parameter / gradient
// buffer, stored at [local, local + n) of the rank's optimizer shard (master weights, moments).
struct ShardRange {
  int64_t offset = 0, n = 0, local = 0;
};

// Alignment of the distributed optimizer's blocks, in elements (even: 16-bit parameters are
// all-gathered as 4-byte words; 64 elements keep every block 128-byte aligned).
inline constexpr int64_t kShardAlign = 64;

struct GradSyncOptions {
  bool overlap = false;               // parallel.overlap_grad_reduce
  int64_t bucket_size = 40000000;     // parallel.ddp_bucket_size
  bool distributed_optimizer = false;
  bool overlap_param_gather = false;  // parallel.overlap_param_gather (distributed optimizer only)
  Comm* tp = nullptr;                 // sequence parallel: the TP group, and the ranges summed over it
  std::vector<GradRange> tp_sum = {};
};

class GradSync {
 public:
  // Elements of the parameter / gradient buffers for a layout of `total` elements: total, padded
  // to a multiple of kShardAlign * dp with the distributed optimizer.
  static int64_t buffer_size(int64_t total, int dp, bool distributed_optimizer) {
    const int64_t unit = kShardAlign * dp;
    return distributed_optimizer && dp > 1 ? (total + unit - 1) / unit * unit : total;
  }

  // grads: buffer_size(...) floats. layers: the range of each of this stage's transformer layers
  // in grads (first layer first, ascending and disjoint). dp: the DP group (null or size 1: no
  // sum); embedding: the embedding group (null when this stage holds no tied copy) and
  // word_embedding the tied tensor's range.
  GradSync(Ops& ops, float* grads, int64_t total, std::vector<GradRange> layers, Comm* dp, Comm* embedding,
           GradRange word_embedding, GradSyncOptions options);

  // Backward of the last micro-batch has finished layer `i` (index into layers): starts the bucket
  // it completes, if any. Layers finish last first.
  void layer_done(int i);
  // After backward: starts whatever has not started, waits for all, scales by 1/DP; the word
  // embedding's sum over the embedding group; sequence parallel: the TP sums. Afterwards the
  // owned() ranges of grads hold the gradients of the whole batch.
  void finish();

  // What this DP rank's optimizer updates: the whole buffer, or its block of each bucket.
  const std::vector<ShardRange>& owned() const { return owned_; }
  int64_t owned_size() const { return owned_size_; }

  // After the optimizer step (distributed optimizer): every DP rank's owned ranges of `params` (a
  // buffer of this layout in its own dtype) to all DP ranks, bucket by bucket in forward order.
  // Blocking unless overlap_param_gather; then wait_params(layer) waits for what a layer needs.
  void start_param_gather(Buf params);
  // Before the forward of layer `i` (index into layers; -1: what comes before the first layer,
  // layers.size(): everything) on the first micro-batch: the buckets holding its parameters.
  void wait_params(int i);

  int num_buckets() const { return int(buckets_.size()); }
  bool overlapping() const { return overlap_; }
  bool distributed() const { return distributed_; }
  bool overlapping_param_gather() const { return overlap_param_gather_; }

 private:
  struct Bucket {
    GradRange range;
    int first_layer = -1;  // the bucket is final once this layer (its lowest) is done; -1: at finish()
    bool started = false;
    int64_t param_ticket = -1;  // its parameter all-gather (overlap_param_gather)
  };
  void start(Bucket& b);
  void sum_over_tp();

  Ops& ops_;
  float* grads_;
  int64_t total_;
  std::vector<GradRange> layers_;
  Comm* dp_;
  Comm* embedding_;
  GradRange word_embedding_;
  bool overlap_, distributed_, overlap_param_gather_;
  Comm* tp_;
  std::vector<GradRange> tp_sum_;
  std::vector<Bucket> buckets_;  // backward order: the last layers' bucket first, then the rest
  std::vector<ShardRange> owned_;  // ascending offsets
  int64_t owned_size_ = 0;
  bool params_pending_ = false;
};

}  // namespace tpt
