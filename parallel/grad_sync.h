// Data-parallel synchronisation of one stage's gradient buffer (docs/ARCHITECTURE.md "One
// iteration", "Parameter groups"), Megatron's DDP with its distributed optimizer, per replica group:
// the buffer holds one contiguous span per group (GradGroup: the dense weights, averaged over
// DP x CP; later expert weights, over expert-DP), each with its own communicator, scale, buckets
// and shards:
//
//   without the distributed optimizer: each group's span summed over its group (all-reduce) and
//     multiplied by its scale, then the tied word embedding's gradient summed over the embedding
//     group (first and last stage);
//   with it (parallel.distributed_optimizer): the tied word embedding summed first, then every
//     bucket reduce-scattered over its group: this rank keeps the sum of its contiguous 1/size
//     block of each bucket (owned()), where the optimizer keeps fp32 master weights and Adam
//     moments and steps; after the step each bucket's updated parameters are all-gathered
//     (start_param_gather), per bucket before the forward needs it with
//     parallel.overlap_param_gather.
//
// Buckets (per group): with parallel.overlap_grad_reduce the transformer layers' gradients go in
// buckets of at least parallel.ddp_bucket_size elements, each started (non-blocking; on GPUs a
// separate stream) as soon as the last micro-batch's backward has finished its layers, while
// backward goes on with the earlier layers; what no layer bucket covers (embeddings, final
// LayerNorm) is reduced at finish(). Without overlap, one bucket: the group's span. With the
// distributed optimizer every bucket boundary is a multiple of kShardAlign * size elements from
// the span's start (rounded towards the layers that finish later, so a started bucket never holds
// an unfinished gradient) and the span is padded to one (buffer_size()).
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

// One replica group's part of the buffer (model/param_group.h make_grad_groups).
struct GradGroup {
  Comm* comm = nullptr;  // its replicas (null or one rank: nothing to sum, the rank owns the span)
  float scale = 1.0f;    // multiplies the sum (the dense group: 1 / (DP x CP))
  // Its contiguous part of the buffer: offset a multiple of kShardAlign; with the distributed
  // optimizer n a multiple of kShardAlign * comm->size() (buffer_size). Groups ascending, disjoint.
  GradRange span;
  // Its part of each of the stage's transformer layers (first layer first, ascending, disjoint,
  // inside span; every group lists every layer, n = 0 where the layer has none of its tensors).
  std::vector<GradRange> layers;
  // FP8 parameters (model/param_group.h ParamGroup::fp8): the parameters of the span are FP8 codes, a byte
  // each, all-gathered by start_code_gather (not start_param_gather)
  bool fp8 = false;
};

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
  // Elements of the parameter / gradient buffers for a layout of `total` elements (or of one
  // group's span): total, padded to a multiple of kShardAlign * dp with the distributed optimizer.
  static int64_t buffer_size(int64_t total, int dp, bool distributed_optimizer) {
    const int64_t unit = kShardAlign * dp;
    return distributed_optimizer && dp > 1 ? (total + unit - 1) / unit * unit : total;
  }

  // grads: the buffer the groups' spans lie in (fp32, or bf16 with parallel.grad_reduce_in_bf16: then
  // summed in bf16 as Megatron's NCCL does, parallel/comm.h). embedding: the embedding group (null when this
  // stage holds no tied copy) and word_embedding the tied tensor's range (inside one group's span).
  GradSync(Ops& ops, Buf grads, std::vector<GradGroup> groups, Comm* embedding, GradRange word_embedding,
           GradSyncOptions options);
  // One group, the dense one: grads of buffer_size(...) elements, all of it averaged over dp (null or
  // size 1: no sum); layers: the range of each of this stage's transformer layers in grads.
  GradSync(Ops& ops, Buf grads, int64_t total, std::vector<GradRange> layers, Comm* dp, Comm* embedding,
           GradRange word_embedding, GradSyncOptions options);

  // Backward of the last micro-batch has finished layer `i` (index into layers): starts the bucket
  // it completes, if any. Layers finish last first.
  void layer_done(int i);
  // After backward: starts whatever has not started, waits for all, scales by 1/DP; the word
  // embedding's sum over the embedding group; sequence parallel: the TP sums. Afterwards the
  // owned() ranges of grads hold the gradients of the whole batch.
  void finish();

  // What this rank's optimizer updates: each group's whole span, or (distributed optimizer) its
  // block of each of the group's buckets; ascending offsets, group by group.
  const std::vector<ShardRange>& owned() const { return owned_; }
  int64_t owned_size() const { return owned_size_; }
  // The parts of the buffer this rank answers for among its groups' replicas -- the one replica
  // that counts them in the gradient norm and writes them to a checkpoint: its owned blocks
  // (distributed optimizer), else the span of each group in which it is rank 0. Each element of a
  // group is in exactly one replica's unique_ranges. A subset of owned(), ascending.
  std::vector<GradRange> unique_ranges() const;

  // After the optimizer step (distributed optimizer): every rank's owned ranges of `params` (a
  // buffer of this layout in its own dtype) to all ranks of its group, group by group, bucket by
  // bucket in forward order.
  // Blocking unless overlap_param_gather; then wait_params(layer) waits for what a layer needs.
  // Not the FP8 parameters' groups: start_code_gather gathers those, from `codes`, the span of the
  // first such group (code_span()) a byte per element.
  void start_param_gather(Buf params);
  void start_code_gather(uint8_t* codes);
  GradRange code_span() const;  // the FP8 parameters' groups' spans, first to last ({} if none)
  // Before the forward of layer `i` (index into layers; -1: what comes before the first layer,
  // layers.size(): everything) on the first micro-batch: the buckets holding its parameters, in
  // every group.
  void wait_params(int i);

  int num_buckets() const;  // over all groups
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
  struct Group {
    Comm* comm = nullptr;  // null: nothing to sum (no comm, or one rank)
    float scale = 1.0f;
    GradRange span;
    std::vector<GradRange> layers;
    bool distributed = false;      // reduce-scattered into owned blocks (the distributed optimizer)
    bool fp8 = false;              // its parameters are FP8 codes (GradGroup::fp8)
    std::vector<Bucket> buckets;   // backward order: the last layers' bucket first, then the rest
    std::vector<ShardRange> owned;  // ascending offsets
  };
  void make_buckets(Group& g, bool overlap, int64_t bucket_size);
  void start(Group& g, Bucket& b);
  // the distributed groups' (fp8 or not) blocks of the parameters at `base` (element `first` of the
  // buffer there), element_bytes each
  void gather(bool fp8, char* base, int64_t first, int64_t element_bytes);
  void sum_over_tp();

  Ops& ops_;
  Buf grads_;
  std::vector<Group> groups_;  // ascending spans
  int num_layers_ = 0;
  Comm* embedding_;
  GradRange word_embedding_;
  bool overlap_, distributed_, overlap_param_gather_;
  Comm* tp_;
  std::vector<GradRange> tp_sum_;
  std::vector<ShardRange> owned_;  // every group's, ascending offsets
  int64_t owned_size_ = 0;
  bool params_pending_ = false;
};

}  // namespace tpt
