#include "train/moe_metrics.h"

#include <algorithm>

#include "parallel/comm.h"

namespace tpt {

std::vector<std::pair<std::string, double>> MoEMetrics::values() const {
  std::vector<std::pair<std::string, double>> v;
  if (!on) return v;
  if (!balancing_name.empty()) v.emplace_back(balancing_name, balancing);
  if (has_z) v.emplace_back("z_loss", z);
  v.emplace_back("moe_max_imbalance", max_imbalance);
  return v;
}

MoEMetrics reduce_moe_metrics(const ModelConfig& m, const std::vector<MoEStats>& stages, Comm& world) {
  MoEMetrics r;
  if (!m.is_moe()) return r;
  r.on = true;
  const int64_t E = m.num_moe_experts, L = m.num_layers;
  // [aux sum, z sum, terms, counts (L, E)]: each term is one (micro-batch, MoE layer) on one rank
  std::vector<double> v(size_t(3 + L * E), 0.0);
  for (const MoEStats& s : stages) {
    v[0] += s.aux;
    v[1] += s.z;
    v[2] += double(s.terms);
    for (size_t i = 0; i < s.layers.size(); ++i)
      for (int64_t e = 0; e < E; ++e) v[size_t(3 + s.layers[i] * E + e)] += s.counts[i * size_t(E) + size_t(e)];
  }
  world.all_reduce(v.data(), int64_t(v.size()), ReduceOp::Sum);
  const double terms = std::max(1.0, v[2]);
  if (m.moe_aux_loss_coeff != 0 && m.moe_router_load_balancing_type != MoEBalancing::None) {
    const MoEBalancing b = m.moe_router_load_balancing_type;
    r.balancing_name = b == MoEBalancing::SeqAuxLoss      ? "seq_load_balancing_loss"
                       : b == MoEBalancing::GlobalAuxLoss ? "global_load_balancing_loss"
                                                          : "load_balancing_loss";
    r.balancing = v[0] / terms;  // each rank's aux is its group's (TP x CP; global: x DP): the mean over all terms
  }
  r.has_z = m.moe_z_loss_coeff != 0;
  r.z = v[1] / terms;  // each rank's mean over its tokens; equal token counts: the mean of the means
  for (int64_t l = 0; l < L; ++l) {
    if (!m.is_moe_layer(l)) continue;
    const double* c = v.data() + 3 + l * E;
    double total = 0, top = 0;
    for (int64_t e = 0; e < E; ++e) total += c[e], top = std::max(top, c[e]);
    if (total > 0) r.max_imbalance = std::max(r.max_imbalance, top / (total / double(E)));
  }
  return r;
}

}  // namespace tpt
