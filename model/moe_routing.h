// The Mixture-of-Experts router's math on the host (docs/MOE.md "One MoE layer", "Balancing losses"):
// from the router's fp32 logits of a rank's tokens to each token's k experts and weights, capacity
// dropping, the balancing losses, and the backward of all of it to d logits. Plain loops in fp32
// (double where a sum over tokens is taken), written from Megatron's router.py / moe_utils.py. The
// device computes the logits and moves the rows (model/moe.h); the routing decisions and the
// all-to-all's counts are needed on the host anyway (Megatron's dispatcher syncs them too).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/config.h"

namespace tpt {

// The router's options (model.moe_router_*, model.moe_expert_capacity_factor, ...; docs/MOE.md).
struct RouterOptions {
  int64_t E = 0, k = 0;
  MoEScore score = MoEScore::Softmax;
  bool pre_softmax = false;
  double scaling = 0;                 // 0: none
  int64_t groups = 0, group_topk = 0;  // 0: not group-limited
  double capacity_factor = 0;          // 0: dropless
  MoEDropPolicy drop = MoEDropPolicy::Probs;
  bool pad_to_capacity = false;
  MoEBalancing balancing = MoEBalancing::AuxLoss;
  double aux_coeff = 0, z_coeff = 0;
  bool expert_bias = false;   // aux-loss-free balancing: a per-expert fp32 bias on the sigmoid scores chooses
  double bias_update_rate = 0;
};
RouterOptions router_options(const ModelConfig& m);

// One layer's routing of a rank's T tokens (one micro-batch).
struct Routing {
  int64_t T = 0, k = 0;
  std::vector<int32_t> expert;  // (T, k) chosen experts, -1 where capacity dropped the assignment
  std::vector<float> prob;      // (T, k) their weights (0 where dropped)
  // for the backward: the score function's values the weights were computed from, per token
  std::vector<float> scores;    // (T, E): softmax(z) (pre-softmax), sigmoid(z); post-softmax: unused
  std::vector<float> topk_softmax;  // (T, k) post-softmax: softmax over the k chosen logits
  std::vector<int32_t> chosen;  // (T, k) the chosen experts before dropping
  // the balancing losses' d logits (T, E) for a unit loss scale, and their values
  std::vector<float> dlogits_aux;
  double aux = 0;     // this micro-batch's aux (seq aux, global aux) loss over its group, coefficient included
  double z = 0;       // this rank's z-loss, coefficient included (Megatron's: coeff / (TP CP) * mean lse^2)
  double z_mean = 0;  // this rank's mean logsumexp^2
  std::vector<double> counts;  // (E) this rank's routed assignments per expert, after capacity
};

// Sums a vector of doubles over the token group (TP x CP): the balancing losses' counts. Identity
// for a rank alone.
using GroupSum = std::function<void(std::vector<double>& v)>;

// Routes logits z (T, E) of this rank's tokens. seq_of(t): the micro-batch sequence (0 .. B-1) token
// t belongs to (seq_aux_loss), group_size: ranks in the TP x CP group. Calls sum exactly once when a
// balancing loss is on, on every rank of the group alike (global_aux_loss: its group is TP x DP x CP).
// bias (E): the expert bias (o.expert_bias), added to the sigmoid scores for the choice only.
// average (global_aux_loss): replaces the micro-batch's summed counts f (E) by the mean of the step's
// so far (Megatron's global_tokens_per_expert / ga_steps).
Routing route(const float* z, int64_t T, const RouterOptions& o, const std::function<int64_t(int64_t)>& seq_of,
              int64_t B, int64_t group_size, const GroupSum& sum, const float* bias = nullptr,
              const GroupSum& average = {});

// The expert bias's update once per global batch (Megatron's get_updated_expert_bias): bias_e +=
// rate * sign(mean - n_e) with n (E) the step's routed counts over TP x DP x CP.
void update_expert_bias(std::vector<float>& bias, const std::vector<double>& counts, double rate);
// The counts the update reads for one micro-batch's routing (after capacity; padded to capacity,
// every expert's capacity: Megatron counts its routing map)
void add_bias_counts(const Routing& r, const RouterOptions& o, std::vector<double>& counts);

// d logits (T, E) from d prob (T, k), plus loss_scale x the balancing losses' d logits.
void routing_backward(const Routing& r, const float* dprob, const RouterOptions& o, float loss_scale, float* dlogits);

// The send order of one layer's routing (r.T tokens, k choices each): the assignments listed by
// expert, token order within an expert (with EP 1 also the experts' row order), and the maps between
// assignments and send rows. Dropped assignments (expert -1) have no row.
struct MoESendOrder {
  std::vector<int64_t> per_expert;  // (E) the rows of each expert
  std::vector<int32_t> perm;        // (n_send) the token of each send row
  std::vector<float> row_w;         // (n_send) the probability of each send row
  std::vector<int32_t> comb;        // (T k) the send row of assignment (t, j), -1 where dropped
  int64_t n_send = 0;
};
MoESendOrder moe_send_order(const Routing& r, int64_t E);  // model/moe_routing.cpp

}  // namespace tpt
