// tptrain plan --search (docs/PLAN.md): the layouts of a config's model and global batch on N GPUs,
// pruned by the memory plan (plan/memory.h: what the trainer allocates; at most
// --usable-memory-fraction of the device) and ranked by the step-time model (plan/step_time.h); the
// JSON of a search, a step time and a hardware (apps/plan_cmd.cpp prints them).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "plan/memory.h"
#include "plan/step_time.h"

namespace tpt {

// One layout that fits, with its memory and time.
struct SearchEntry {
  int tp = 1, pp = 1, dp = 1, cp = 1, v = 1, micro_batch_size = 1, num_microbatches = 1;
  // Mixture-of-Experts: EP and ETP (0 for a dense model: neither is set nor shown)
  int ep = 1, etp = 0;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  Recompute recompute = Recompute::None;
  // selective recompute with the modules Megatron's recipes add (training.recompute_modules), searched
  // when the config lists none: 0 none; 1 layernorm, and for MoE moe_act; 2 layernorm and for a dense
  // model mlp (fc1's output and the activation rerun in backward), for MoE moe (each MoE layer's MLP
  // rerun before its backward: one set of kept rows for all layers)
  int modules = 0;
  bool sequence_parallel = false, distributed_optimizer = false;
  // The memory options the layout needs to fit, cheapest first (bf16 runs; none that the config
  // already sets): 1 optimizer.store_param_remainders (exact, free), or with fp8_params FP8 parameters;
  // 2 also the bf16 gradient buffer (parallel.grad_reduce_in_bf16: rounded per micro-batch and
  // reduction, costs accuracy; NeMo 24.09's choice with 1); 3 also the precision-aware optimizer's
  // bf16 Adam moments (rounded each step). 0: as configured.
  int memory_options = 0;
  // level 1 is FP8 parameters (training.fp8_param_gather: the FP8 layers' weights as codes, no 16-bit
  // copy; the same losses, NeMo's FP8 recipe) in place of the remainders, which they exclude: FP8
  // runs with the distributed optimizer and DP x CP > 1 where fp8_param_gather_allowed
  bool fp8_params = false;
  std::vector<int64_t> stage_bytes;  // total per rank of each stage
  int64_t peak_bytes = 0;
  StepTime time;
  std::vector<std::string> sets;     // the --set arguments that select it ("section.key=value")
  std::string layout() const;        // "TP4 PP6 DP8 v2 mbs1 1f1b selective SP DO"; MoE "TP2 EP8 ETP1 PP4 DP8 ...";
                                     // with the modules "selective+layernorm", "selective+layernorm+mlp" (MoE
                                     // "selective+moe_act+layernorm", "selective+layernorm+moe");
                                     // memory options: " +R" (remainders; " +P8" FP8 parameters),
                                     // " +R+G16" (and bf16 gradients), " +R+G16+M16" (and bf16 moments)
};

struct SearchResult {
  Config base;                       // the loaded config (model, batch, precision)
  PlanOptions options;
  int gpus = 0;
  int64_t considered = 0;            // layouts enumerated
  int64_t valid = 0;                 // of them a valid grid and schedule
  // why none was enumerated: (TP, CP, PP) choices whose product does not divide the GPUs, and those
  // whose DP does not divide the global batch
  int64_t grids_not_dividing_gpus = 0, dp_not_dividing_batch = 0;
  std::vector<SearchEntry> entries;  // those that fit, fastest first (ties: by layout())
};

// Every layout of cfg's model on `gpus` GPUs at its global batch: TP dividing the heads (the key/value
// groups with GQA) and the FFN within a node, PP dividing the layers, DP the rest, every micro-batch
// size dividing the batch per DP rank (up to 16), virtual stages (interleaved 1F1B), zb-h1, recompute
// none / selective / full (and selective with the layernorm and, for MoE, moe_act modules, and with
// layernorm and mlp, for MoE moe, where the config lists no module), sequence parallelism, the distributed optimizer (DP x CP > 1 or EDP > 1; DP overlaps on); for a
// Mixture-of-Experts model EP dividing the experts and ETP 1 or TP, with ETP x EP dividing the stage's
// TP x CP x DP ranks (Megatron's folding; resolve_parallel's rules decide which are valid). InputError
// when the config has no global batch or nothing is a valid layout.
SearchResult search_layouts(const Config& cfg, const PlanOptions& options, int gpus);
nlohmann::json search_json(const SearchResult& r, int top);  // top 0: all

nlohmann::json step_time_json(const StepTime& t);
nlohmann::json hardware_json(const Hardware& h, int gpus_per_node);
std::string describe_hardware(const Hardware& h, int gpus_per_node);

}  // namespace tpt
