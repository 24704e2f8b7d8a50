// tptrain plan (options: add_plan_command below, tptrain plan --help).
// Memory, FLOPs and time of a config on its grid (plan/memory.h), without MPI or a GPU: a plain
// process that never calls runtime_init.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/config.h"
#include "core/error.h"
#include "data/run_data.h"
#include "model/gpt.h"
#include "model/layers.h"
#include "plan/calibrate.h"
#include "plan/memory.h"
#include "plan/search.h"

namespace tpt {

namespace {

struct PlanArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  PlanOptions options;
  bool json = false;
  // the step-time model's hardware: --gpu's preset, then each option given (NaN: not given)
  std::string gpu = "h100";
  double device_memory_gib = NAN, peak_tflops = NAN, hbm_gbps = NAN, intra_gbps = NAN, inter_gbps = NAN;
  double gemm_eff = NAN, fp8_gemm_eff = NAN, attn_eff = NAN, hbm_eff = NAN, intra_lat = NAN, inter_lat = NAN, overhead = NAN, moe_imbalance = NAN;
  // --search / --calibrate
  bool search = false;
  int gpus = 0, top = 10;
  std::string calibrate;
};

// The hardware of the options: the preset of --gpu, each given option on top.
void resolve_hardware(PlanArgs& a) {
  Hardware& h = a.options.hw;
  h = hardware_preset(a.gpu);
  auto set = [](double& field, double given) {
    if (!std::isnan(given)) field = given;
  };
  a.options.device_memory_gib = h.memory_gib;
  set(a.options.device_memory_gib, a.device_memory_gib);
  set(h.peak_tflops, a.peak_tflops);
  set(h.hbm_gbps, a.hbm_gbps);
  set(h.nvlink_gbps, a.intra_gbps);
  set(h.network_gbps, a.inter_gbps);
  set(h.gemm_efficiency, a.gemm_eff);
  set(h.fp8_gemm_efficiency, a.fp8_gemm_eff);
  set(h.attention_efficiency, a.attn_eff);
  set(h.hbm_efficiency, a.hbm_eff);
  set(h.nvlink_latency_us, a.intra_lat);
  set(h.network_latency_us, a.inter_lat);
  set(h.kernel_overhead_us, a.overhead);
  set(h.moe_imbalance, a.moe_imbalance);
}

constexpr double kGiB = 1073741824.0;
double gib(double bytes) { return bytes / kGiB; }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

std::string bytes(double b) {  // 1.50 GiB, 12.0 MiB, 3.2 KiB
  if (b >= kGiB) return fmt("%.2f GiB", b / kGiB);
  if (b >= 1048576.0) return fmt("%.2f MiB", b / 1048576.0);
  return fmt("%.1f KiB", b / 1024.0);
}

std::string count(double n) {  // 7.41B, 124.4M, 3.3K
  if (n >= 1e9) return fmt("%.2fB", n / 1e9);
  if (n >= 1e6) return fmt("%.2fM", n / 1e6);
  if (n >= 1e3) return fmt("%.1fK", n / 1e3);
  return fmt("%.0f", n);
}

// The schedule the trainer runs: "1f1b", "gpipe", "zb-h1", or "interleaved 1f1b v=4" (1f1b with
// parallel.virtual_pipeline_model_parallel_size > 1).
std::string schedule_that_runs(const ParallelConfig& par) {
  const int v = par.virtual_pipeline_model_parallel_size;
  if (v > 1) return "interleaved " + name_of(par.pipeline_schedule) + " v=" + std::to_string(v);
  return name_of(par.pipeline_schedule);
}

nlohmann::json to_json(const Plan& p, const Config& c) {
  using nlohmann::json;
  json stages = json::array();
  for (const StageMemory& m : p.stages) {
    const double limit = p.device_memory_bytes;
    stages.push_back({{"stage", m.stage},
                      {"layers", m.layers},
                      {"in_flight_microbatches", m.in_flight},
                      {"parameters_per_rank", m.parameters_per_rank},
                      {"parameter_buffer", m.parameter_buffer},
                      {"expert_parameters_per_rank", m.expert_parameters_per_rank},
                      {"expert_buffer", m.expert_buffer},
                      {"weight_bytes", m.weight_bytes},
                      {"gradient_bytes", m.gradient_bytes},
                      {"optimizer_bytes", m.optimizer_bytes},
                      {"activation_bytes", m.activation_bytes},
                      {"workspace_bytes", m.workspace_bytes},
                      {"buffer_bytes", m.buffer_bytes},
                      {"host_checkpoint_staging_bytes", m.checkpoint_staging_bytes},
                      {"tensor_bytes", m.tensor_bytes()},
                      {"backend_bytes", m.backend.total()},
                      {"backend", {{"gemm_workspace_bytes", m.backend.gemm},
                                   {"attention_workspace_bytes", m.backend.attention},
                                   {"scratch_bytes", m.backend.scratch},
                                   {"bias_grad_bytes", m.backend.bias_grad},
                                   {"fp8_gemm_workspace_bytes", m.backend.fp8},
                                   {"attention_workspace_bytes_by_deterministic",
                                    {{"true", m.attention_workspace_by_mode[0]}, {"false", m.attention_workspace_by_mode[1]}}}}},
                      {"total_bytes", m.total_bytes()},
                      {"fits", double(m.total_bytes()) <= limit},
                      {"total_bytes_by_recompute",
                       {{"none", m.total_bytes() - m.activation_bytes - m.workspace_bytes + m.activation_and_workspace_by_mode[0]},
                        {"selective", m.total_bytes() - m.activation_bytes - m.workspace_bytes + m.activation_and_workspace_by_mode[1]},
                        {"full", m.total_bytes() - m.activation_bytes - m.workspace_bytes + m.activation_and_workspace_by_mode[2]}}}});
  }
  json schedule_bubbles = json::array();
  for (const ScheduleBubble& b : p.schedule_bubbles)
    schedule_bubbles.push_back({{"schedule", b.name}, {"applies", b.why_not.empty()}, {"why_not", b.why_not},
                                {"bubble_over_ideal", b.bubble_over_ideal}, {"bubble_fraction", b.bubble_fraction}, {"max_in_flight", b.max_in_flight}});
  json sugg = json::array();
  for (const PlanSuggestion& s : p.suggestions)
    sugg.push_back({{"change", s.change}, {"note", s.note}, {"peak_bytes", s.peak_bytes}, {"fits", s.fits}});
  const PlanOptions& o = p.options;
  return {{"world_size", p.world_size},
          {"tp", p.tp},
          {"pp", p.pp},
          {"dp", p.dp},
          {"cp", p.cp},
          {"cp_comm_bytes", p.cp_comm_bytes},
          {"cp_attention_kernel", p.cp_attention_kernel},
          {"num_microbatches", p.num_microbatches},
          {"micro_batch_size", c.training.micro_batch_size},
          {"global_batch_size", c.training.global_batch_size},
          {"pipeline_schedule", name_of(c.parallel.pipeline_schedule)},
          {"precision", name_of(c.training.precision)},
          {"recompute", name_of(c.training.recompute)},
          {"device_memory_bytes", p.device_memory_bytes},
          {"total_parameters", p.total_parameters},
          {"expert_parameters", p.expert_parameters},
          {"active_parameters", p.active_parameters},
          {"ep", p.ep},
          {"edp", p.edp},
          {"ep_comm_bytes", p.ep_comm_bytes},
          {"padded_vocab_size", p.padded_vocab},
          {"flops_per_iteration", p.flops_per_iteration},
          {"hardware_flops_per_iteration", p.hardware_flops_per_iteration},
          {"bubble_fraction", p.bubble_fraction},
          {"bubble_fraction_analytic", p.bubble_fraction_analytic},
          {"schedule_bubbles", schedule_bubbles},
          {"tp_comm_bytes", p.tp_comm_bytes},
          {"pp_comm_bytes", p.pp_comm_bytes},
          {"dp_comm_bytes", p.dp_comm_bytes},
          {"pipeline_time_s", p.pipeline_time_s},
          {"dp_time_s", p.dp_time_s},
          {"optimizer_time_s", p.optimizer_time_s},
          {"step_time_s", p.step_time_s},
          {"tokens_per_s", p.tokens_per_s},
          {"mfu", p.mfu},
          {"fits", p.fits},
          {"time", step_time_json(p.time)},
          {"assumptions", hardware_json(o.hw, o.gpus_per_node)},
          {"stages", stages},
          {"suggestions", sugg}};
}

void print_report(const Plan& p, const Config& c, const std::string& path) {
  const ModelConfig& m = c.model;
  const PlanOptions& o = p.options;
  const std::string grads = bf16_grads(c) ? "bf16" : "fp32";
  const std::string dp_sync = c.parallel.distributed_optimizer && p.dp > 1
                                  ? "reduce-scatter of the " + grads +
                                        " gradients + all-gather of the parameters (distributed optimizer)"
                                  : "all-reduce of the " + grads + " gradients";
  std::printf("tptrain plan | config %s\n", path.c_str());
  std::printf("model: GPT %d layers, hidden %d, %d heads, ffn %d, seq %d, vocab %d (padded %lld): %s parameters; %s\n",
              m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_hidden_size, m.seq_length, m.vocab_size,
              (long long)p.padded_vocab, count(double(p.total_parameters)).c_str(), describe_architecture(m).c_str());
  const std::string cp_axis = p.cp > 1 ? " x CP " + std::to_string(p.cp) : std::string();
  const char* rank_formula = p.cp > 1 ? "tp + TP*(cp + CP*(dp + DP*pp))" : "tp + TP*(dp + DP*pp)";
  std::printf("grid: TP %d%s x PP %d x DP %d = %d ranks; rank = %s: stage s holds ranks "
              "[s*%d, (s+1)*%d), TP groups are %d adjacent ranks\n",
              p.tp, cp_axis.c_str(), p.pp, p.dp, p.world_size, rank_formula, p.tp * p.cp * p.dp, p.tp * p.cp * p.dp,
              p.tp);
  if (p.cp > 1) {
    // the calls of core/cuda/attention/ring_calls.h: a step's visible chunk pairs as one call, but in
    // cuDNN's deterministic backward (its workspace grows with the call's rows times its keys)
    const std::string kernel =
        p.cp_attention_kernel != "cudnn"
            ? "the fallback kernel (shared-memory tiles, no atomics; the step time prices it at its measured slowdown "
              "against flash attention, docs/PLAN.md)"
        : c.training.deterministic
            ? "cuDNN's SDPA (where libcudnn.so.9 loads): forward one call per ring step, backward one per pair of "
              "token chunks (training.deterministic: cuDNN's deterministic backward; one call per step with false)"
            : "cuDNN's SDPA (where libcudnn.so.9 loads): one call per ring step, forward and backward";
    std::printf("context parallel: CP %d: each CP rank holds %lld of a "
                "sequence's %d tokens (2 of %d chunks); the attention ring sends %s per rank per iteration; "
                "gradients reduced over DP x CP = %d; on GPUs its blocks run %s\n",
                p.cp, (long long)(m.seq_length / p.cp), m.seq_length, 2 * p.cp, bytes(double(p.cp_comm_bytes)).c_str(),
                p.dp * p.cp, kernel.c_str());
  }
  if (m.is_moe())
    std::printf("mixture of experts: %d experts (width %d) per MoE layer, top-%d: %s expert parameters, %s active per "
                "token; EP %d (each rank holds %d experts per layer), expert data-parallel EDP %d (the experts' "
                "gradients and distributed-optimizer shards); the dispatch sends %s per rank per iteration\n",
                m.num_moe_experts, m.moe_ffn_hidden_size, m.moe_router_topk, count(double(p.expert_parameters)).c_str(),
                count(double(p.active_parameters)).c_str(), p.ep, m.num_moe_experts / p.ep, p.edp,
                bytes(double(p.ep_comm_bytes)).c_str());
  std::printf("batch: global %d = micro-batch %d x %d micro-batches x DP %d; schedule %s; precision %s; "
              "recompute %s\n",
              c.training.global_batch_size, c.training.micro_batch_size, p.num_microbatches, p.dp,
              schedule_that_runs(c.parallel).c_str(), name_of(c.training.precision).c_str(),
              (name_of(c.training.recompute) + (c.training.recompute_modules.moe_act ? " +moe_act" : "") +
               (c.training.recompute_modules.layernorm ? " +layernorm" : "") +
               (c.training.recompute_modules.moe ? " +moe" : "") + (c.training.recompute_modules.mlp ? " +mlp" : "") +
               (c.training.recompute_modules.shared_experts ? " +shared_experts" : "")).c_str());
  const OptimizerConfig& opt = c.optimizer;
  const std::string masters = opt.store_param_remainders ? "master weights as the bf16 weights + 2-byte remainders"
                                                       : "master weights in fp32";
  const std::string moments = opt.exp_avg_dtype == StateDType::FP32 && opt.exp_avg_sq_dtype == StateDType::FP32
                                  ? "Adam moments in fp32"
                                  : "Adam moments in " + name_of(opt.exp_avg_dtype) + " / " + name_of(opt.exp_avg_sq_dtype);
  // FP8 layers with FP8 weight gradients keep some GEMM inputs as FP8 codes (GPTDims::fp8_saved_inputs)
  const std::string saved = fp8_saves_inputs(c)
                                ? " (in FP8 layers, the norms' and SwiGLU's outputs that only the weight gradients "
                                  "read are kept as FP8 codes: docs/FP8.md \"Saved inputs\")"
                                : "";
  std::printf("storage: every tensor in its own dtype -- activations%s, workspace, pipeline messages and the "
              "compute copy of the weights in the compute dtype; %s, gradients in %s, %s (what tptrain's "
              "backends allocate)\n\n",
              saved.c_str(), masters.c_str(), bf16_grads(c) ? "bf16 (reduced in bf16)" : "fp32", moments.c_str());
  // GiB for real models, MiB for the small CPU configs
  int64_t largest = 0;
  for (const StageMemory& s : p.stages) largest = std::max(largest, s.total_bytes());
  const bool in_gib = double(largest) >= kGiB;
  const char* unit = in_gib ? "GiB" : "MiB";
  auto u = [&](double bytes) { return in_gib ? gib(bytes) : bytes / 1048576.0; };
  auto verdict = [&](double total) {
    return total > p.device_memory_bytes ? "NO" : total > 0.95 * p.device_memory_bytes ? "yes (tight)" : "yes";
  };
  std::printf("memory per rank (%s) of each pipeline stage; device memory %.1f GiB:\n", unit, gib(p.device_memory_bytes));
  std::printf("%5s %6s %12s %9s %8s %8s %9s %11s %9s %8s %8s %8s  %s\n", "stage", "layers", "params/rank", "in-flight",
              "weights", "grads", "optimizer", "activations", "workspace", "buffers", "backend", "total", "fits");
  for (const StageMemory& s : p.stages)
    std::printf("%5d %6lld %12s %9d %8.2f %8.2f %9.2f %11.2f %9.2f %8.3f %8.3f %8.2f  %s\n", s.stage, (long long)s.layers,
                count(double(s.parameters_per_rank)).c_str(), s.in_flight, u(double(s.weight_bytes)),
                u(double(s.gradient_bytes)), u(double(s.optimizer_bytes)), u(double(s.activation_bytes)),
                u(double(s.workspace_bytes)), u(double(s.buffer_bytes)), u(double(s.backend.total())),
                u(double(s.total_bytes())), verdict(double(s.total_bytes())));
  if (c.checkpoint.async_save)
    for (const StageMemory& s : p.stages)
      std::printf("host memory: stage %d: %.3f %s per writing rank of checkpoint.async_save staging (%lld bytes; "
                  "not device memory, page-locked on a GPU)\n",
                  s.stage, u(double(s.checkpoint_staging_bytes)), unit, (long long)s.checkpoint_staging_bytes);
  if (m.is_moe())
    for (const StageMemory& s : p.stages)
      std::printf("experts: stage %d holds %s expert parameters per rank of its %s (their buffer %.3f %s, over EDP %d)\n",
                  s.stage, count(double(s.expert_parameters_per_rank)).c_str(), count(double(s.parameters_per_rank)).c_str(),
                  u(double(s.expert_buffer * 4)), unit, p.edp);
  if (!p.stages.empty()) {
    const StageMemory& s0 = p.stages.front();
    std::printf("backend: the GPU backend's own buffers on stage 0: cuBLASLt workspace %.1f MiB, cuDNN attention "
                "workspace %.1f MiB (training.deterministic %s; %.1f MiB with %s), reduction scratch %.2f MiB, "
                "bias-gradient output %.3f MiB, FP8 GEMMs' transposes and block scales %.2f MiB\n",
                s0.backend.gemm / 1048576.0, s0.backend.attention / 1048576.0,
                c.training.deterministic ? "true" : "false",
                s0.attention_workspace_by_mode[c.training.deterministic ? 1 : 0] / 1048576.0,
                c.training.deterministic ? "false" : "true", s0.backend.scratch / 1048576.0, s0.backend.bias_grad / 1048576.0,
                s0.backend.fp8 / 1048576.0);
  }
  std::printf("by recompute mode: activations + workspace -> total per rank (%s); configured: %s\n", unit,
              name_of(c.training.recompute).c_str());
  std::printf("%5s %-32s %-32s %-32s\n", "stage", "  none", "  selective", "  full");
  for (const StageMemory& s : p.stages) {
    const double rest = double(s.total_bytes() - s.activation_bytes - s.workspace_bytes);
    std::printf("%5d", s.stage);
    for (int r = 0; r < 3; ++r) {
      const double a = double(s.activation_and_workspace_by_mode[r]);
      std::printf(" %8.2f -> %8.2f %-11s", u(a), u(a + rest), verdict(a + rest));
    }
    std::printf("\n");
  }
  std::printf("\nFLOPs per iteration: %.4g (model FLOPs, Megatron's formula as logged), %.4g computed (with recompute)\n",
              p.flops_per_iteration, p.hardware_flops_per_iteration);
  // one bubble everywhere (docs/PLAN.md "Bubble"): the busiest stage's idle share of the pipeline's time
  const StepTime& t = p.time;
  std::printf("pipeline bubble (%s): %.2f%% of the pipeline time by the step-time model (idle time and pipeline "
              "messages of the busiest stage, as --search); %.2f%% with unit costs (forward 1, backward 2, free "
              "communication); 1F1B's analytic (PP-1)/(M+PP-1) = %.2f%%\n",
              schedule_that_runs(c.parallel).c_str(), t.pipeline_s > 0 ? 100 * t.bubble_s / t.pipeline_s : 0.0,
              100 * p.bubble_fraction, 100 * p.bubble_fraction_analytic);
  if (!p.schedule_bubbles.empty()) {
    std::printf("schedules compared (simulated, forward = input gradient = weight gradient = 1 unit; bubble as "
                "above, activation slots on the busiest stage, an interleaved slot holding one chunk of 1/v of the "
                "stage's layers, a zb-h1 slot also its GEMMs' output gradients until W; set with "
                "parallel.virtual_pipeline_model_parallel_size / pipeline_schedule: zb-h1):");
    for (const ScheduleBubble& b : p.schedule_bubbles) {
      if (b.why_not.empty()) std::printf(" %s %.2f%% (%d slots);", b.name.c_str(), 100 * b.bubble_fraction, b.max_in_flight);
      else std::printf(" %s n/a (%s);", b.name.c_str(), b.why_not.c_str());
    }
    std::printf("\n");
  }
  std::printf("communication per rank per iteration: TP all-reduce %s, PP send %s, DP %s %s (payloads)\n",
              bytes(double(p.tp_comm_bytes)).c_str(), bytes(double(p.pp_comm_bytes)).c_str(), dp_sync.c_str(),
              bytes(double(p.dp_comm_bytes)).c_str());
  std::printf("step time estimate: %.4g s (pipeline %.4g + exposed DP / embedding sync %.4g + optimizer %.4g): "
              "%.0f tokens/s, %.4g TFLOP/s per rank, MFU %.1f%%\n",
              p.step_time_s, p.pipeline_time_s, p.dp_time_s, p.optimizer_time_s, p.tokens_per_s,
              t.model_tflops_per_gpu, 100 * p.mfu);
  std::printf("  busiest stage per iteration: GEMMs %.4g s, attention %.4g, elementwise %.4g, TP communication "
              "%.4g, CP ring %.4g, recompute %.4g; bubble %.4g s (incl. pipeline messages, %.3g ms each); DP communication %.4g s "
              "before overlap\n",
              t.gemm_s, t.attention_s, t.elementwise_s, t.tp_comm_s, t.cp_comm_s, t.recompute_s, t.bubble_s,
              1e3 * t.p2p_per_message_s, t.dp_comm_s);
  std::printf("  model: %s\n", describe_hardware(o.hw, o.gpus_per_node).c_str());
  if (p.fits) {
    std::printf("\nfits: yes, every stage fits in %.1f GiB (not counted: CUDA context, NCCL buffers, allocator "
                "fragmentation: a few GiB)\n",
                gib(p.device_memory_bytes));
    return;
  }
  std::printf("\nfits: NO");
  for (const StageMemory& s : p.stages)
    if (double(s.total_bytes()) > p.device_memory_bytes)
      std::printf("; stage %d needs %.2f GiB", s.stage, gib(double(s.total_bytes())));
  std::printf(" > %.1f GiB\nwhat would fit (peak GiB per rank over the stages):\n", gib(p.device_memory_bytes));
  for (const PlanSuggestion& s : p.suggestions)
    std::printf("  %-62s %8s  %s%s%s\n", s.change.c_str(), s.peak_bytes < 0 ? "-" : fmt("%.2f", gib(double(s.peak_bytes))).c_str(),
                s.fits ? "fits" : "does not fit", s.note.empty() ? "" : "  -- ", s.note.c_str());
}

void print_search(const SearchResult& r, int top, const std::string& path) {
  const ModelConfig& m = r.base.model;
  std::printf("tptrain plan --search | config %s | %d GPUs, %d per node, %.1f GiB each, layouts up to %.0f%% of it\n",
              path.c_str(), r.gpus, r.options.gpus_per_node, r.options.device_memory_gib, 100 * r.options.usable_memory_fraction);
  std::printf("model: %d layers, hidden %d, %d heads, seq %d; global batch %d sequences (%.3gM tokens); %s\n",
              m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length, r.base.training.global_batch_size,
              double(r.base.training.global_batch_size) * m.seq_length / 1e6, name_of(r.base.training.precision).c_str());
  std::printf("hardware: %s\n", describe_hardware(r.options.hw, r.options.gpus_per_node).c_str());
  std::printf("layouts: %lld enumerated, %lld valid, %zu fit; fastest first:\n\n", (long long)r.considered,
              (long long)r.valid, r.entries.size());
  if (r.considered == 0) {
    std::printf("no layout on %d GPUs: of the TP x CP x PP grids (TP dividing the heads, groups and FFN within a "
                "node, PP the layers), %lld do not divide %d GPUs and %lld leave a DP that does not divide the "
                "global batch of %d; try a GPU count with more divisors or a global batch that DP divides\n",
                r.gpus, (long long)r.grids_not_dividing_gpus, r.gpus, (long long)r.dp_not_dividing_batch,
                r.base.training.global_batch_size);
    return;
  }
  if (r.entries.empty()) {
    std::printf("no layout fits: more GPUs, more device memory, or a smaller micro-batch / global batch\n");
    return;
  }
  const size_t n = top > 0 ? std::min(r.entries.size(), size_t(top)) : r.entries.size();
  int width = 44;  // the layout column: as wide as the longest name shown
  for (size_t i = 0; i < n; ++i) width = std::max(width, int(r.entries[i].layout().size()));
  std::printf("%4s  %-*s %9s %9s %11s %6s %7s %9s\n", "#", width, "layout", "peak GiB", "step s", "tokens/s", "MFU",
              "bubble", "exp.comm");
  for (size_t i = 0; i < n; ++i) {
    const SearchEntry& e = r.entries[i];
    const StepTime& t = e.time;
    std::printf("%4zu  %-*s %9.2f %9.4g %11.0f %5.1f%% %6.1f%% %9.3g\n", i + 1, width, e.layout().c_str(),
                double(e.peak_bytes) / kGiB, t.step_s, t.tokens_per_s, 100 * t.mfu, 100 * t.bubble_s / t.pipeline_s,
                t.exposed_comm_s);
  }
  std::printf("\npeak GiB: the largest stage's total per rank (tptrain plan's memory); bubble: idle time and pipeline "
              "messages of the busiest stage, share of the pipeline time (as tptrain plan); exp.comm: TP communication + the CP ring + DP communication not hidden, seconds per step.\n"
              "SP: parallel.sequence_parallel, DO: parallel.distributed_optimizer (with overlap_param_gather); DP > 1 "
              "overlaps the gradient reduction. +R: needs optimizer.store_param_remainders to fit (exact), +R+G16: "
              "also the bf16 gradient buffer (parallel.grad_reduce_in_bf16: rounds per micro-batch and reduction), "
              "+R+G16+M16: also bf16 Adam moments (the precision-aware optimizer: rounds them each step)%s. Select one "
              "with:\n",
              r.base.training.fp8_format != Fp8Format::None
                  ? "; FP8 with DO: +P8 in place of +R, FP8 parameters (training.fp8_param_gather: the FP8 layers' "
                    "weights as codes only, exact)"
                  : "");
  for (size_t i = 0; i < n; ++i) {
    std::printf("%4zu ", i + 1);
    for (const std::string& s : r.entries[i].sets) std::printf(" --set %s", s.c_str());
    std::printf("\n");
  }
}

void print_calibration(const Calibration& c, const std::string& path) {
  const StepTime& t = c.plan.time;
  std::printf("tptrain plan --calibrate %s | TP %d x PP %d x DP %d = %d ranks\n", path.c_str(), c.plan.tp, c.plan.pp, c.plan.dp,
              c.plan.world_size);
  std::printf("measured:  %.4g s per iteration (median of %d logged iterations, the first left out when there are more)\n",
              c.measured_s, c.iterations);
  std::printf("estimated: %.4g s per iteration on %s; measured / estimated = %.3f\n", t.step_s,
              describe_hardware(c.plan.options.hw, c.plan.options.gpus_per_node).c_str(), c.measured_s / t.step_s);
  std::printf("estimate by component (busiest stage, per iteration; compare with the run's op profile, "
              "logging.profile_ops): GEMMs %.4g s, attention %.4g, elementwise %.4g, TP communication %.4g, CP ring %.4g, recompute "
              "%.4g, bubble %.4g, exposed DP %.4g, optimizer %.4g\n",
              t.gemm_s, t.attention_s, t.elementwise_s, t.tp_comm_s, t.cp_comm_s, t.recompute_s, t.bubble_s, t.dp_exposed_s,
              t.optimizer_s);
  if (c.compute_scale_found)
    std::printf("agreement: --compute-efficiency %.4g --attention-efficiency %.4g (the model's compute efficiencies x "
                "%.4g) make the estimate equal the measurement\n",
                c.calibrated.gemm_efficiency, c.calibrated.attention_efficiency, c.compute_scale);
  else
    std::printf("agreement: no compute efficiency in (0, 1] matches: the measured time is %s the estimate's "
                "non-compute part alone allows (check the communication and kernel-overhead options)\n",
                c.measured_s < t.step_s ? "below what" : "beyond what");
}

int plan_search(const PlanArgs& a) {
  const Config cfg = load_config(a.config_path, a.overrides);
  const ParallelConfig& par = cfg.parallel;
  const int gpus = a.gpus > 0 ? a.gpus
               : a.options.world_size > 0 ? a.options.world_size
               : par.tensor_model_parallel_size * par.pipeline_model_parallel_size * std::max(1, par.data_parallel_size);
  const SearchResult r = search_layouts(cfg, a.options, gpus);
  if (a.json) std::printf("%s\n", search_json(r, a.top).dump(2).c_str());
  else print_search(r, a.top, a.config_path);
  return 0;
}

int plan_calibrate(const PlanArgs& a) {
  const Config cfg = load_config(a.config_path, a.overrides);
  const Calibration cal = calibrate(cfg, a.options, read_iteration_times(a.calibrate));
  if (a.json) std::printf("%s\n", calibration_json(cal).dump(2).c_str());
  else print_calibration(cal, a.calibrate);
  return 0;
}

int plan_config(const PlanArgs& args) {
  Config cfg = load_config(args.config_path, args.overrides);
  Plan plan = make_plan(cfg, args.options);
  resolve_parallel(cfg, plan.world_size);  // for the batch sizes the report prints
  // the data (each blend component's documents, tokens, epochs covered by train_iters) when it can
  // be read here; the plan itself needs no data
  nlohmann::json data_json;
  std::vector<std::string> data_lines;
  try {
    const RunData data = open_run_data(cfg);
    data_json = run_data_json(data, cfg);
    data_lines = describe_run_data(data, cfg);
  } catch (const InputError& e) {
    data_json = {{"error", e.what()}};
    data_lines = {std::string("not read here (") + e.what() + ")"};
  }
  if (args.json) {
    nlohmann::json j = to_json(plan, cfg);
    j["data"] = data_json;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_report(plan, cfg, args.config_path);
    std::printf("\n");
    for (const std::string& line : data_lines) std::printf("data: %s\n", line.c_str());
  }
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("plan", "memory per rank, FLOPs, bubble and step time of a config (no MPI, no GPU)");
  cmd->footer("A plain process (no MPI launch, no GPU needed); bandwidths in GB/s (bytes). See docs/PLAN.md.");
  auto args = std::make_shared<PlanArgs>();
  PlanOptions& o = args->options;
  add_config_options(*cmd, args->config_path, args->overrides);
  cmd->add_option("--world-size", o.world_size, "ranks to plan for (1 to 16777216; default: TP x CP x PP x data_parallel_size, or TP x CP x PP when that is null)")
      ->check(integer_in(1, 1 << 24));
  const CLI::Validator positive = number_in(0, INFINITY, true), fraction = number_in(0, 1, true);
  PlanArgs& a = *args;
  cmd->add_option("--gpu", a.gpu, "the step-time model's hardware preset: h100 | h200 | a100 (default h100; the options "
                                  "below override its values)")
      ->check(CLI::IsMember({"h100", "h200", "a100"}));
  cmd->add_option("--device-memory-gib", a.device_memory_gib, "memory per GPU, GiB (> 0; default: the --gpu's, 80 / 141 / 80)")
      ->check(positive);
  cmd->add_option("--gpus-per-node", o.gpus_per_node, "GPUs per node sharing NVLink (1 to 1024)")
      ->check(integer_in(1, 1024))->capture_default_str();
  cmd->add_option("--peak-tflops", a.peak_tflops, "peak dense TFLOP/s per GPU in the compute dtype (> 0; h100/h200 989, a100 312)")
      ->check(positive);
  cmd->add_option("--hbm-gbps", a.hbm_gbps, "HBM bandwidth per GPU, GB/s (> 0; h100 3350, h200 4800, a100 2039)")->check(positive);
  cmd->add_option("--intra-node-gbps", a.intra_gbps, "achievable NVLink bus bandwidth of a collective within a node, GB/s (> 0; h100/h200 360, a100 230)")
      ->check(positive);
  cmd->add_option("--inter-node-gbps", a.inter_gbps, "achievable bus bandwidth per GPU across nodes, GB/s (> 0; h100/h200 45: one 400 Gbit/s NIC per GPU; a100 22)")
      ->check(positive);
  cmd->add_option("--intra-node-latency-us", a.intra_lat, "latency of a ring step within a node, microseconds (> 0; 8)")->check(positive);
  cmd->add_option("--inter-node-latency-us", a.inter_lat, "latency of a ring step across nodes, microseconds (> 0; 20)")->check(positive);
  cmd->add_option("--compute-efficiency", a.gemm_eff, "fraction of the peak a large GEMM reaches, in (0, 1] (h100/h200 0.78, a100 0.72)")
      ->check(fraction);
  cmd->add_option("--fp8-compute-efficiency", a.fp8_gemm_eff, "FP8 training: fraction of the FP8 peak (2x the bf16 "
                  "peak on h100/h200) a large FP8 GEMM reaches, in (0, 1] (0.55)")->check(fraction);
  cmd->add_option("--attention-efficiency", a.attn_eff, "fraction of the peak flash attention reaches, in (0, 1] (0.55)")->check(fraction);
  cmd->add_option("--hbm-efficiency", a.hbm_eff, "fraction of the HBM bandwidth elementwise kernels reach, in (0, 1] (0.8)")->check(fraction);
  cmd->add_option("--kernel-overhead-us", a.overhead, "time per kernel launch, microseconds (> 0; 4)")->check(positive);
  cmd->add_option("--moe-imbalance", a.moe_imbalance, "Mixture-of-Experts: the busiest EP rank's expert rows over the "
                  "balanced share, >= 1 (1: balanced); multiplies its expert GEMMs, permutation and all-to-all volume")
      ->check(number_in(1, 1e6, false));
  cmd->add_flag("--json", args->json, "the report as JSON");
  cmd->add_flag("--search", a.search, "the fastest layouts of the config's model and global batch on --gpus GPUs (docs/PLAN.md)");
  cmd->add_option("--gpus", a.gpus, "--search: GPUs to lay the model out on (1 to 16777216; default: the config's world size)")
      ->check(integer_in(1, 1 << 24));
  cmd->add_option("--usable-memory-fraction", o.usable_memory_fraction, "--search: keep layouts whose largest stage needs at "
                  "most this fraction of --device-memory-gib, in (0, 1] (the rest: CUDA context, NCCL buffers, fragmentation)")
      ->check(fraction)->capture_default_str();
  cmd->add_option("--top", a.top, "--search: layouts to print (0 to 1048576; 0: all that fit)")->check(integer_in(0, 1 << 20))->capture_default_str();
  cmd->add_option("--calibrate", a.calibrate, "a run's metrics file (logging.metrics_file, JSON lines): measured vs estimated "
                                              "iteration time and the efficiencies that would make them agree");
  return [args] {
    resolve_hardware(*args);
    if (args->search && !args->calibrate.empty()) input_error("tptrain plan: --search and --calibrate do not go together");
    if (args->search) return plan_search(*args);
    if (!args->calibrate.empty()) return plan_calibrate(*args);
    if (args->gpus != 0) input_error("tptrain plan: --gpus goes with --search (use --world-size for a plan)");
    return plan_config(*args);
  };
}

}  // namespace tpt
