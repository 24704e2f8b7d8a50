// The Mixture-of-Experts model keys (docs/MOE.md "Config"): model.moe_layer_freq's value, the rules
// between the model.moe_* keys and their derived defaults (resolve_moe, called by the loader in
// core/config.cpp), and ModelConfig::is_moe_layer.
#include <sstream>
#include <string>

#include "core/config.h"
#include "core/config_detail.h"
#include "core/error.h"

namespace tpt {

bool ModelConfig::is_moe_layer(int64_t l) const {
  if (!is_moe()) return false;
  if (!moe_layer_freq.pattern.empty()) return moe_layer_freq.pattern.at(size_t(l)) != 0;
  return l % moe_layer_freq.every == 0;
}

namespace config_detail {

LayerFreq parse_layer_freq(const YAML::Node& v, const std::string& what) {
  LayerFreq f;
  if (v.IsScalar()) {
    IntResult r = parse_int(v, f.every);
    if (!r.is_int) input_error(what + ": expected an integer or a list of 0 / 1 per layer, got " + describe(v));
    if (!r.in_range || f.every < 1) input_error(what + ": must be >= 1, got " + v.Scalar());
    return f;
  }
  if (!v.IsSequence()) input_error(what + ": expected an integer or a list of 0 / 1 per layer, got " + describe(v));
  f.every = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    int x = -1;
    if (!parse_int(v[i], x).is_int || (x != 0 && x != 1))
      input_error(what + ": entry " + std::to_string(i) + " must be 0 (dense) or 1 (MoE), got " + describe(v[i]));
    f.pattern.push_back(x);
  }
  return f;
}

nlohmann::json layer_freq_json(const LayerFreq& f) {
  if (f.pattern.empty()) return f.every;
  return f.pattern;
}

void resolve_moe(ModelConfig& m, const ModelKeys& keys) {
  auto fail = [&](const std::string& key, const std::string& other, const std::string& reason) {
    keys.fail(key, other, reason);
    internal_error("config: ModelKeys::fail returned");
  };
  auto s = [](double x) {
    std::ostringstream os;
    os << x;
    return os.str();
  };
  const ModelConfig d;
  if (!m.is_moe()) {
    // a dense model: an MoE key set to other than its default is a mistake (the default itself is
    // accepted: the resolved config lists every key and must re-parse)
    const std::pair<const char*, bool> unused[] = {
        {"model.moe_ffn_hidden_size", m.moe_ffn_hidden_size != 0},
        {"model.moe_layer_freq", !(m.moe_layer_freq == d.moe_layer_freq)},
        {"model.moe_router_topk", m.moe_router_topk != d.moe_router_topk},
        {"model.moe_router_score_function", m.moe_router_score_function != d.moe_router_score_function},
        {"model.moe_router_pre_softmax", m.moe_router_pre_softmax},
        {"model.moe_router_topk_scaling_factor", m.moe_router_topk_scaling_factor != 0},
        {"model.moe_router_num_groups", m.moe_router_num_groups != 0},
        {"model.moe_router_group_topk", m.moe_router_group_topk != 0},
        {"model.moe_router_enable_expert_bias", m.moe_router_enable_expert_bias},
        {"model.moe_aux_loss_coeff", m.moe_aux_loss_coeff != 0},
        {"model.moe_z_loss_coeff", m.moe_z_loss_coeff != 0},
        {"model.moe_shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size != 0},
        {"model.moe_shared_expert_gate", m.moe_shared_expert_gate},
        {"model.moe_expert_capacity_factor", m.moe_expert_capacity_factor != 0},
        {"model.moe_pad_expert_input_to_capacity", m.moe_pad_expert_input_to_capacity},
        {"model.moe_dispatch_bound_factor", m.moe_dispatch_bound_factor != d.moe_dispatch_bound_factor},
        {"model.moe_kept_rows_factor", m.moe_kept_rows_factor != d.moe_kept_rows_factor}};
    for (const auto& [key, set] : unused)
      if (set && keys.given(key))
        fail(key, "model.num_moe_experts", "is only used by Mixture-of-Experts models (model.num_moe_experts is null)");
    return;
  }
  const int E = m.num_moe_experts, k = m.moe_router_topk;
  if (E > (1 << 16)) fail("model.num_moe_experts", "", "must be <= 65536, got " + s(E));
  if (m.moe_ffn_hidden_size == 0) m.moe_ffn_hidden_size = m.ffn_hidden_size;
  if (m.moe_ffn_hidden_size > (1 << 22)) fail("model.moe_ffn_hidden_size", "", "must be <= 4194304, got " + s(m.moe_ffn_hidden_size));
  if (m.moe_shared_expert_intermediate_size > (1 << 22))
    fail("model.moe_shared_expert_intermediate_size", "", "must be <= 4194304");
  if (!m.moe_layer_freq.pattern.empty() && int64_t(m.moe_layer_freq.pattern.size()) != m.num_layers)
    fail("model.moe_layer_freq", "model.num_layers",
         "a list needs one 0 / 1 per layer: got " + s(double(m.moe_layer_freq.pattern.size())) + " entries for " +
             s(m.num_layers) + " layers");
  if (k > E)
    fail("model.moe_router_topk", "model.num_moe_experts",
         s(k) + " is greater than model.num_moe_experts (" + s(E) + "): a token cannot choose more experts than there are");
  // group-limited routing
  const bool groups = m.moe_router_num_groups != 0, group_topk = m.moe_router_group_topk != 0;
  if (groups != group_topk)
    fail(groups ? "model.moe_router_num_groups" : "model.moe_router_group_topk",
         groups ? "model.moe_router_group_topk" : "model.moe_router_num_groups",
         "group-limited routing needs both model.moe_router_num_groups and model.moe_router_group_topk");
  if (groups) {
    const int g = m.moe_router_num_groups, gk = m.moe_router_group_topk;
    if (E % g != 0)
      fail("model.moe_router_num_groups", "model.num_moe_experts",
           "model.num_moe_experts (" + s(E) + ") is not divisible by model.moe_router_num_groups (" + s(g) + ")");
    if (gk > g)
      fail("model.moe_router_group_topk", "model.moe_router_num_groups",
           s(gk) + " is greater than model.moe_router_num_groups (" + s(g) + ")");
    if (k % gk != 0)
      fail("model.moe_router_topk", "model.moe_router_group_topk",
           "model.moe_router_topk (" + s(k) + ") is not divisible by model.moe_router_group_topk (" + s(gk) +
               "): each chosen group is scored by its top topk / group_topk experts");
    if (k / gk > E / g)
      fail("model.moe_router_topk", "model.moe_router_group_topk",
           "topk / group_topk (" + s(k / gk) + ") is more than the experts per group (" + s(E / g) + ")");
  }
  if (m.moe_router_topk_scaling_factor < 0 || (keys.given("model.moe_router_topk_scaling_factor") && !(m.moe_router_topk_scaling_factor > 0)))
    fail("model.moe_router_topk_scaling_factor", "", "must be > 0 (or null), got " + s(m.moe_router_topk_scaling_factor));
  if (m.moe_router_enable_expert_bias && m.moe_router_score_function != MoEScore::Sigmoid)
    fail("model.moe_router_enable_expert_bias", "model.moe_router_score_function",
         "the expert bias (aux-loss-free balancing) needs moe_router_score_function: sigmoid (Megatron's rule)");
  if (!(m.moe_router_bias_update_rate > 0))
    fail("model.moe_router_bias_update_rate", "", "must be > 0, got " + s(m.moe_router_bias_update_rate));
  if (!(m.moe_aux_loss_coeff >= 0)) fail("model.moe_aux_loss_coeff", "", "must be >= 0, got " + s(m.moe_aux_loss_coeff));
  if (m.moe_z_loss_coeff < 0 || (keys.given("model.moe_z_loss_coeff") && !(m.moe_z_loss_coeff > 0)))
    fail("model.moe_z_loss_coeff", "", "must be > 0 (or null), got " + s(m.moe_z_loss_coeff));
  if (m.moe_router_load_balancing_type == MoEBalancing::None && m.moe_aux_loss_coeff != 0)
    fail("model.moe_aux_loss_coeff", "model.moe_router_load_balancing_type",
         "is " + s(m.moe_aux_loss_coeff) + " with moe_router_load_balancing_type: none (set the coefficient to 0 or "
         "choose aux_loss / seq_aux_loss)");
  if (m.moe_expert_capacity_factor < 0 ||
      (keys.given("model.moe_expert_capacity_factor") && !(m.moe_expert_capacity_factor > 0)))
    fail("model.moe_expert_capacity_factor", "", "must be > 0 (or null: dropless), got " + s(m.moe_expert_capacity_factor));
  if (!(m.moe_dispatch_bound_factor >= 1 && m.moe_dispatch_bound_factor <= 1e6))
    fail("model.moe_dispatch_bound_factor", "",
         "must be in [1, 1e6] (a multiple of the balanced per-expert load), got " + s(m.moe_dispatch_bound_factor));
  if (!(m.moe_kept_rows_factor >= 1 && m.moe_kept_rows_factor <= 1e6))
    fail("model.moe_kept_rows_factor", "",
         "must be in [1, 1e6] (a multiple of the balanced load of the kept rows), got " + s(m.moe_kept_rows_factor));
  if (m.moe_pad_expert_input_to_capacity && m.moe_expert_capacity_factor == 0)
    fail("model.moe_pad_expert_input_to_capacity", "model.moe_expert_capacity_factor",
         "needs a capacity: set model.moe_expert_capacity_factor");
  if (m.moe_shared_expert_gate && m.moe_shared_expert_intermediate_size == 0)
    fail("model.moe_shared_expert_gate", "model.moe_shared_expert_intermediate_size",
         "gates the shared expert: set model.moe_shared_expert_intermediate_size");
}

}  // namespace config_detail

void check_moe_parallel(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  if (!cfg.model.is_moe() || p.tensor_model_parallel_size == 1) return;
  const std::string tp = std::to_string(p.tensor_model_parallel_size);
  if (!p.sequence_parallel)
    input_error("parallel.sequence_parallel: model.num_moe_experts with tensor_model_parallel_size " + tp +
                " needs sequence parallelism (Megatron's rule: each TP rank routes its own tokens)");
  // ETP = TP (resolved from null by now): each expert's width split over TP
  const int64_t Fe = cfg.model.moe_ffn_hidden_size, etp = p.expert_tensor_parallel_size;
  if (etp > 1 && Fe % etp != 0)
    input_error("model.moe_ffn_hidden_size: " + std::to_string(Fe) + " is not divisible by "
                "parallel.expert_tensor_parallel_size (" + std::to_string(etp) +
                ": each expert's fc1 / fc2 split over TP); set expert_tensor_parallel_size: 1 or change the width");
}

}  // namespace tpt
