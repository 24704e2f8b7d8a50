// The Mixture-of-Experts metrics of a training step (docs/MOE.md "Balancing losses"): the balancing
// losses and the routing's imbalance, from every rank's MoEStats, as the log line, metrics.jsonl and
// TensorBoard report them (Megatron's names).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "model/moe.h"

namespace tpt {

class Comm;

struct MoEMetrics {
  bool on = false;              // an MoE model
  std::string balancing_name;   // "load_balancing_loss" | "seq_load_balancing_loss"; empty: no balancing loss
  double balancing = 0;         // mean over MoE layers and micro-batches of aux / coeff
  bool has_z = false;
  double z = 0;                 // the same mean of z / z_coeff (logsumexp^2)
  double max_imbalance = 0;     // over MoE layers: max_e n_e / mean_e n_e of the step's routed assignments
  // the values by name, in log order
  std::vector<std::pair<std::string, double>> values() const;
};

// Every rank's stages' stats (collective over `world`: every rank calls it with its own).
MoEMetrics reduce_moe_metrics(const ModelConfig& m, const std::vector<MoEStats>& stages, Comm& world);

}  // namespace tpt
