// Data-parallel gradient synchronisation: the gradient buffer summed over the DP group and divided
// by DP, then the tied word embedding's gradient summed over the embedding group (first and last
// stage). With overlap (parallel.overlap_grad_reduce), the transformer layers' gradients go in
// buckets of at least parallel.ddp_bucket_size elements, each started (non-blocking; on GPUs a
// separate stream) as soon as the last micro-batch's backward has finished its layers, while
// backward goes on with the earlier layers; finish() sums the rest and waits.
#pragma once
#include <cstdint>
#include <vector>

#include "core/ops.h"
#include "parallel/comm.h"

namespace tpt {

struct GradRange {
  int64_t offset = 0, n = 0;  // elements of the gradient buffer
};

class GradSync {
 public:
  // layers: the range of each of this stage's transformer layers in grads (first layer first,
  // ascending and disjoint). dp: the DP group (null or size 1: no sum); embedding: the embedding
  // group (null when this stage holds no tied copy) and word_embedding the tied tensor's range.
  GradSync(Ops& ops, float* grads, int64_t total, std::vector<GradRange> layers, Comm* dp, Comm* embedding,
           GradRange word_embedding, bool overlap, int64_t bucket_size);

  // Backward of the last micro-batch has finished layer `i` (index into layers): starts the bucket
  // it completes, if any. Layers finish last first.
  void layer_done(int i);
  // After backward: starts whatever has not started, waits for all, scales by 1/DP, then sums the
  // word embedding over the embedding group.
  void finish();

  int num_buckets() const { return int(buckets_.size()); }
  bool overlapping() const { return overlap_; }

 private:
  struct Bucket {
    GradRange range;
    int first_layer = 0;  // the bucket is final once this layer (its lowest) is done
    bool started = false;
  };
  void start(Bucket& b);

  Ops& ops_;
  float* grads_;
  int64_t total_;
  Comm* dp_;
  Comm* embedding_;
  GradRange word_embedding_;
  bool overlap_;
  std::vector<Bucket> buckets_;  // backward order: the last layers' bucket first
  std::vector<GradRange> rest_;  // what no bucket covers (embeddings, final LayerNorm)
};

}  // namespace tpt
