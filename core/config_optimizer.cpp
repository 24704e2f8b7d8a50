// The optimizer's storage keys' rules (resolve_optimizer_storage, called by the loader in
// core/config.cpp): master-weight remainders with bf16 only; Megatron's precision-aware optimizer
// (a state dtype other than fp32 needs the flag); the bf16 gradient buffer not with fp16; fp16
// master weights not with remainders.
#include <string>
#include <utility>

#include "core/config.h"
#include "core/config_detail.h"
#include "core/error.h"

namespace tpt::config_detail {

void resolve_optimizer_storage(const Config& c, const ModelKeys& keys) {
  const OptimizerConfig& o = c.optimizer;
  auto fail = [&](const std::string& key, const std::string& other_or_reason, const std::string& reason = "") {
    if (reason.empty()) keys.fail(key, "", other_or_reason);
    else keys.fail(key, other_or_reason, reason);
    internal_error("config: ModelKeys::fail returned");
  };
  if (o.store_param_remainders && c.training.precision != Precision::BF16)
    fail("optimizer.store_param_remainders", "training.precision",
             "needs training.precision bf16 (the master weight is the bf16 parameter plus a 16-bit remainder), got " +
                 name_of(c.training.precision));
  // the precision-aware optimizer (Megatron's rules: a state dtype other than fp32 needs the flag)
  const std::pair<const char*, StateDType> state_dtypes[] = {{"optimizer.main_grads_dtype", o.main_grads_dtype},
                                                             {"optimizer.main_params_dtype", o.main_params_dtype},
                                                             {"optimizer.exp_avg_dtype", o.exp_avg_dtype},
                                                             {"optimizer.exp_avg_sq_dtype", o.exp_avg_sq_dtype}};
  for (const auto& [key, t] : state_dtypes)
    if (t != StateDType::FP32 && !o.use_precision_aware_optimizer)
      fail(key, "optimizer.use_precision_aware_optimizer",
               name_of(t) + " needs optimizer.use_precision_aware_optimizer: true (without it every optimizer state is fp32)");
  if (o.main_grads_dtype != StateDType::FP32 && o.main_grads_dtype != StateDType::BF16)
    fail("optimizer.main_grads_dtype", name_of(o.main_grads_dtype) + ": the gradient buffer is fp32 or bf16");
  // the bf16 gradient buffer (either key): not under fp16's loss scaling, whose inf / nan check and
  // unscaling Megatron runs on fp32 main grads
  if (bf16_grads(c) && c.training.precision == Precision::FP16)
    fail(c.parallel.grad_reduce_in_bf16 ? "parallel.grad_reduce_in_bf16" : "optimizer.main_grads_dtype",
         "training.precision", "a bf16 gradient buffer needs training.precision bf16 (or fp32), got fp16");
  // fp16 master weights (Transformer Engine's, scaled per tensor), not as well as the remainders that
  // hold fp32 ones (with training.precision fp32 beside an fp32 compute copy: no saving, but the
  // storage's numerics alone, as tests/cli/parity_torch.sh checks them)
  if (o.main_params_dtype == StateDType::BF16)
    fail("optimizer.main_params_dtype", "bf16: the master weights are fp32 or fp16 (Megatron's choices)");
  if (o.main_params_dtype == StateDType::FP16 && o.store_param_remainders)
    fail("optimizer.main_params_dtype", "optimizer.store_param_remainders",
         "fp16 master weights and optimizer.store_param_remainders (exact fp32 master weights in 2 bytes) are "
         "two ways to store them: choose one");
}

}  // namespace tpt::config_detail

namespace tpt {
bool bf16_grads(const Config& c) {
  return c.parallel.grad_reduce_in_bf16 || c.optimizer.main_grads_dtype == StateDType::BF16;
}
}  // namespace tpt
