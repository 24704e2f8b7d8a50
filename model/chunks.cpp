#include "model/chunks.h"

#include <algorithm>
#include <numeric>

#include "core/config.h"

namespace tpt {

int model_chunks(const Config& cfg) { return std::max(1, cfg.parallel.virtual_pipeline_model_parallel_size); }

std::vector<GPTDims> make_chunk_dims(const Config& cfg, int tp, int tp_rank, int pp, int pp_rank) {
  const int v = model_chunks(cfg);
  std::vector<GPTDims> chunks;
  for (int c = 0; c < v; ++c) chunks.push_back(make_dims(cfg, tp, tp_rank, pp * v, c * pp + pp_rank));
  return chunks;
}

int64_t replica_group_align(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const int64_t replicas = int64_t(std::max(1, p.data_parallel_size)) * p.context_parallel_size;
  if (!p.distributed_optimizer) return kShardAlign;
  // FP8 parameters: spans follow the experts' 16-bit one, which is padded over EDP: every span starts at a
  // multiple of both groups' units, so that either's padding ends before the next span
  int64_t unit = replicas;
  if (cfg.training.fp8_param_gather && cfg.model.is_moe()) {
    const int64_t etp = p.expert_tensor_parallel_size > 0 ? p.expert_tensor_parallel_size : p.tensor_model_parallel_size;
    const int64_t folded = int64_t(p.tensor_model_parallel_size) * replicas, experts = etp * p.expert_model_parallel_size;
    if (experts > 0 && folded % experts == 0) unit = std::lcm(unit, folded / experts);
  }
  return kShardAlign * unit;
}

ParamLayout make_rank_layout(const std::vector<GPTDims>& chunks, int64_t group_align) {
  // the chunks' tensors in chunk order, each replica group's together (the experts after every dense
  // tensor: model/param_group.h, then the FP8 parameters, dense then experts'), at offsets recounted with
  // the 64-byte tensor alignment; a group starts at a multiple of group_align
  std::vector<ParamInfo> all;
  for (const GPTDims& d : chunks)
    for (ParamInfo& p : make_param_layout(d).params) all.push_back(std::move(p));
  auto span = [](const ParamInfo& p) { return layout_span(p.group); };
  std::stable_sort(all.begin(), all.end(), [&](const ParamInfo& a, const ParamInfo& b) { return span(a) < span(b); });
  ParamLayout rank;
  for (ParamInfo& p : all) {
    if (!rank.params.empty() && span(rank.params.back()) != span(p))
      rank.total = (rank.total + group_align - 1) / group_align * group_align;
    p.offset = rank.total;
    rank.total += (p.numel + 15) / 16 * 16;
    rank.params.push_back(std::move(p));
  }
  return rank;
}

std::vector<int64_t> rank_layers(const std::vector<GPTDims>& chunks) {
  std::vector<int64_t> layers;
  for (const GPTDims& d : chunks)
    for (int64_t l = d.layer_begin; l < d.layer_end; ++l) layers.push_back(l);
  return layers;
}

std::vector<GradRange> rank_layer_ranges(const ParamLayout& layout, const std::vector<GPTDims>& chunks) {
  std::vector<GradRange> ranges;
  for (const GPTDims& d : chunks)
    for (const GradRange& r : layer_ranges(layout, d)) ranges.push_back(r);
  return ranges;
}

int local_layer_index(const std::vector<int64_t>& layers, int64_t l, int64_t num_layers) {
  if (l >= num_layers) return int(layers.size());
  return int(std::upper_bound(layers.begin(), layers.end(), l) - layers.begin()) - 1;
}

}  // namespace tpt
