#include "model/param_group.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"
#include "model/gpt.h"

namespace tpt {

namespace {

// The transformer layer of a tensor named h.<layer>.<...>, else -1.
int64_t layer_of(const std::string& name) {
  if (name.compare(0, 2, "h.") != 0) return -1;
  size_t i = 2;
  int64_t layer = 0;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) layer = layer * 10 + (name[i] - '0');
  return i > 2 && i < name.size() && name[i] == '.' ? layer : -1;
}

std::string group_name(std::pair<ReplicaGroup, bool> g) {
  const std::string fp8 = g.second ? " FP8-parameter" : "";
  switch (g.first) {
    case ReplicaGroup::Dense: return "dense" + fp8;
    case ReplicaGroup::ExpertData: return "expert-data-parallel" + fp8;
  }
  return "group " + std::to_string(int(g.first)) + fp8;
}

}  // namespace

std::vector<GradGroup> make_grad_groups(const ParamLayout& layout, const std::vector<int64_t>& layers,
                                        bool distributed_optimizer,
                                        const std::function<ReplicaComm(ReplicaGroup)>& replica_comm) {
  // the layout's tensors by offset, cut into runs of one replica group: each group must be one run
  std::vector<const ParamInfo*> order;
  for (const ParamInfo& p : layout.params) order.push_back(&p);
  std::stable_sort(order.begin(), order.end(), [](const ParamInfo* a, const ParamInfo* b) { return a->offset < b->offset; });
  // (the FP8 parameters a span of their own: one replica group, another storage)
  std::vector<GradGroup> groups;
  std::vector<std::pair<ReplicaGroup, bool>> which;
  for (size_t i = 0; i < order.size(); ++i) {
    const std::pair<ReplicaGroup, bool> g{order[i]->group.replicas, order[i]->group.fp8};
    if (!which.empty() && which.back() == g) continue;
    if (std::find(which.begin(), which.end(), g) != which.end())
      internal_error("make_grad_groups: the " + group_name(g) + " group's tensors are not contiguous in the layout (" +
                     order[i]->name + ")");
    if (!groups.empty()) groups.back().span.n = order[i]->offset - groups.back().span.offset;
    const ReplicaComm rc = replica_comm(g.first);
    groups.push_back({rc.comm, rc.scale, {order[i]->offset, 0}, {}, g.second});
    which.push_back(g);
  }
  if (!groups.empty()) groups.back().span.n = layout.total - groups.back().span.offset;
  for (size_t k = 0; k < groups.size(); ++k) {
    GradGroup& gg = groups[k];
    // with the distributed optimizer each span padded to whole blocks: into the next group's room
    // only if the layout left it free
    const int ranks = gg.comm ? gg.comm->size() : 1;
    const int64_t padded = GradSync::buffer_size(gg.span.n, ranks, distributed_optimizer);
    if (gg.span.offset % kShardAlign != 0 ||
        (k + 1 < groups.size() && gg.span.offset + padded > groups[k + 1].span.offset))
      internal_error("make_grad_groups: the layout leaves no aligned room for the " + group_name(which[k]) +
                     " group's span [" + std::to_string(gg.span.offset) + ", +" + std::to_string(padded) + ")");
    gg.span.n = padded;
    // its part of each layer: the hull of its tensors of that layer; an empty part sits at the end
    // of the layer before (or at the next non-empty one), so the layers stay ascending
    for (int64_t l : layers) {
      int64_t lo = INT64_MAX, hi = INT64_MIN;
      for (const ParamInfo& p : layout.params)
        if (p.group.replicas == which[k].first && p.group.fp8 == which[k].second && layer_of(p.name) == l) {
          lo = std::min(lo, p.offset);
          hi = std::max(hi, p.offset + p.numel);
        }
      gg.layers.push_back(lo <= hi ? GradRange{lo, hi - lo} : GradRange{-1, 0});
    }
    int64_t next = gg.span.offset;  // empty parts at the first non-empty one...
    for (const GradRange& r : gg.layers)
      if (r.n > 0) {
        next = r.offset;
        break;
      }
    for (GradRange& r : gg.layers) {  // ...or at the end of the one before
      if (r.n == 0) r.offset = next;
      next = r.offset + r.n;
    }
  }
  return groups;
}

int64_t grad_buffer_size(const ParamLayout& layout, const std::vector<GradGroup>& groups) {
  return groups.empty() ? layout.total : std::max(layout.total, groups.back().span.offset + groups.back().span.n);
}

std::vector<GradRange> tp_replicated_ranges(const ParamLayout& layout, bool sequence_parallel) {
  std::vector<GradRange> ranges;
  bool extend = false;  // consecutive replicated tensors go in one range (the padding between them is zero)
  for (const ParamInfo& p : layout.params) {
    const bool replicated =
        p.group.copy == ModelCopy::TensorParallel && (sequence_parallel || p.group.partial_over_tp);
    if (replicated && extend) ranges.back().n = p.offset + p.numel - ranges.back().offset;
    else if (replicated) ranges.push_back({p.offset, p.numel});
    extend = replicated;
  }
  return ranges;
}

GradRange tied_embedding_range(const ParamLayout& layout) {
  for (const ParamInfo& p : layout.params)
    if (p.group.copy == ModelCopy::TiedEmbedding) return {p.offset, p.numel};
  return {};
}

}  // namespace tpt
