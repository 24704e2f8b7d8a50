// The config checks that need the world size (docs/ARCHITECTURE.md "Config"): the grid divides
// the world and the model, the expert grid, the parallel features' combinations, the batch sizes;
// fills data_parallel_size, global_batch_size and expert_tensor_parallel_size.
#include <algorithm>
#include <limits>
#include <string>

#include "core/config.h"
#include "core/error.h"

namespace tpt {

namespace {

// The expert grid (docs/MOE.md, parallel/grid.h): ETP x EP x EDP folded into each stage's TP x CP x
// DP ranks; ETP 1 or TP, EP dividing the experts, EP > 1 only for an MoE model. (A dense model's ETP
// is not checked: it has no expert layers, and resolve_parallel sets it to TP.)
void check_expert_grid(const Config& cfg, int world_size, int64_t dp) {
  const ParallelConfig& p = cfg.parallel;
  auto s = [](int64_t x) { return std::to_string(x); };
  const int64_t tp = p.tensor_model_parallel_size, cp = p.context_parallel_size, pp = p.pipeline_model_parallel_size;
  const int64_t ep = p.expert_model_parallel_size, etp = p.expert_tensor_parallel_size;
  const std::string ep_key = "parallel.expert_model_parallel_size (" + s(ep) + ")";
  const std::string etp_key = "parallel.expert_tensor_parallel_size (" + s(etp) + ")";
  if (ep < 1) input_error(ep_key + " must be at least 1");
  const int64_t e = cfg.model.num_moe_experts, expert_tp = etp == 0 ? tp : etp;
  if (e == 0 && ep > 1)
    input_error("parallel.expert_model_parallel_size > 1 needs model.num_moe_experts (a dense model has no experts "
                "to split; it is " + s(ep) + "): set expert_model_parallel_size to 1 or give num_moe_experts");
  if (e == 0) return;
  if (etp != 0 && etp != 1 && etp != tp)
    input_error(etp_key + " must be 1 or parallel.tensor_model_parallel_size (" + s(tp) +
                ") (null: tensor_model_parallel_size): the experts' weights are whole on each rank or split as "
                "the dense MLP's");
  if (e % ep != 0)
    input_error("model.num_moe_experts (" + s(e) + ") is not divisible by " + ep_key +
                " (each expert-parallel rank holds the same number of experts)");
  if ((tp * cp * dp) % (expert_tp * ep) != 0)
    input_error((etp == 0 ? "parallel.expert_tensor_parallel_size (null = tensor_model_parallel_size " + s(tp) + ")"
                          : etp_key) +
                " * " + ep_key + " * parallel.pipeline_model_parallel_size (" + s(pp) + ") = " +
                s(expert_tp * ep * pp) + " does not divide the world size " + s(world_size) +
                " (the expert layers fold ETP x EP x expert-data-parallel ranks into each pipeline stage's " +
                s(tp * cp * dp) + " ranks)");
}

}  // namespace

void resolve_parallel(Config& cfg, int world_size) {
  TPT_CHECK(world_size >= 1);
  const std::string ws = std::to_string(world_size);
  ParallelConfig& p = cfg.parallel;
  const int64_t tp = p.tensor_model_parallel_size, pp = p.pipeline_model_parallel_size, cp = p.context_parallel_size;
  TPT_CHECK(tp >= 1 && pp >= 1 && cp >= 1);
  auto s = [](int64_t x) { return std::to_string(x); };
  if (world_size % (tp * pp) != 0)
    input_error("parallel.tensor_model_parallel_size (" + s(tp) + ") * parallel.pipeline_model_parallel_size (" +
                s(pp) + ") = " + s(tp * pp) + " does not divide the world size " + ws);
  if (world_size % (tp * cp * pp) != 0)
    input_error("parallel.context_parallel_size (" + s(cp) + ") * parallel.tensor_model_parallel_size (" + s(tp) +
                ") * parallel.pipeline_model_parallel_size (" + s(pp) + ") = " + s(tp * cp * pp) +
                " does not divide the world size " + ws);
  const int64_t dp = world_size / (tp * cp * pp);
  if (dp > (1 << 20))  // parallel.data_parallel_size's bound
    input_error("parallel.data_parallel_size: the world size " + ws + " / (tensor_model_parallel_size " + s(tp) +
                " * context_parallel_size " + s(cp) + " * pipeline_model_parallel_size " + s(pp) + ") = " + s(dp) +
                ", more than 1048576");
  if (p.data_parallel_size != 0 && p.data_parallel_size != dp)
    input_error("parallel.data_parallel_size: " + s(p.data_parallel_size) + " does not match world size " + ws +
                " / (tensor_model_parallel_size " + s(tp) + " * context_parallel_size " + s(cp) +
                " * pipeline_model_parallel_size " + s(pp) + ") = " + s(dp) + " (leave it null to derive it)");
  check_expert_grid(cfg, world_size, dp);
  // context parallelism: 2 CP equal chunks per sequence (and with sequence parallelism each CP rank's
  // S / CP tokens split again over TP)
  const int64_t cp_split = 2 * cp * (p.sequence_parallel ? tp : 1);
  if (cp > 1 && cfg.model.seq_length % cp_split != 0)
    input_error("model.seq_length (" + s(cfg.model.seq_length) + ") is not divisible by 2 * parallel.context_parallel_size" +
                (p.sequence_parallel ? " * parallel.tensor_model_parallel_size (with parallel.sequence_parallel)"
                                     : std::string()) +
                " = " + s(cp_split) + " (each sequence is cut into 2 * context_parallel_size equal chunks)");
  const ModelConfig& m = cfg.model;
  if (m.group_query_attention && m.num_query_groups % tp != 0)  // QKV is column-parallel by key/value groups
    input_error("model.num_query_groups (" + s(m.num_query_groups) +
                ") is not divisible by parallel.tensor_model_parallel_size (" + s(tp) +
                ") (with model.group_query_attention the tensor-parallel ranks split the key/value groups)");
  if (!m.group_query_attention && m.num_attention_heads % tp != 0)
    input_error("model.num_attention_heads (" + s(m.num_attention_heads) +
                ") is not divisible by parallel.tensor_model_parallel_size (" + s(tp) + ")");
  if (m.ffn_hidden_size % tp != 0)
    input_error("model.ffn_hidden_size (" + s(m.ffn_hidden_size) +
                ") is not divisible by parallel.tensor_model_parallel_size (" + s(tp) + ")");
  if (m.num_layers % pp != 0)
    input_error("model.num_layers (" + s(m.num_layers) +
                ") is not divisible by parallel.pipeline_model_parallel_size (" + s(pp) + ")");
  // interleaved 1F1B: v model chunks per rank, num_layers / (pp * v) layers each
  const int64_t v = std::max(1, p.virtual_pipeline_model_parallel_size);
  const std::string vkey = "parallel.virtual_pipeline_model_parallel_size (" + s(v) + ")";
  if (v > 1 && pp == 1)
    input_error(vkey + " needs parallel.pipeline_model_parallel_size > 1 (model chunks are spread over pipeline "
                "ranks): set it to null or raise pipeline_model_parallel_size");
  if (v > 1 && p.pipeline_schedule != PipelineSchedule::OneFOneB)
    input_error(vkey + " needs parallel.pipeline_schedule: 1f1b (the interleaved 1F1B schedule), not " +
                name_of(p.pipeline_schedule));
  if (v > 1 && m.num_layers % (pp * v) != 0)
    input_error("model.num_layers (" + s(m.num_layers) + ") is not divisible by parallel.pipeline_model_parallel_size (" +
                s(pp) + ") * " + vkey + " = " + s(pp * v) + " (each model chunk holds the same number of layers)");
  if (p.pipeline_schedule == PipelineSchedule::ZeroBubbleH1 && cfg.training.recompute == Recompute::Full)
    input_error("parallel.pipeline_schedule: zb-h1 cannot run with training.recompute: full (its deferred weight "
                "gradients read the layers' kept activations, which full recompute drops): use none or selective");
  if (p.overlap_param_gather && !p.distributed_optimizer)
    input_error("parallel.overlap_param_gather: needs parallel.distributed_optimizer: true (the parameters are "
                "all-gathered only with the distributed optimizer)");
  if (p.sequence_parallel && tp == 1)
    input_error("parallel.sequence_parallel: needs parallel.tensor_model_parallel_size > 1 (it splits the tokens of "
                "the LayerNorm and residual regions over the tensor-parallel ranks; with "
                "tensor_model_parallel_size 1 there is nothing to split): set parallel.sequence_parallel: false or "
                "parallel.tensor_model_parallel_size >= 2");
  if (p.sequence_parallel && m.seq_length % tp != 0)
    input_error("parallel.sequence_parallel: model.seq_length (" + s(m.seq_length) +
                ") is not divisible by parallel.tensor_model_parallel_size (" + s(tp) + ")");
  TrainingConfig& t = cfg.training;
  const int64_t per_step = int64_t{t.micro_batch_size} * dp;
  if (t.global_batch_size == 0) {
    if (per_step > (1 << 30))  // training.global_batch_size's bound
      input_error("training.global_batch_size: null means training.micro_batch_size (" + s(t.micro_batch_size) +
                  ") * data-parallel size (" + s(dp) + ") = " + s(per_step) + ", more than 1073741824");
    t.global_batch_size = static_cast<int>(per_step);
  } else if (t.global_batch_size % per_step != 0) {
    input_error("training.global_batch_size (" + s(t.global_batch_size) +
                ") is not a multiple of training.micro_batch_size (" + s(t.micro_batch_size) +
                ") * data-parallel size (" + s(dp) + ") = " + s(per_step));
  }
  const int64_t micro = t.global_batch_size / per_step;
  if (v > 1 && micro % pp != 0)
    input_error("the interleaved schedule (" + vkey + ") needs the micro-batches per DP rank (training.global_batch_size " +
                s(t.global_batch_size) + " / (training.micro_batch_size " + s(t.micro_batch_size) +
                " x data-parallel size " + s(dp) + ") = " + s(micro) +
                ") to be a multiple of parallel.pipeline_model_parallel_size (" + s(pp) + "), as in Megatron");
  p.data_parallel_size = static_cast<int>(dp);
  // ETP null: TP; a dense model's always TP (its expert grid is the dense one, whatever ETP was resolved
  // to before: a resolved config may be resolved again for another TP)
  if (p.expert_tensor_parallel_size == 0 || !m.is_moe()) p.expert_tensor_parallel_size = p.tensor_model_parallel_size;
  std::string key;
  const std::string length = run_length_error(cfg, t.global_batch_size, key);
  if (!length.empty()) input_error(key + ": " + length);
  check_moe_parallel(cfg);
}

}  // namespace tpt
