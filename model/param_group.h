// Parameter groups (docs/ARCHITECTURE.md "Parameter groups"): which ranks hold copies of a
// parameter tensor, as data on each ParamInfo, and what follows from it for the rank's buffers.
//
// Two facts describe a tensor's copies:
//   - its replica group: the data-parallel ranks that hold the same tensor and average its
//     gradient (with the distributed optimizer each owns a block of it): the dense group, DP x CP,
//     or for the expert weights of an MoE layer (h.<l>.mlp.experts.*) the expert-data-parallel
//     group EDP (parallel/grid.h), laid out after the stage's dense tensors.
//   - its copies inside one model replica: none (sharded over TP, or on one stage only), one on
//     every TP rank (LayerNorms, position embedding, row-parallel biases), or the word embedding
//     tied to the LM head (a copy on the first and on the last stage).
// From them: GradSync (parallel/grad_sync.h) sums each replica group's gradients over its own
// communicator, in its own contiguous part of the buffer with its own buckets and shards; the
// gradient norm counts an element only on its primary copy; a checkpoint gets every element from
// exactly one rank (GradSync::unique_ranges of a primary copy).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "parallel/grad_sync.h"

namespace tpt {

class Comm;
struct ParamLayout;

// The data-parallel group a parameter's gradient is averaged over.
enum class ReplicaGroup : uint8_t {
  Dense,       // DP x CP (Grid::dp_cp): every tensor but the experts' (routers, shared experts included)
  ExpertData,  // EDP (Grid::device_edp): the expert weights, summed over EDP and scaled by 1 / (DP x CP)
               // like the dense ones -- each token's gradient reaches its experts' owners through the
               // all-to-all, so the EDP sum over 1 / (DP x CP) is the mean over the global batch
};
inline constexpr int kReplicaGroups = 2;

// The copies of a tensor inside one model replica (besides its replica group).
enum class ModelCopy : uint8_t {
  None,            // this rank's box is held by no other model-parallel rank
  TensorParallel,  // identical on every TP rank of the stage (with sequence parallelism its
                   // gradient is a partial sum, summed over TP: tp_replicated_ranges)
  TiedEmbedding,   // the word embedding tied to the LM head, on the first and the last stage
                   // (PP > 1): its gradient is summed over the embedding group
};

struct ParamGroup {
  ReplicaGroup replicas = ReplicaGroup::Dense;
  ModelCopy copy = ModelCopy::None;
  // This rank's copy is the one the gradient norm counts and a checkpoint saves: always with
  // ModelCopy::None, tp_rank 0's of a TP-replicated tensor, the first stage's word embedding.
  // The other copies hold the same values and gradients.
  bool primary = true;
  // TensorParallel only: each TP rank's gradient is a partial sum even without sequence parallelism
  // (the q/k norms of model.qk_layernorm: each rank normalises its own heads)
  bool partial_over_tp = false;
  // An FP8 parameter (training.fp8_param_gather, GPTDims::fp8_params): stored as FP8 codes only, one byte
  // per element, cast from the master weights and all-gathered as codes. The rank layout puts these after
  // every other tensor (model/chunks.h make_rank_layout), a span of their own (GradGroup::fp8).
  bool fp8 = false;
};

// The span of a rank's layout a tensor lies in, in layout order (model/chunks.h make_rank_layout): 0 the
// dense tensors, 1 the experts', 2 the dense FP8 parameters, 3 the experts' FP8 parameters.
inline int layout_span(const ParamGroup& g) { return (g.fp8 ? 2 : 0) + (g.replicas == ReplicaGroup::ExpertData ? 1 : 0); }

// How one replica group's gradients are summed: over `comm` (null or one rank: no sum), the sum
// multiplied by `scale` (1 / (DP x CP) for both groups: the mean over the global batch).
struct ReplicaComm {
  Comm* comm = nullptr;
  float scale = 1.0f;
};

// GradSync's groups for a rank's layout: one per replica group that has tensors in it (in
// ReplicaGroup order), spanning from its first tensor to its last (tensor alignment included),
// padded with the distributed optimizer to a multiple of kShardAlign x its ranks
// (GradSync::buffer_size); its part of each of the rank's transformer layers `layers` (global
// indices, ascending) is the hull of its tensors named h.<layer>. (n = 0 where it has none).
// replica_comm(g): the communicator and scale of group g. InternalError when two groups' tensors
// interleave or a padded span runs into the next group's tensors.
std::vector<GradGroup> make_grad_groups(const ParamLayout& layout, const std::vector<int64_t>& layers,
                                        bool distributed_optimizer,
                                        const std::function<ReplicaComm(ReplicaGroup)>& replica_comm);
// Elements of the parameter / gradient buffers for those groups: the end of the last span (at
// least layout.total).
int64_t grad_buffer_size(const ParamLayout& layout, const std::vector<GradGroup>& groups);

// The ranges of the TP-replicated tensors (ModelCopy::TensorParallel) whose gradients are partial sums
// over TP -- with sequence parallelism all of them (each rank's tokens), else those partial_over_tp
// (each rank's heads) -- consecutive ones merged (the alignment padding between them is zero): what
// GradSync sums over TP (GradSyncOptions::tp_sum).
std::vector<GradRange> tp_replicated_ranges(const ParamLayout& layout, bool sequence_parallel = true);

// The tied word embedding's range on this rank (ModelCopy::TiedEmbedding; n = 0 if it holds none):
// what GradSync sums over the embedding group.
GradRange tied_embedding_range(const ParamLayout& layout);

}  // namespace tpt
