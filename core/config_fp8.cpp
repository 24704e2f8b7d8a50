// The FP8 training keys' rules (docs/FP8.md "Config"; resolve_fp8, called by the loader in core/config.cpp):
// FP8 with bf16 only, blockwise scaling's 128-divisible GEMM dimensions, the bf16 layers at the ends.
// Without training.fp8_format the other fp8 keys are not read (Megatron's behaviour).
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/config_detail.h"
#include "core/error.h"

namespace tpt::config_detail {

void resolve_fp8(const Config& c, const ModelKeys& keys) {
  const TrainingConfig& t = c.training;
  auto fail = [&](const std::string& key, const std::string& other, const std::string& reason) {
    keys.fail(key, other, reason);
    internal_error("config: ModelKeys::fail returned");
  };
  if (t.fp8_param_gather) {  // FP8 parameters: cast from the distributed optimizer's fp32 master weights
    if (t.fp8_format == Fp8Format::None)
      fail("training.fp8_param_gather", "training.fp8_format",
           "FP8 parameters need FP8 training (training.fp8_format: e4m3 or hybrid)");
    if (!c.parallel.distributed_optimizer)
      fail("training.fp8_param_gather", "parallel.distributed_optimizer",
           "FP8 parameters are cast from the distributed optimizer's master weights: needs "
           "parallel.distributed_optimizer: true");
    const OptimizerConfig& o = c.optimizer;
    if (o.store_param_remainders)
      fail("training.fp8_param_gather", "optimizer.store_param_remainders",
           "optimizer.store_param_remainders completes a 16-bit weight copy that FP8 parameters do not keep");
    for (const auto& [key, d] : {std::pair<const char*, StateDType>{"optimizer.main_params_dtype", o.main_params_dtype},
                                 {"optimizer.exp_avg_dtype", o.exp_avg_dtype},
                                 {"optimizer.exp_avg_sq_dtype", o.exp_avg_sq_dtype}})
      if (d == StateDType::FP16)
        fail("training.fp8_param_gather", key, "FP8 parameters are cast from fp32 master weights beside fp32 or bf16 "
                                               "moments, not with fp16 optimizer states (" + std::string(key) + ": fp16)");
  }
  if (t.fp8_format == Fp8Format::None) return;
  if (t.precision != Precision::BF16)
    fail("training.fp8_format", "training.precision",
         "FP8 training needs training.precision: bf16 (the GEMM outputs, norms and attention stay in bf16), got " +
             name_of(t.precision));
  const ModelConfig& m = c.model;
  if (t.first_last_layers_bf16 &&
      int64_t(t.num_layers_at_start_in_bf16) + t.num_layers_at_end_in_bf16 > m.num_layers)
    fail("training.num_layers_at_start_in_bf16", "training.num_layers_at_end_in_bf16",
         std::to_string(t.num_layers_at_start_in_bf16) + " + training.num_layers_at_end_in_bf16 (" +
             std::to_string(t.num_layers_at_end_in_bf16) + ") bf16 layers exceed model.num_layers (" +
             std::to_string(m.num_layers) + ")");
  if (t.fp8_recipe != Fp8Recipe::Blockwise) return;
  // blockwise: 1 x 128 scales along the inner dimension of every FP8 GEMM input, 128 x 128 blocks of
  // the weights, so both dimensions of every linear layer's weight on a TP rank divide by 128
  const int64_t tp = c.parallel.tensor_model_parallel_size;
  const int64_t etp = c.parallel.expert_tensor_parallel_size ? c.parallel.expert_tensor_parallel_size : tp;
  const int64_t heads = m.num_attention_heads, groups = m.group_query_attention ? m.num_query_groups : heads;
  std::vector<std::pair<std::string, int64_t>> dims = {
      {"model.hidden_size", m.hidden_size},
      {"model.num_attention_heads x model.kv_channels / TP (the attention projection's input)",
       heads * m.kv_channels / tp},
      {"the QKV width (heads + 2 x query groups) x model.kv_channels / TP", (heads + 2 * groups) * m.kv_channels / tp}};
  if (m.is_moe()) dims.push_back({"model.moe_ffn_hidden_size / expert TP", m.moe_ffn_hidden_size / etp});
  if (!m.is_moe() || !m.moe_layer_freq.pattern.empty() || m.moe_layer_freq.every > 1)
    dims.push_back({"model.ffn_hidden_size / TP", m.ffn_hidden_size / tp});
  if (m.moe_shared_expert_intermediate_size)
    dims.push_back({"model.moe_shared_expert_intermediate_size / TP", m.moe_shared_expert_intermediate_size / tp});
  for (const auto& [what, n] : dims)
    if (n % 128 != 0)
      fail("training.fp8_recipe", "", "blockwise scaling (128 x 128 weight blocks, 1 x 128 activation blocks) needs "
                                      "every linear layer's dimensions on a TP rank divisible by 128: " + what + " = " +
                                      std::to_string(n) + " is not");
}

}  // namespace tpt::config_detail

namespace tpt {
bool fp8_param_gather_allowed(const Config& c) {
  const OptimizerConfig& o = c.optimizer;
  return c.training.fp8_format != Fp8Format::None && !o.store_param_remainders &&
         o.main_params_dtype != StateDType::FP16 && o.exp_avg_dtype != StateDType::FP16 &&
         o.exp_avg_sq_dtype != StateDType::FP16;
}
}  // namespace tpt
