// The Trainer's start-up report (rank 0): the model, the grid, the optimizer's storage, the backend,
// the schedule and the memory against the plan (docs/PLAN.md).
#include <spdlog/spdlog.h>

#include <string>

#include "plan/memory.h"
#include "train/trainer.h"

namespace tpt {

// Rank 0's start-up report: model, optimizer, backend, schedule, memory against the plan.
void Trainer::log_setup() {
  int64_t local = 0;
  for (const ParamInfo& p : layout_.params) local += p.numel;
  spdlog::info("model: GPT {} layers, hidden {}, {} heads, ffn {}, seq {}, vocab {} (padded {}): {:.2f}M parameters, "
               "{:.2f}M on rank 0; {}",
               cfg_.model.num_layers, cfg_.model.hidden_size, cfg_.model.num_attention_heads,
               cfg_.model.ffn_hidden_size, cfg_.model.seq_length, cfg_.model.vocab_size, dims_.Vp,
               total_parameters(cfg_) / 1e6, local / 1e6, describe_architecture(cfg_.model));
  if (cfg_.parallel.distributed_optimizer && !grad_sync_->distributed())
    spdlog::warn("WARNING: parallel.distributed_optimizer with data-parallel size 1: nothing to shard, the "
                 "optimizer runs as without it");
  if (grad_sync_->distributed())
    spdlog::info("distributed optimizer: {} master weights{} and Adam moments of {} of the {} elements of "
                 "rank 0's buffer ({} buckets; parameter all-gather {})", name_of(cfg_.optimizer.main_params_dtype),
                 master_sharded_ ? "" : " (the fp32 weights compute uses: whole)", grad_sync_->owned_size(),
                 buffer_total_, grad_sync_->num_buckets(),
                 cfg_.parallel.overlap_param_gather ? "overlapped with the next forward" : "after the step");
  if (cfg_.optimizer.use_precision_aware_optimizer)
    spdlog::info("optimizer: Adam moments stored as exp_avg {}, exp_avg_sq {}, master weights {} (the update in "
                 "fp32; optimizer.use_precision_aware_optimizer){}",
                 name_of(cfg_.optimizer.exp_avg_dtype), name_of(cfg_.optimizer.exp_avg_sq_dtype),
                 name_of(cfg_.optimizer.main_params_dtype),
                 state_dtypes(cfg_.optimizer).scaled()
                     ? "; fp16 states scaled per tensor by absmax / 32752 over the whole tensor"
                     : "");
  if (grads_.t == DType::BF16)
    spdlog::info("gradients: a bf16 buffer, each weight-gradient call and each reduction rounded to bf16 "
                 "(parallel.grad_reduce_in_bf16 / optimizer.main_grads_dtype)");
  if (remainders_)  // (the fp32 master weights, exact, in 2 bytes each besides the parameter)
    spdlog::info("master weights: the bf16 parameters + 16-bit remainders (optimizer.store_param_remainders)");
  const StageMemory plan = stage_memory(cfg_, grid_.pp_rank, on_gpu_);
  const std::string chunks = stages_.size() > 1 ? fmt::format(" (interleaved: {} model chunks per rank, {} layers each)",
                                                              stages_.size(), dims_.layer_end - dims_.layer_begin)
                                                : std::string();
  spdlog::info("backend: {}; {} micro-batches of {} per DP rank per iteration; pipeline schedule {}{} "
               "({} activation slots on stage 0)",
               ops_->name(), num_micro_, cfg_.training.micro_batch_size, name_of(cfg_.parallel.pipeline_schedule), chunks,
               plan.in_flight);
  if (dims_.sequence_parallel) {
    const int64_t N = int64_t(cfg_.training.micro_batch_size) * cfg_.model.seq_length;
    spdlog::info("sequence parallel: each of the {} TP ranks holds {} of a micro-batch's {} tokens in the "
                 "LayerNorm / residual regions (all-gather before, reduce-scatter after the TP-sharded GEMMs)",
                 grid_.tp, dims_.local_tokens(N), N);
  }
  if (grid_.cp > 1)
    spdlog::info("context parallel: each of the {} CP ranks holds {} of a sequence's {} tokens (chunks r and {} - r "
                 "of {}); attention as a ring over the CP group; gradients summed over DP x CP",
                 grid_.cp, dims_.S, cfg_.model.seq_length, 2 * grid_.cp - 1, 2 * grid_.cp);
  if (grid_.dp_cp_size() > 1)
    spdlog::info("DP gradient sync: {}", grad_sync_->overlapping()
                                            ? fmt::format("{} bucket(s) of >= {} elements, each started as soon "
                                                          "as the last micro-batch's backward has finished it",
                                                          grad_sync_->num_buckets(), cfg_.parallel.ddp_bucket_size)
                                            : std::string("one all-reduce after the pipeline"));
  spdlog::info("activation memory on rank 0: {:.2f} MiB kept for {} in-flight micro-batches + {:.2f} MiB scratch "
               "({} storage, recompute {})",
               double(plan.activation_bytes) / 1048576.0, plan.in_flight, double(plan.workspace_bytes) / 1048576.0,
               name_of(cfg_.training.precision), name_of(cfg_.training.recompute));
  if (cfg_.training.fp8_format != Fp8Format::None) {
    const TrainingConfig& t = cfg_.training;
    const auto [begin, end] = t.fp8_layer_range(cfg_.model.num_layers);
    const std::string recipe =
        t.fp8_recipe == Fp8Recipe::Delayed
            ? fmt::format("delayed (the last step's scales; amax history {}, {}; amaxes maximum over TP x DP x CP "
                          "after each step)", t.fp8_amax_history_len, t.fp8_amax_compute_algo)
        : t.fp8_recipe == Fp8Recipe::Blockwise
            ? std::string("blockwise (a power-of-two scale per 1 x 128 block of activations and gradients, per 128 x 128 "
                          "block of weights)")
            : std::string(cfg_.model.is_moe() ? "tensorwise (current scaling: each GEMM input's own amax, maximum over "
                                                "TP x CP; a MoE expert's over its rows on the rank and expert TP)"
                                              : "tensorwise (current scaling: each GEMM input's own amax, maximum over "
                                                "TP x CP)");
    // GPTDims::fp8_gathers_codes (blockwise: where each rank's tokens are whole 128-token blocks) and
    // fp8_gathers_dout_codes
    const int64_t l = dims_.fp8_begin;
    const bool gathers_codes = cfg_.parallel.tensor_model_parallel_size > 1 && dims_.fp8_gathers_codes(l);
    const std::string dout_codes =
        dims_.fp8_gathers_dout_codes(l) ? ", and the output gradients of the projection and fc2"
        : t.fp8_recipe == Fp8Recipe::Blockwise ? " (blockwise: with their blocks' scales; the output gradients in bf16)"
                                               : "";
    // zb-h1: B stashes the output gradients for W as FP8 codes (GPTDims::fp8_stashes_codes)
    const std::string stash = cfg_.parallel.pipeline_schedule == PipelineSchedule::ZeroBubbleH1 && t.fp8_wgrad
                                  ? "; zb-h1's B keeps the output gradients for W as FP8 codes"
                                  : "";
    // training.fp8_param_gather: the FP8 layers' GEMM weights as FP8 parameters (docs/FP8.md "FP8 parameters")
    const std::string params = t.fp8_param_gather ? "; FP8 parameters: the linear weights of those layers kept as "
                                                    "FP8 codes only, cast from the master weights and all-gathered as codes"
                                                  : "";
    spdlog::info("FP8: {} ({}), recipe {}, margin {}; the linear GEMMs of layers {}..{} in FP8{}{}, weight gradients {}{}{}{}",
                 name_of(t.fp8_format), t.fp8_format == Fp8Format::Hybrid ? "E4M3 forward, E5M2 output gradients" : "E4M3",
                 recipe, t.fp8_margin, begin, end - 1, begin > 0 || end < cfg_.model.num_layers ? " (the others bf16)" : "",
                 cfg_.model.is_moe() ? " (MoE layers: attention's, each expert's and the shared expert's; the router "
                                       "unquantized)" : "",
                 !t.fp8_wgrad ? "in bf16 (fp8_wgrad: false)"
                 : fp8_saves_inputs(cfg_)
                     ? "from FP8 inputs (the norms' and SwiGLU's outputs kept as the forward's FP8 codes where "
                       "nothing else reads them)"
                     : "from FP8 inputs",
                 !gathers_codes ? std::string()
                                : "; sequence parallelism gathers the inputs of QKV and fc1 as FP8 codes" + dout_codes,
                 stash, params);
  }
  // plan: this rank's memory as the backend allocated it (its own buffers included), next to tptrain
  // plan's count (plan/memory.h)
  const int64_t allocated = ops_->allocated_bytes() + workspace_.total();
  spdlog::info("memory: allocated {:.1f} MiB ({} bytes) on rank 0 (plan: {})", double(allocated) / 1048576.0,
               allocated, describe_memory(plan));
  if (on_gpu_) {
    auto mb = [](int64_t b) { return fmt::format("{:.2f}", double(b) / 1048576.0); };
    const std::string asked = workspace_.attention_backward_asked < 0
                                  ? "no cuDNN graph for this run"
                                  : "its graphs asked forward " + mb(workspace_.attention_forward_asked) +
                                        ", backward " + mb(workspace_.attention_backward_asked);
    spdlog::info("memory: the GPU backend's own buffers {} MiB: cuBLASLt {}, cuDNN attention {} ({}; the plan "
                 "counted {} for training.deterministic {}), scratch {} (plan {}), bias grad {}, FP8 GEMMs {} (plan {}), "
                 "fp32 fallback {} MiB",
                 mb(workspace_.total()), mb(workspace_.gemm), mb(workspace_.attention), asked,
                 mb(plan.backend.attention), cfg_.training.deterministic, mb(workspace_.scratch),
                 mb(plan.backend.scratch), mb(workspace_.bias_grad), mb(workspace_.fp8), mb(plan.backend.fp8),
                 mb(workspace_.fallback));
  }
}

}  // namespace tpt
