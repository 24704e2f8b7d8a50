// Per-rank memory, FLOPs and time of a config on its TP x PP x DP grid (docs/PLAN.md "How the plan is
// computed": the same size functions the trainer allocates with feed `tptrain plan`). Everything here is a pure function
// of the resolved config: no ranks, no device.
//
// Memory of one rank of pipeline stage s (every TP and DP rank of a stage holds the same amount):
//   weights     fp32 master (the parameter buffer, ParamLayout::total floats) + for bf16/fp16 the
//               compute copy (2 B/element); with the distributed optimizer the buffer is padded to
//               its blocks and a bf16/fp16 run keeps fp32 master weights for 1/DP of it only;
//               optimizer.store_param_remainders (bf16): a 2 B remainder instead of each fp32 master
//   gradients   the parameter buffer's elements, fp32 (bf16 with parallel.grad_reduce_in_bf16 /
//               optimizer.main_grads_dtype: bf16)
//   optimizer   AdamW exp_avg + exp_avg_sq, fp32 (8 B/element; of 1/DP with the distributed optimizer)
//   activations per model chunk (model/chunks.h; one without interleaving):
//               activation_bytes_per_microbatch(...) (+ weight_grad_stash_bytes with zb-h1) x the
//               chunk's in-flight micro-batches (max_in_flight_per_chunk of the stage's list); with
//               interleaving (pooled_slots) instead one pool for the chunks: pool_slots' count x the
//               largest chunk's pooled_slot_bytes
//   workspace   scratch_bytes(...) per chunk (shared by its micro-batches) + the largest chunk's
//               shared_scratch_bytes(...) (shared by the chunks: they run one pass at a time)
//   buffers     pipeline receive buffers (the activations and gradients each chunk's schedules
//               hold received at once: receive_buffers, in the compute dtype) and the
//               micro-batch's tokens and targets (int32)
//   host        (not device memory) checkpoint.async_save's staging: 12 B per element of the layout
//   backend     the GPU backend's own buffers (gpu_backend_workspace): cuBLASLt's workspace, cuDNN's
//               attention workspace (training.deterministic chooses which), the reductions'
//               scratch, the bias-gradient epilogue's output. None on CPU ranks.
// Every tensor is stored in its own dtype (core/ops.h): both backends allocate exactly this, and the
// GPU backend reserves its buffers at start-up (Ops::reserve_workspace).
// With bf16, weights + gradients + optimizer = 2 + 4 + 4 + 4 + 4 = 18 B per element of the rank's
// parameter buffer: Megatron's documented 18 B/parameter; with the distributed optimizer
// 2 + 4 + 12/DP (Megatron's 6 + 12/DP).
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "parallel/schedule.h"
#include "plan/step_time.h"

namespace tpt {

struct Config;

struct StageMemory {
  int stage = 0;
  int64_t layers = 0;
  int in_flight = 1;                   // micro-batches whose activations the stage holds at most (all chunks)
  int64_t parameters_per_rank = 0;     // elements of this rank's tensors (padded vocabulary rows included)
  int64_t parameter_buffer = 0;        // ParamLayout::total: the same plus 64-byte alignment per tensor
                                       // (and the replica groups' padding, below)
  // Mixture-of-Experts: of parameters_per_rank, the MoE layers' experts (E / EP of each layer's,
  // expert_parameters); of parameter_buffer, their replica group's span (padded to the distributed
  // optimizer's blocks over EDP ranks, the experts' data-parallel group)
  int64_t expert_parameters_per_rank = 0;
  int64_t expert_buffer = 0;
  // FP8 parameters (training.fp8_param_gather): of parameter_buffer, their spans (after every other, the
  // dense one padded over the dense ranks, the experts' over EDP), stored as FP8 codes (a byte each) with
  // no compute copy, all-gathered as codes; expert_code_buffer: the experts' (of expert_buffer too)
  int64_t code_buffer = 0, expert_code_buffer = 0;
  int64_t owned_elements = 0;          // of parameter_buffer, what this rank's optimizer steps (1/DP: distributed)
  int64_t tensors = 0;                 // ParamLayout::params of the rank (fp16 optimizer states: a scale each)
  int64_t weight_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
  int64_t activation_bytes = 0;        // for the configured recompute mode
  int64_t workspace_bytes = 0;
  int64_t buffer_bytes = 0;
  BackendWorkspace backend;            // the GPU backend's own buffers (zeros on CPU ranks)
  // checkpoint.async_save: host memory (page-locked with CUDA), not device memory and not in
  // total_bytes(): the staging copy of a writing rank's shards (3 x 4 B per element of ParamLayout::total)
  int64_t checkpoint_staging_bytes = 0;
  // cuDNN's attention workspace with training.deterministic true / false (backend.attention is one of them)
  int64_t attention_workspace_by_mode[2] = {0, 0};
  // activations + workspace for recompute none / selective / full (index = int(Recompute))
  int64_t activation_and_workspace_by_mode[3] = {0, 0, 0};
  int64_t model_state_bytes() const { return weight_bytes + gradient_bytes + optimizer_bytes; }
  // what the model allocates through Ops::alloc_bytes (the CPU backend's all)
  int64_t tensor_bytes() const { return model_state_bytes() + activation_bytes + workspace_bytes + buffer_bytes; }
  int64_t total_bytes() const { return tensor_bytes() + backend.total(); }
};

// Throws InputError, naming the keys, when a resolved config is beyond what can be planned or
// trained at all: about a PiB per rank (counted in double, before any 64-bit size is computed), or
// more than kMaxScheduledPasses micro-batches x stages x model chunks in one schedule (the plan
// simulates them all). Both make_plan and the trainer call it first, so that such a config is an
// error in milliseconds instead of an overflow or bad_alloc.
inline constexpr int64_t kMaxScheduledPasses = int64_t(1) << 20;
void check_plannable(const Config& cfg);

// The compute dtype of training.precision (fp32 | bf16 | fp16): the one place the name maps to a type.
DType compute_dtype(const Config& cfg);

// The rank layouts (make_rank_layout, model/chunks.h) of the layouts a search plans, by what its
// layouts vary that they depend on: TP, CP, PP, the chunks, sequence parallelism, the replica groups'
// alignment, EP, ETP, FP8 parameters and the stage. For one model config only (plan/search.cpp keeps one per search).
class RankLayoutCache {
 public:
  const ParamLayout& get(const Config& resolved, int pp_rank, const std::vector<GPTDims>& chunks);

 private:
  std::map<std::array<int64_t, 10>, ParamLayout> layouts_;
};

// weight_bytes, gradient_bytes and optimizer_bytes of m (parameter_buffer, owned_elements) as cfg's
// precision and optimizer options store them (the search's memory options change only these).
void set_model_state_bytes(const Config& cfg, StageMemory& m);
// Memory of one rank of stage `pp_rank` for a resolved config (resolve_parallel done), on a GPU
// (gpu_backend: the backend's own buffers counted) or on CPU ranks; `layouts`: the search's cache.
StageMemory stage_memory(const Config& cfg, int pp_rank, bool gpu_backend = true, RankLayoutCache* layouts = nullptr);
// The same for the stage's model chunks as given (make_chunk_dims of the stage, CP applied): what the
// first form computes them as; a test changes their layer spec.
StageMemory stage_memory(const Config& cfg, int pp_rank, const std::vector<GPTDims>& chunks, bool gpu_backend,
                         RankLayoutCache* layouts = nullptr);
// The GPU backend's own buffers for a rank holding model chunks `chunks` (core/gpu_workspace.h has
// the sizes): cuBLASLt's workspace; cuDNN's attention workspace for 16-bit runs without context
// parallelism (whose ring computes its own blocks), for `deterministic`; the largest scratch of a
// column-sum pass (the norms' and bias gradients), of the gradient-norm reduction and of the first
// stage's word-embedding sort; the widest bias-gradient epilogue output.
BackendWorkspace gpu_backend_workspace(const std::vector<GPTDims>& chunks, int64_t micro_batch, DType dtype,
                                       int64_t parameter_buffer, int64_t parameter_tensors, bool deterministic);
// The attention calls of a rank holding those chunks, for Ops::reserve_workspace (with context
// parallelism the ring blocks': ring, T the rank's tokens).
AttentionShape attention_shape(const GPTDims& d, int64_t micro_batch, DType dtype);
// The kernel CudaOps runs a CP ring block with: "cudnn" (cuDNN's SDPA, a step's chunk pairs in one
// call but in the deterministic backward, core/cuda/attention/ring_calls.h: bf16 / fp16, head dimension a multiple of 8, chunks a multiple of 4 tokens -- where libcudnn.so.9
// loads and builds the graphs, else the fallback), "fallback" (core/cuda/attention/ring_attention.cu,
// a warp per row, the other operand's rows staged in shared memory, dQ and dK/dV in two kernels
// without atomics).
std::string cp_attention_kernel(const GPTDims& d, DType dtype);
// One line: "<total> MiB (<bytes> bytes): weights .., gradients .., optimizer .., activations ..,
// workspace .., buffers .., backend .. MiB" (the trainer's start-up log uses it; no backend part on
// CPU ranks).
std::string describe_memory(const StageMemory& m);

// Mixture-of-Experts (docs/MOE.md, docs/PLAN.md "Mixture-of-Experts"). The expert-data-parallel size
// EDP: the ranks holding the same experts, whose gradients they average and whose optimizer state the
// distributed optimizer shards: TP x CP x DP / (ETP x EP) (Megatron's parallel folding; ETP null =
// TP). 1 for a dense model.
int expert_data_parallel_size(const Config& cfg);
// ETP: parallel.expert_tensor_parallel_size, null = TP.
int expert_tp_size(const Config& cfg);
// Elements of this rank's experts in chunk d, counted from the MoE sizes alone (not from the layout):
// per MoE layer of the chunk E / EP experts x (fc1 fc1_width x C + fc2 C x Fe [+ their biases
// fc1_width + C]). 0 for a dense model.
int64_t expert_parameters(const GPTDims& d);

// Parameters of the whole model, each counted once (the last stage's tied word-embedding copy and
// TP replicas not repeated), with the unpadded vocabulary, as the trainer's start-up log counts.
int64_t total_parameters(const Config& cfg);
// Megatron's model FLOPs of one iteration (no recompute), the formula of the TFLOP/s/device log:
// 12 B s l h^2 ((1 + G/H + s/(2h)) H D / h + (F/h) m + V/(2 l h)), B = global batch, G key/value
// groups, D head dim, m = 3/2 with SwiGLU (else 1), V = padded vocabulary; for GPT-2
// 72 B s l h^2 (1 + s/(12h) + V/(12 l h)). Mixture-of-Experts: the active FLOPs, as Megatron's
// num_floating_point_operations counts them: the MLP term of the l_moe MoE layers is each token's k
// experts and the shared expert, (k Fe + Fs)/h m instead of (F/h) m; the router is not counted.
double iteration_model_flops(const Config& cfg, int64_t padded_vocab);

struct PlanOptions {
  int world_size = 0;                  // 0: TP * CP * PP * (data_parallel_size or 1)
  double device_memory_gib = 80;
  Hardware hw;                         // the step-time model's hardware (plan/step_time.h; --gpu, --peak-tflops, ...)
  int gpus_per_node = 8;
  // --search keeps layouts whose largest stage is at most this fraction of the device memory (the
  // plan's "tight" line: CUDA context, NCCL buffers and fragmentation are not in the plan)
  double usable_memory_fraction = 0.95;
};

struct PlanSuggestion {
  std::string change;                  // e.g. "training.recompute=full"
  std::string note;                    // e.g. "not implemented yet in tptrain"
  int64_t peak_bytes = 0;              // largest total over the stages with the change (-1: none tried fits)
  bool fits = false;
};

// One pipeline schedule's bubble on the plan's grid, simulated with F = B = W = 1 (parallel/schedule.h).
struct ScheduleBubble {
  std::string name;            // "1f1b", "interleaved v=2" (and the configured v), "zb-h1"
  std::string why_not;         // non-empty: the schedule does not apply to this grid (and why)
  double bubble_over_ideal = 0;  // (makespan - ideal) / ideal
  double bubble_fraction = 0;    // (makespan - ideal) / makespan: the plan's bubble (docs/PLAN.md "Bubble")
  int max_in_flight = 0;       // activation slots (micro-batches in flight) on the busiest stage
};

struct Plan {
  int world_size = 1, tp = 1, pp = 1, dp = 1;
  int cp = 1;                          // parallel.context_parallel_size
  int num_microbatches = 1;
  double device_memory_bytes = 0;
  int64_t total_parameters = 0, padded_vocab = 0;
  // Mixture-of-Experts: of total_parameters the experts' (each once), and the parameters one token
  // passes through (the experts' k / E of them: Megatron's "active" parameters); EP and EDP (1 dense)
  int64_t expert_parameters = 0, active_parameters = 0;
  int ep = 1, edp = 1;
  double flops_per_iteration = 0;      // model FLOPs (Megatron's formula)
  double hardware_flops_per_iteration = 0;  // with recompute, from the per-layer counts
  double bubble_fraction = 0;          // simulated: unit forward, 2 units backward, free communication
  double bubble_fraction_analytic = 0; // (PP - 1) / (M + PP - 1)
  std::vector<ScheduleBubble> schedule_bubbles;  // PP > 1: 1F1B, interleaved, ZB-H1 compared
  // per rank per iteration: all-reduce payloads (TP, DP incl. the tied embedding) and bytes sent p2p
  int64_t tp_comm_bytes = 0, pp_comm_bytes = 0, dp_comm_bytes = 0;
  int64_t cp_comm_bytes = 0;           // context parallelism: the ring's K/V blocks and their gradients sent
  // context parallelism: what the CUDA backend runs the ring's blocks with (cp_attention_kernel)
  std::string cp_attention_kernel;
  int64_t ep_comm_bytes = 0;           // expert parallelism: the MoE dispatch's all-to-alls sent (rows, gradients)
  double pipeline_time_s = 0, dp_time_s = 0, optimizer_time_s = 0;  // dp_time_s: the exposed part
  double step_time_s = 0, tokens_per_s = 0, mfu = 0;
  StepTime time;                       // the step-time model's breakdown (plan/step_time.h)
  std::vector<StageMemory> stages;
  bool fits = true;
  std::vector<PlanSuggestion> suggestions;  // only when a stage does not fit
  PlanOptions options;
};

// The plan of a loaded config (load_config) on options.world_size ranks; runs resolve_parallel
// (InputError on a bad grid).
Plan make_plan(Config cfg, const PlanOptions& options);

// When a stage does not fit: each change `tptrain plan` suggests (recompute, the distributed optimizer, the
// memory options, ...) planned again on the same world, with its largest stage total (plan/suggest.cpp).
std::vector<PlanSuggestion> plan_suggestions(const Config& c, const Plan& plan);

}  // namespace tpt
