// tptrain plan --search (see plan/search.h).
#include "plan/search.h"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "core/error.h"
#include "model/chunks.h"

namespace tpt {

namespace {

constexpr double kGiB = 1073741824.0;

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// Context-parallel sizes worth trying: 1, and the powers of two that leave every CP rank's two chunks
// at least 1024 tokens each (Megatron's CP is for long sequences: 8192 tokens gives 2 and 4).
std::vector<int> context_parallel_sizes(int64_t seq_length) {
  std::vector<int> out = {1};
  for (int cp = 2; cp <= 64 && seq_length / (2 * cp) >= 1024; cp *= 2) out.push_back(cp);
  return out;
}

// The layout of an entry on the base config (what its --set arguments select).
Config apply(const Config& base, const SearchEntry& e) {
  Config c = base;
  ParallelConfig& p = c.parallel;
  p.tensor_model_parallel_size = e.tp;
  p.pipeline_model_parallel_size = e.pp;
  p.data_parallel_size = e.dp;
  p.context_parallel_size = e.cp;
  p.virtual_pipeline_model_parallel_size = e.v > 1 ? e.v : 0;
  p.pipeline_schedule = e.schedule;
  p.sequence_parallel = e.sequence_parallel;
  p.distributed_optimizer = e.distributed_optimizer;
  p.overlap_grad_reduce = e.dp * e.cp > 1;
  p.overlap_param_gather = e.distributed_optimizer;
  if (e.etp > 0) p.expert_model_parallel_size = e.ep, p.expert_tensor_parallel_size = e.etp;
  c.training.micro_batch_size = e.micro_batch_size;
  c.training.recompute = e.recompute;
  if (e.modules) {
    c.training.recompute_modules.layernorm = true;
    c.training.recompute_modules.moe_act = e.modules == 1 && c.model.is_moe();
    c.training.recompute_modules.moe = e.modules == 2 && c.model.is_moe();
    c.training.recompute_modules.mlp = e.modules == 2 && !c.model.is_moe();
  }
  if (e.memory_options >= 1) (e.fp8_params ? c.training.fp8_param_gather : c.optimizer.store_param_remainders) = true;
  if (e.memory_options >= 2) c.parallel.grad_reduce_in_bf16 = true;
  if (e.memory_options >= 3) {
    c.optimizer.use_precision_aware_optimizer = true;
    c.optimizer.exp_avg_dtype = c.optimizer.exp_avg_sq_dtype = StateDType::BF16;
  }
  return c;
}

// The memory options a bf16 config can still take (SearchEntry::memory_options), 0 if none: the highest
// level that adds something the config does not already set (a level adds its option to the lower ones');
// fp8_params: level 1 is FP8 parameters (SearchEntry::fp8_params), not the remainders.
int max_memory_options(const Config& c, bool fp8_params) {
  if (c.training.precision != Precision::BF16) return 0;
  const OptimizerConfig& o = c.optimizer;
  if (o.exp_avg_dtype != StateDType::BF16 || o.exp_avg_sq_dtype != StateDType::BF16) return 3;
  const bool exact = fp8_params ? c.training.fp8_param_gather : o.store_param_remainders;
  return !bf16_grads(c) ? 2 : !exact ? 1 : 0;
}

// the modules' --set argument (no spaces: the text report's --set lines go to a shell as they are)
std::vector<std::string> module_names(const SearchEntry& e) {
  if (e.modules == 2) return {"core_attn", "layernorm", e.etp > 0 ? "moe" : "mlp"};
  if (e.modules == 1) return e.etp > 0 ? std::vector<std::string>{"core_attn", "moe_act", "layernorm"}
                                       : std::vector<std::string>{"core_attn", "layernorm"};
  return {};
}
std::string modules_argument(const SearchEntry& e) {
  std::string s = "training.recompute_modules=[";
  for (const std::string& n : module_names(e)) s += (s.back() == '[' ? "" : ",") + n;
  return s + "]";
}

std::vector<std::string> set_arguments(const SearchEntry& e) {
  auto b = [](bool x) { return std::string(x ? "true" : "false"); };
  std::vector<std::string> experts;
  if (e.etp > 0)
    experts = {"parallel.expert_model_parallel_size=" + std::to_string(e.ep),
               "parallel.expert_tensor_parallel_size=" + std::to_string(e.etp)};
  std::vector<std::string> sets = {"parallel.tensor_model_parallel_size=" + std::to_string(e.tp),
          "parallel.pipeline_model_parallel_size=" + std::to_string(e.pp),
          "parallel.data_parallel_size=" + std::to_string(e.dp),
          "parallel.context_parallel_size=" + std::to_string(e.cp),
          "parallel.virtual_pipeline_model_parallel_size=" + (e.v > 1 ? std::to_string(e.v) : std::string("null")),
          "parallel.pipeline_schedule=" + name_of(e.schedule),
          "parallel.sequence_parallel=" + b(e.sequence_parallel),
          "parallel.distributed_optimizer=" + b(e.distributed_optimizer),
          "parallel.overlap_grad_reduce=" + b(e.dp * e.cp > 1),
          "parallel.overlap_param_gather=" + b(e.distributed_optimizer),
          "training.micro_batch_size=" + std::to_string(e.micro_batch_size),
          "training.recompute=" + name_of(e.recompute)};
  sets.insert(sets.begin() + 1, experts.begin(), experts.end());
  if (e.modules) sets.push_back(modules_argument(e));
  if (e.memory_options >= 1)
    sets.push_back(e.fp8_params ? "training.fp8_param_gather=true" : "optimizer.store_param_remainders=true");
  if (e.memory_options >= 2) sets.push_back("parallel.grad_reduce_in_bf16=true");
  if (e.memory_options >= 3)
    for (const char* s : {"optimizer.use_precision_aware_optimizer=true", "optimizer.exp_avg_dtype=bf16",
                          "optimizer.exp_avg_sq_dtype=bf16"})
      sets.push_back(s);
  return sets;
}

// (EP, ETP) of an MoE model on a stage of tp x cp x dp ranks: EP dividing the experts, ETP 1 or TP,
// ETP x EP dividing the ranks; (1, 0) for a dense model.
std::vector<std::pair<int, int>> expert_grids(const ModelConfig& m, int tp, int cp, int dp) {
  if (!m.is_moe()) return {{1, 0}};
  std::vector<std::pair<int, int>> out;
  const std::vector<int> etps = tp > 1 ? std::vector<int>{1, tp} : std::vector<int>{1};
  for (int ep : divisors(m.num_moe_experts))
    for (int etp : etps)
      if ((int64_t(tp) * cp * dp) % (int64_t(etp) * ep) == 0) out.push_back({ep, etp});
  return out;
}

// Sort key: the step time, then the layout's text, so that equal estimates keep one order.
bool faster(const SearchEntry& a, const SearchEntry& b) {
  if (a.time.step_s != b.time.step_s) return a.time.step_s < b.time.step_s;
  return a.layout() < b.layout();
}

}  // namespace

std::string SearchEntry::layout() const {
  std::string s = "TP" + std::to_string(tp) +
                  (etp > 0 ? " EP" + std::to_string(ep) + " ETP" + std::to_string(etp) : std::string()) +
                  (cp > 1 ? " CP" + std::to_string(cp) : std::string()) + " PP" + std::to_string(pp) + " DP" +
                  std::to_string(dp);
  if (v > 1) s += " v" + std::to_string(v);
  s += " mbs" + std::to_string(micro_batch_size) + " " + name_of(schedule) + " " + name_of(recompute);
  for (const std::string& n : module_names(*this))
    if (n != "core_attn") s += "+" + n;
  if (sequence_parallel) s += " SP";
  if (distributed_optimizer) s += " DO";
  if (memory_options >= 1) s += fp8_params ? " +P8" : " +R";
  if (memory_options >= 2) s += "+G16";
  if (memory_options >= 3) s += "+M16";
  return s;
}

SearchResult search_layouts(const Config& cfg, const PlanOptions& options, int gpus) {
  SearchResult r;
  const RecomputeModules& rm = cfg.training.recompute_modules;
  // else the configured ones: the recipe's (1), and layernorm with mlp (dense) or moe (MoE) (2)
  const int searched_modules = rm.layernorm || rm.moe_act || rm.moe || rm.mlp || rm.shared_experts ? 0 : 2;
  r.base = cfg;
  r.options = options;
  r.gpus = gpus;
  const ModelConfig& m = cfg.model;
  const int G = cfg.training.global_batch_size;
  if (G <= 0) input_error("tptrain plan --search: training.global_batch_size is null (the search keeps the global batch: give it)");
  const double limit = options.usable_memory_fraction * options.device_memory_gib * kGiB;
  const int gpn = options.gpus_per_node;
  ScheduleCache cache;
  RankLayoutCache layouts;
  for (int tp : divisors(query_groups(m))) {
    // TP within a node (a group of consecutive ranks that tiles it), dividing heads, groups and the FFN
    if (tp > gpn || gpn % tp != 0 || gpus % tp != 0 || m.num_attention_heads % tp != 0 || m.ffn_hidden_size % tp != 0)
      continue;
    for (int pp : divisors(m.num_layers))
    for (int cp : context_parallel_sizes(m.seq_length)) {
      if (gpus % (tp * cp * pp) != 0) {
        ++r.grids_not_dividing_gpus;
        continue;
      }
      const int dp = gpus / (tp * cp * pp);
      if (G % dp != 0) {
        ++r.dp_not_dividing_batch;
        continue;
      }
      for (const auto& [ep, etp] : expert_grids(m, tp, cp, dp))
      for (int mbs : divisors(G / dp)) {
        if (mbs > 16) break;
        const int M = G / dp / mbs;
        // (schedule, chunks): 1F1B, ZB-H1, interleaved with every chunk count dividing the stage's layers
        std::vector<std::pair<PipelineSchedule, int>> schedules = {{PipelineSchedule::OneFOneB, 1}};
        if (pp > 1) {
          schedules.push_back({PipelineSchedule::ZeroBubbleH1, 1});
          if (M % pp == 0)
            for (int v : divisors(m.num_layers / pp))
              if (v > 1) schedules.push_back({PipelineSchedule::OneFOneB, v});
        }
        for (const auto& [schedule, v] : schedules)
          for (bool sp : {false, true}) {
            if (sp && (tp == 1 || m.seq_length % tp != 0)) continue;
            if (cp > 1 && m.seq_length % (2 * cp * (sp ? tp : 1)) != 0) continue;
            for (bool dist : {false, true}) {
              // the distributed optimizer where its states have replicas to shard over: DP x CP, or an
              // MoE model's experts' EDP (TP x CP x DP / (ETP x EP)); FP8 parameters need it always
              const bool replicas = dp * cp > 1 || (etp > 0 && tp * cp * dp / (etp * ep) > 1);
              if (cfg.training.fp8_param_gather ? !dist : dist && !replicas) continue;
              // level 1's exact option: FP8 parameters where they are allowed and the dense weights have
              // replicas (at DP x CP 1 the remainders, unsharded, save more), else the remainders
              const bool fp8_params =
                  dist && fp8_param_gather_allowed(cfg) && (dp * cp > 1 || cfg.training.fp8_param_gather);
              const int max_level = max_memory_options(cfg, fp8_params);
              SearchEntry e;
              e.tp = tp, e.pp = pp, e.dp = dp, e.cp = cp, e.v = v, e.micro_batch_size = mbs, e.num_microbatches = M;
              e.ep = ep, e.etp = etp;
              e.schedule = schedule, e.sequence_parallel = sp, e.distributed_optimizer = dist;
              e.fp8_params = fp8_params;
              e.recompute = Recompute::Selective;  // valid with every schedule; the memory holds all three modes
              Config c = apply(cfg, e);
              r.considered += (schedule == PipelineSchedule::ZeroBubbleH1 ? 2 : 3) + searched_modules;
              try {
                resolve_parallel(c, gpus);
                check_plannable(c);
              } catch (const InputError&) {
                continue;
              }
              // the stages' memory per memory-option level, without and with the recompute modules:
              // level 0 planned in full when a mode first needs it, the others (which change only the
              // model state's bytes) from it; FP8 parameters change the layout and the workspace too:
              // their level 1 planned in full, the levels above it from it
              std::vector<std::vector<StageMemory>> stages_by_level[3];
              for (auto& v : stages_by_level) v.resize(size_t(max_level + 1));
              std::function<const std::vector<StageMemory>&(int, int)> stages_at = [&](int level, int mod)
                  -> const std::vector<StageMemory>& {
                std::vector<StageMemory>& st = stages_by_level[mod][size_t(level)];
                if (st.empty()) {
                  SearchEntry y = e;
                  y.memory_options = level;
                  y.modules = mod;
                  const Config cl = apply(c, y);
                  const int planned = e.fp8_params && level >= 1 ? 1 : 0;
                  if (level == planned) {
                    for (int s = 0; s < pp; ++s) st.push_back(stage_memory(cl, s, true, &layouts));
                  } else {
                    st = stages_at(planned, mod);
                    for (StageMemory& m : st) set_model_state_bytes(cl, m);
                  }
                }
                return st;
              };
              std::vector<std::pair<Recompute, int>> modes = {{Recompute::None, 0}, {Recompute::Selective, 0}};
              for (int mod = 1; mod <= searched_modules; ++mod) modes.push_back({Recompute::Selective, mod});
              modes.push_back({Recompute::Full, 0});
              for (const auto& [mode, mod] : modes) {
                if (mode == Recompute::Full && schedule == PipelineSchedule::ZeroBubbleH1) continue;
                ++r.valid;
                SearchEntry x = e;
                x.recompute = mode;
                x.modules = mod;
                for (int level = 0; level <= max_level; ++level) {  // the cheapest options that fit
                  x.memory_options = level;
                  x.stage_bytes.clear();
                  for (const StageMemory& st : stages_at(level, mod))
                    x.stage_bytes.push_back(st.total_bytes() - st.activation_bytes - st.workspace_bytes +
                                            st.activation_and_workspace_by_mode[int(mode)]);
                  x.peak_bytes = *std::max_element(x.stage_bytes.begin(), x.stage_bytes.end());
                  if (double(x.peak_bytes) <= limit) break;
                }
                if (double(x.peak_bytes) > limit) continue;
                Config cx = apply(c, x);
                x.time = estimate_step_time(cx, options.hw, gpn, stages_at(x.memory_options, mod), cache);
                x.sets = set_arguments(x);
                r.entries.push_back(std::move(x));
              }
            }
          }
      }
    }
  }
  std::sort(r.entries.begin(), r.entries.end(), faster);
  return r;
}

nlohmann::json step_time_json(const StepTime& t) {
  return {{"step_time_s", t.step_s},         {"pipeline_s", t.pipeline_s},
          {"ideal_s", t.ideal_s},            {"bubble_s", t.bubble_s},
          {"gemm_s", t.gemm_s},              {"attention_s", t.attention_s},
          {"elementwise_s", t.elementwise_s}, {"tp_comm_s", t.tp_comm_s}, {"cp_comm_s", t.cp_comm_s},
          {"ep_comm_s", t.ep_comm_s},
          {"recompute_s", t.recompute_s},    {"p2p_per_message_s", t.p2p_per_message_s},
          {"dp_comm_s", t.dp_comm_s},        {"dp_exposed_s", t.dp_exposed_s},
          {"optimizer_s", t.optimizer_s},    {"exposed_comm_s", t.exposed_comm_s},
          {"tokens_per_s", t.tokens_per_s},  {"mfu", t.mfu},
          {"model_tflops_per_gpu", t.model_tflops_per_gpu}};
}

nlohmann::json hardware_json(const Hardware& h, int gpus_per_node) {
  return {{"gpu", h.name},
          {"peak_tflops", h.peak_tflops},
          {"hbm_gbps", h.hbm_gbps},
          {"sms", h.sms},
          {"compute_efficiency", h.gemm_efficiency},
          {"attention_efficiency", h.attention_efficiency},
          {"cp_fallback_slowdown", h.cp_fallback_slowdown},
          {"hbm_efficiency", h.hbm_efficiency},
          {"kernel_overhead_us", h.kernel_overhead_us},
          {"intra_node_gbps", h.nvlink_gbps},
          {"intra_node_latency_us", h.nvlink_latency_us},
          {"inter_node_gbps", h.network_gbps},
          {"inter_node_latency_us", h.network_latency_us},
          {"gpus_per_node", gpus_per_node},
          {"moe_imbalance", h.moe_imbalance}};
}

std::string describe_hardware(const Hardware& h, int gpus_per_node) {
  char buf[512], factor[64] = "";
  if (h.moe_imbalance != 1) std::snprintf(factor, sizeof(factor), "; MoE load imbalance x%.3g", h.moe_imbalance);
  const std::string imbalance = factor;
  std::snprintf(buf, sizeof(buf),
                "%s, %.0f TFLOP/s peak: GEMMs up to %.0f%% of it (by shape), flash attention %.0f%%; HBM %.0f GB/s at "
                "%.0f%%; %.0f us per kernel; %d GPUs per node: NVLink %.0f GB/s + %.0f us per ring step, across "
                "nodes %.0f GB/s + %.0f us%s",
                h.name.c_str(), h.peak_tflops, 100 * h.gemm_efficiency, 100 * h.attention_efficiency, h.hbm_gbps,
                100 * h.hbm_efficiency, h.kernel_overhead_us, gpus_per_node, h.nvlink_gbps, h.nvlink_latency_us,
                h.network_gbps, h.network_latency_us,
                imbalance.c_str());
  return buf;
}

nlohmann::json search_json(const SearchResult& r, int top) {
  nlohmann::json layouts = nlohmann::json::array();
  const size_t n = top > 0 ? std::min(r.entries.size(), size_t(top)) : r.entries.size();
  for (size_t i = 0; i < n; ++i) {
    const SearchEntry& e = r.entries[i];
    layouts.push_back({{"rank", i + 1},
                       {"layout", e.layout()},
                       {"tp", e.tp},
                       {"pp", e.pp},
                       {"dp", e.dp}, {"cp", e.cp}, {"ep", e.ep}, {"etp", e.etp > 0 ? e.etp : e.tp},
                       {"virtual_stages", e.v},
                       {"micro_batch_size", e.micro_batch_size},
                       {"num_microbatches", e.num_microbatches},
                       {"pipeline_schedule", name_of(e.schedule)},
                       {"recompute", name_of(e.recompute)},
                       {"recompute_modules", module_names(e)},
                       {"sequence_parallel", e.sequence_parallel},
                       {"distributed_optimizer", e.distributed_optimizer},
                       {"memory_options", e.memory_options},
                       {"fp8_param_gather", (e.fp8_params && e.memory_options >= 1) || r.base.training.fp8_param_gather},
                       {"stage_bytes", e.stage_bytes},
                       {"peak_bytes", e.peak_bytes},
                       {"bubble_fraction", e.time.bubble_s / e.time.pipeline_s},
                       {"time", step_time_json(e.time)},
                       {"set", e.sets}});
  }
  return {{"gpus", r.gpus},
          {"global_batch_size", r.base.training.global_batch_size},
          {"seq_length", r.base.model.seq_length},
          {"device_memory_bytes", r.options.device_memory_gib * kGiB},
          {"usable_memory_fraction", r.options.usable_memory_fraction},
          {"hardware", hardware_json(r.options.hw, r.options.gpus_per_node)},
          {"layouts_considered", r.considered}, {"grids_not_dividing_gpus", r.grids_not_dividing_gpus},
          {"dp_not_dividing_batch", r.dp_not_dividing_batch},
          {"layouts_valid", r.valid},
          {"layouts_fit", r.entries.size()},
          {"layouts", layouts}};
}

}  // namespace tpt
