// The trainer's Mixture-of-Experts state outside the parameters (docs/MOE.md): the expert biases of
// aux-loss-free balancing, updated once per global batch and saved with the model.
#include <string>

#include "train/trainer.h"

namespace tpt {

void Trainer::update_expert_bias() {
  // the step's counts over TP x DP x CP: every rank of the stage routed its own tokens
  const GroupSum sum = [&](std::vector<double>& v) {
    if (grid_.tp > 1) grid_.tp_group->all_reduce(v.data(), int64_t(v.size()), ReduceOp::Sum);
    if (grid_.dp_cp_size() > 1) grid_.dp_cp().all_reduce(v.data(), int64_t(v.size()), ReduceOp::Sum);
  };
  for (auto& stage : stages_)
    if (stage->moe()) stage->moe()->update_expert_bias(sum);
}

namespace {
std::string bias_name(int64_t layer) { return "h." + std::to_string(layer) + ".mlp.router.expert_bias"; }
}  // namespace

std::vector<CkptTensor> Trainer::expert_bias_tensors() {
  std::vector<CkptTensor> out;
  if (!cfg_.model.moe_router_enable_expert_bias) return out;
  const int64_t E = cfg_.model.num_moe_experts;
  for (auto& stage : stages_) {
    MoEMLP* moe = stage->moe();
    if (!moe) continue;
    for (size_t i = 0; i < moe->layers().size(); ++i) {
      CkptTensor t;
      t.name = bias_name(moe->layers()[i]);
      t.global_shape = t.box_size = t.local_shape = {E};
      t.box_offset = {0};
      t.data = moe->expert_bias(i).data();
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::vector<GlobalTensor> Trainer::expert_bias_model() const {
  std::vector<GlobalTensor> out;
  if (!cfg_.model.moe_router_enable_expert_bias) return out;
  for (int64_t l = 0; l < cfg_.model.num_layers; ++l)
    if (cfg_.model.is_moe_layer(l)) out.push_back({bias_name(l), {cfg_.model.num_moe_experts}});
  return out;
}

}  // namespace tpt
