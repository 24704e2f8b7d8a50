// What `tptrain plan` suggests when a stage does not fit (plan/memory.h plan_suggestions): each change
// planned again with the same memory functions, with its largest stage total.
#include <algorithm>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "plan/memory.h"

namespace tpt {

namespace {
// Largest total over the stages; -1 when the config is not a valid grid for `world`.
int64_t peak_bytes(Config c, int world) {
  try {
    c.parallel.data_parallel_size = 0;
    resolve_parallel(c, world);
    check_plannable(c);
  } catch (const InputError&) {
    return -1;
  }
  int64_t peak = 0;
  for (int s = 0; s < c.parallel.pipeline_model_parallel_size; ++s) peak = std::max(peak, stage_memory(c, s).total_bytes());
  return peak;
}

}  // namespace

std::vector<PlanSuggestion> plan_suggestions(const Config& c, const Plan& plan) {
  std::vector<PlanSuggestion> out;
  const double limit = plan.device_memory_bytes;
  auto add = [&](const std::string& change, const std::string& note, Config v, int world) {
    const int64_t peak = peak_bytes(v, world);
    if (peak >= 0) out.push_back({change, note, peak, double(peak) <= limit});
    return peak >= 0 && double(peak) <= limit;
  };
  const Recompute rc = c.training.recompute;
  auto with_recompute = [&](Config v, Recompute mode) {
    v.training.recompute = mode;
    return v;
  };
  const std::string already = "already configured";
  if (rc == Recompute::None)
    add("training.recompute=selective", "", with_recompute(c, Recompute::Selective), plan.world_size);
  // selective recompute with every module that applies (Megatron's --recompute-modules), each change
  // named with the whole list it plans (the configured modules kept)
  auto modules_change = [](const RecomputeModules& r) {
    std::string s = "training.recompute=selective \"training.recompute_modules=[core_attn";
    for (const auto& [on, name] : {std::pair<bool, const char*>{r.moe_act, "moe_act"}, {r.layernorm, "layernorm"},
                                   {r.moe, "moe"}, {r.mlp, "mlp"}, {r.shared_experts, "shared_experts"}})
      if (on) s += std::string(", ") + name;
    return s + "]\"";
  };
  if (rc != Recompute::Full) {
    Config v = with_recompute(c, Recompute::Selective);
    v.training.recompute_modules.layernorm = true;
    v.training.recompute_modules.moe_act = c.model.is_moe();
    if (!(rc == Recompute::Selective && v.training.recompute_modules == c.training.recompute_modules))
      add(modules_change(v.training.recompute_modules), "the norm outputs (and the experts' activations) rerun in backward",
          v, plan.world_size);
    if (c.model.is_moe() && !(rc == Recompute::Selective && c.training.recompute_modules.moe)) {
      v.training.recompute_modules.moe_act = false;
      v.training.recompute_modules.moe = true;
      add(modules_change(v.training.recompute_modules),
          "and each MoE layer's MLP rerun before its backward (its dispatch too): one set of kept rows", v,
          plan.world_size);
    }
    bool dense = false;  // the mlp module: a dense layer's fc1 output and activation rerun in backward
    for (int64_t l = 0; l < c.model.num_layers && !dense; ++l) dense = !c.model.is_moe_layer(l);
    if (dense && !(rc == Recompute::Selective && c.training.recompute_modules.mlp)) {
      Config u = with_recompute(c, Recompute::Selective);
      u.training.recompute_modules.layernorm = u.training.recompute_modules.mlp = true;
      add(modules_change(u.training.recompute_modules), "and the dense MLPs' fc1 output and activation rerun in backward",
          u, plan.world_size);
    }
  }
  // MoE with EP > 1: the dispatch buffers and the pool of kept rows at 1.1x the balanced load
  const ModelConfig& mc = c.model;
  if (mc.is_moe() && c.parallel.expert_model_parallel_size > 1 && (mc.moe_dispatch_bound_factor > 1.1 || mc.moe_kept_rows_factor > 1.1)) {
    Config v = c;
    v.model.moe_dispatch_bound_factor = v.model.moe_kept_rows_factor = 1.1;
    add("model.moe_dispatch_bound_factor=1.1 model.moe_kept_rows_factor=1.1", "for balanced routing (force-balanced or a "
        "well-balanced run): a layer that receives more grows the buffers, with a warning, past the plan", v, plan.world_size);
  }
  add("training.recompute=full", rc == Recompute::Full ? already : "", with_recompute(c, Recompute::Full), plan.world_size);
  Config mb1 = c;
  mb1.training.micro_batch_size = 1;
  add("training.micro_batch_size=1", c.training.micro_batch_size == 1 ? already : "", mb1, plan.world_size);
  // More PP / more TP: the smallest degree that fits (first with the configured recompute, then
  // with full recompute). The world keeps its size where the grid allows, else DP is kept.
  auto grow = [&](bool pipeline) {
    std::vector<Recompute> modes = {rc};
    if (rc != Recompute::Full) modes.push_back(Recompute::Full);
    const int cur = pipeline ? plan.pp : plan.tp;
    // the model's limit, and the keys' own bound (1024): each degree plans that many stages
    const int max_degree = std::min(1024, pipeline ? c.model.num_layers : c.model.num_attention_heads);
    for (Recompute mode : modes)
      for (int n = cur + 1; n <= max_degree; ++n) {
        Config v = with_recompute(c, mode);
        (pipeline ? v.parallel.pipeline_model_parallel_size : v.parallel.tensor_model_parallel_size) = n;
        const int tp = v.parallel.tensor_model_parallel_size, pp = v.parallel.pipeline_model_parallel_size;
        const int g = plan.options.gpus_per_node;  // TP groups that tile nodes: 1, 2, 4, 8, 16, ...
        if (!pipeline && (tp <= g ? g % tp != 0 : tp % g != 0)) continue;
        if (int64_t(tp) * pp * plan.dp > (1 << 24)) continue;  // beyond plan --world-size's bound
        int world = tp * pp * plan.dp;  // keep DP, unless the same world size works
        if (plan.world_size % (tp * pp) == 0 && peak_bytes(v, plan.world_size) >= 0) world = plan.world_size;
        const int64_t peak = peak_bytes(v, world);
        if (peak < 0 || double(peak) > limit) continue;
        std::string note = "TP " + std::to_string(tp) + " x PP " + std::to_string(pp) + " x DP " +
                           std::to_string(world / (tp * pp)) + " = " + std::to_string(world) + " ranks";
        if (!pipeline && tp > plan.options.gpus_per_node) note += "; TP beyond one node crosses the inter-node network";
        const std::string key =
            pipeline ? "parallel.pipeline_model_parallel_size=" : "parallel.tensor_model_parallel_size=";
        out.push_back({key + std::to_string(n) + (mode != rc ? " training.recompute=" + name_of(mode) : ""), note, peak, true});
        return;
      }
    out.push_back({pipeline ? "more pipeline stages" : "more tensor parallelism",
                   "no degree that the model allows fits, even with full recompute", -1, false});
  };
  grow(true);
  grow(false);
  // Context parallelism: the smallest CP (powers of two) that fits on the same world (DP shrinks);
  // per rank the activations and scratch shrink by CP, which TP, PP and recompute cannot do for the
  // per-token tensors of a long sequence
  auto act_gib = [](const Config& v) {
    return double(stage_memory(v, 0).activation_bytes + stage_memory(v, 0).workspace_bytes) / 1073741824.0;
  };
  for (Recompute mode : {rc, Recompute::Full}) {
    bool found = false;
    for (int cp = plan.cp * 2; cp <= 64 && !found; cp *= 2) {
      Config v = with_recompute(c, mode);
      v.parallel.context_parallel_size = cp;
      const int64_t peak = peak_bytes(v, plan.world_size);
      if (peak < 0 || double(peak) > limit) continue;
      v.parallel.data_parallel_size = 0;  // derived again for the new grid
      resolve_parallel(v, plan.world_size);
      char note[320];
      std::snprintf(note, sizeof(note),
                    "TP %d x CP %d x PP %d x DP %d = %d ranks; activations + scratch of stage 0: %.1f GiB per rank "
                    "(%.1f GiB at CP %d: they grow with model.seq_length %d and only CP splits the sequence)",
                    plan.tp, cp, plan.pp, v.parallel.data_parallel_size, plan.world_size, act_gib(v), act_gib(c),
                    plan.cp, c.model.seq_length);
      out.push_back({"parallel.context_parallel_size=" + std::to_string(cp) +
                         (mode != rc ? " training.recompute=" + name_of(mode) : ""),
                     note, peak, true});
      found = true;
    }
    if (found || mode == Recompute::Full) break;
  }
  // Megatron's memory switches: the distributed optimizer (fp32 master weights and Adam moments
  // sharded over DP: 6 + 12/DP bytes per parameter in bf16) and sequence parallelism (the
  // LayerNorm / residual activations split over TP), alone, together, and with full recompute
  const ParallelConfig& par = c.parallel;
  std::vector<std::pair<std::string, Config>> switches;
  Config v = c;
  std::string change;
  if (!par.distributed_optimizer && plan.dp > 1) {
    v.parallel.distributed_optimizer = true;
    change = "parallel.distributed_optimizer=true";
    switches.push_back({change, v});
  }
  if (!par.sequence_parallel && plan.tp > 1 && c.model.seq_length % plan.tp == 0) {
    Config sp = c;
    sp.parallel.sequence_parallel = true;
    switches.push_back({"parallel.sequence_parallel=true", sp});
    v.parallel.sequence_parallel = true;
    change += (change.empty() ? "" : " ") + std::string("parallel.sequence_parallel=true");
    if (switches.size() == 2) switches.push_back({change, v});
  }
  bool fits = false;
  for (const auto& [what, cfg] : switches) fits = add(what, "", cfg, plan.world_size) || fits;
  if (!fits && !change.empty() && rc != Recompute::Full)
    add(change + " training.recompute=full", "", with_recompute(v, Recompute::Full), plan.world_size);
  // FP8 training: FP8 parameters in place of the FP8 layers' 16-bit weight copy
  // (the same losses; docs/FP8.md "FP8 parameters"), with the distributed optimizer they are cast from
  const bool fp8_params = fp8_param_gather_allowed(c);
  Config f = c;
  std::string fp8_change;
  if (fp8_params && !c.training.fp8_param_gather) {
    f.training.fp8_param_gather = true;
    f.parallel.distributed_optimizer = true;
    fp8_change = std::string(par.distributed_optimizer ? "" : "parallel.distributed_optimizer=true ") +
                 "training.fp8_param_gather=true";
    add(fp8_change, "the FP8 layers' GEMM weights kept as FP8 codes only, no 16-bit copy: the same losses", f,
        plan.world_size);
  }
  // bf16 runs: the optimizer's storage options (plan --search's memory levels), cheapest first, each
  // with the ones before it; FP8 runs from FP8 parameters, which take the remainders' place
  if (c.training.precision == Precision::BF16) {
    Config m = fp8_params ? f : c;
    std::string keys = fp8_change;
    auto level = [&](bool needed, const std::string& key, const std::string& note, auto&& set) {
      if (!needed) return;
      set(m);
      keys += (keys.empty() ? "" : " ") + key;
      add(keys, note, m, plan.world_size);
    };
    const OptimizerConfig& o = c.optimizer;
    level(!fp8_params && !o.store_param_remainders, "optimizer.store_param_remainders=true",
          "the fp32 master weights as the bf16 weights + 2-byte remainders: exact",
          [](Config& x) { x.optimizer.store_param_remainders = true; });
    level(!bf16_grads(c), "parallel.grad_reduce_in_bf16=true",
          fp8_params ? "and the bf16 gradient buffer: rounds the gradients to bf16"
                     : "and the bf16 gradient buffer (NeMo 24.09's pair): rounds the gradients to bf16",
          [](Config& x) { x.parallel.grad_reduce_in_bf16 = true; });
    level(o.exp_avg_dtype != StateDType::BF16 || o.exp_avg_sq_dtype != StateDType::BF16,
          "optimizer.use_precision_aware_optimizer=true optimizer.exp_avg_dtype=bf16 optimizer.exp_avg_sq_dtype=bf16",
          "and bf16 Adam moments: rounded each step", [](Config& x) {
            x.optimizer.use_precision_aware_optimizer = true;
            x.optimizer.exp_avg_dtype = x.optimizer.exp_avg_sq_dtype = StateDType::BF16;
          });
  }
  return out;
}

}  // namespace tpt
