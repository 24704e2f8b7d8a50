// A pipeline rank's model chunks (docs/ARCHITECTURE.md "Pipeline parallelism (PP)"). With the
// interleaved 1F1B schedule (parallel.virtual_pipeline_model_parallel_size v > 1) the model is cut
// into PP * v virtual stages of num_layers / (PP * v) layers; the rank of stage s holds virtual
// stages s, s + PP, ..., s + (v - 1) PP as its local chunks 0 .. v - 1. A chunk is a GPTStage of its
// virtual stage: its GPTDims are make_dims of PP * v stages, so the first stage's chunk 0 has the
// embeddings and the last stage's chunk v - 1 the final LayerNorm and the LM head. Without
// interleaving the rank has one chunk, its stage. Layers keep their global index, so checkpoints
// name the same tensors whatever the chunking.
#pragma once
#include <cstdint>
#include <vector>

#include "model/gpt.h"

namespace tpt {

// parallel.virtual_pipeline_model_parallel_size, null = 1.
int model_chunks(const Config& cfg);
// The dims of each of the rank's chunks, chunk 0 first.
std::vector<GPTDims> make_chunk_dims(const Config& cfg, int tp, int tp_rank, int pp, int pp_rank);
// The rank's parameter layout: its chunks' layouts one after the other, chunk 0 first (so the
// layers lie in ascending global order, as the DP gradient buckets need).
ParamLayout make_rank_layout(const std::vector<GPTDims>& chunks, int64_t group_align = kShardAlign);
// Where make_rank_layout starts a replica group (the MoE experts' after the dense tensors): a
// multiple of kShardAlign, times the dense group's ranks with the distributed optimizer, so that the
// dense span's padding to whole shards (parallel/grad_sync.h buffer_size) ends before it (with FP8
// parameters after an MoE model's experts: times the least common multiple of DP x CP and EDP).
int64_t replica_group_align(const Config& cfg);
// The rank's transformer layers (global indices, ascending) and where each lies in the layout.
std::vector<int64_t> rank_layers(const std::vector<GPTDims>& chunks);
std::vector<GradRange> rank_layer_ranges(const ParamLayout& layout, const std::vector<GPTDims>& chunks);
// The position in rank_layers of the rank's last layer at or below global layer l (-1: none; the
// number of layers for l >= num_layers): what the DP sync's per-layer hooks take for a chunk's
// layer hooks (GPTStage::forward's layer_start, backward's layer_done).
int local_layer_index(const std::vector<int64_t>& layers, int64_t l, int64_t num_layers);

}  // namespace tpt
