// The step-time model of `tptrain plan` and `tptrain plan --search` (docs/PLAN.md): the time of one
// training iteration of a resolved config on named hardware, from each pipeline stage's work per
// micro-batch, run through the same schedule lists that drive training (parallel/schedule.h).
//
// Per micro-batch and stage (one rank; every TP rank does the same):
//   GEMMs       2 m n k FLOPs at peak x gemm_efficiency x a shape factor: wave quantisation of
//               128 x 128 output tiles over the SMs and k / (k + 256) for short reductions; never
//               faster than reading the operands and writing the result at HBM speed; plus a kernel
//               launch. Forward QKV, projection, fc1, fc2 (and the LM head on the last stage);
//               backward the input-gradient GEMM (B) and the weight-gradient GEMM (W) of each.
//   attention   flash attention: 4 B s^2 (heads/TP) d FLOPs with the causal half counted, at peak x
//               attention_efficiency; backward 2.5 x the forward (it recomputes the scores).
//   elementwise LayerNorm/RMSNorm, residual adds, GELU / SwiGLU, RoPE, cross-entropy: bytes read and
//               written / (HBM bandwidth x hbm_efficiency), backward twice the forward's bytes; the
//               LayerNorm/residual part on 1/TP of the tokens with sequence parallelism.
//   TP          per layer two all-reduces forward and two backward (with sequence parallelism the
//               same bytes as all-gather + reduce-scatter), the vocabulary-parallel embedding's and
//               LM head's; serialised with compute (tptrain does not overlap them).
//   FP8         (training.fp8_format) an FP8 layer's linear GEMMs at fp8_peak_factor x peak x
//               fp8_gemm_efficiency (the weight-gradient GEMM in bf16 with fp8_wgrad: false), their
//               operands read at 1 byte; plus the casts Transformer Engine runs: each GEMM input read
//               in the compute dtype and written as FP8 codes and their transpose (Hopper's FP8 GEMMs
//               are TN only) -- activations forward and output gradients backward per micro-batch,
//               the weights once per step -- and with current scaling (tensorwise) one more read of
//               each for its amax.
//   recompute   full: the layer's forward again before its backward; selective: the attention core
//               (and with recompute_modules moe_act the MoE experts' activation on their rows,
//               layernorm the layers' two norms, moe each MoE layer's MLP forward with its
//               dispatch and combine).
//   MoE layers  (docs/MOE.md) the router's GEMM on the rank's tokens and its fp32 softmax / top-k
//               (memory bound, Nt x E); the local experts' fc1 and fc2 as one grouped GEMM each (the
//               experts' output tiles quantised over the SMs together, one launch; a small per-expert
//               M gives the short-reduction and tile-waste terms of gemm()); the permutation (the
//               tokens gathered into expert-ordered rows and scattered back, the combine, the
//               probabilities applied to the activations) as memory-bound bytes; with EP > 1 per layer a dispatch and a combine all-to-all forward
//               and both again backward (serialised), each split into the bytes to EP peers in the
//               rank's node (NVLink) and those to other nodes (the network), latency + the larger of
//               the two; the busiest rank's rows x --moe-imbalance; the experts' gradients reduced over
//               their EDP group (separately from the dense DP reduction).
// A collective over g ranks of `bytes`: ring latency + algorithm bytes / bus bandwidth, on NVLink
// when the group's ranks tile one node, else on the network (one NIC per GPU).
// The pipeline: time_pipeline over the stages' lists with these forward / B / W costs and a pipeline
// message's latency + bytes / bandwidth per exchange. After it: the DP gradient reduction (all-reduce
// of the fp32 gradients, or with the distributed optimizer their reduce-scatter and the parameters'
// all-gather in the compute dtype), with parallel.overlap_grad_reduce hidden behind the stage's last
// backward except its last bucket, with overlap_param_gather behind the first forward except its
// first bucket; the tied embedding's all-reduce; the optimizer step (~50 B per updated element at HBM
// speed).
#pragma once
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/schedule.h"

namespace tpt {

struct Config;
struct StageMemory;

// Named hardware parameters (bandwidths in gigabytes per second). Presets: h100 (SXM), h200 (SXM),
// a100 (80 GB SXM); every field can be overridden from the command line.
struct Hardware {
  std::string name = "h100";
  double peak_tflops = 989;          // dense bf16/fp16 tensor-core peak
  double memory_gib = 80;            // device memory (the plan's default --device-memory-gib)
  double hbm_gbps = 3350;            // peak HBM bandwidth
  int sms = 132;                     // streaming multiprocessors (wave quantisation)
  double gemm_efficiency = 0.78;     // fraction of peak a large GEMM reaches (calibrated: tests/plan/published.yaml)
  double fp8_peak_factor = 2;        // the dense FP8 tensor-core peak over peak_tflops (0: no FP8)
  double fp8_gemm_efficiency = 0.55;  // fraction of the FP8 peak a large FP8 GEMM reaches (calibrated: published.yaml)
  double attention_efficiency = 0.55;  // fraction of peak flash attention reaches
  // how much slower the CP ring's fallback kernel runs its blocks than flash attention (where cuDNN
  // does not take the shape: fp32, D or S not a multiple of 8): measured about 300x on an H200
  // (2026-12-04, scripts/ring_bench.sh with every block on it: 3.9 s against 13 ms, docs/GPU.md)
  double cp_fallback_slowdown = 300;
  double hbm_efficiency = 0.8;       // fraction of the HBM bandwidth elementwise kernels reach
  double kernel_overhead_us = 4;     // per kernel launch (and per small kernel's tail)
  double nvlink_gbps = 360;          // achievable NVLink bus bandwidth of a collective within a node
  double nvlink_latency_us = 8;      // per ring step within a node
  double network_gbps = 45;          // achievable bus bandwidth per GPU across nodes (one NIC each)
  double network_latency_us = 20;    // per ring step across nodes
  // not hardware, an assumption the model carries with it (plan --moe-imbalance): the busiest EP
  // rank's expert rows over the balanced share; it multiplies that rank's grouped GEMMs, its
  // permutation bytes and its all-to-all volume (1 = balanced, as force-balanced benchmark runs)
  double moe_imbalance = 1.0;
};
// The preset of --gpu: "h100", "h200" or "a100" (InputError naming --gpu otherwise).
Hardware hardware_preset(const std::string& gpu);

// One iteration's time and where it goes (seconds; per rank on the critical stage where it says so).
struct StepTime {
  double step_s = 0;                 // pipeline + exposed DP / embedding sync + optimizer
  double pipeline_s = 0;             // makespan of the simulated schedule (compute, TP comm, p2p, bubble)
  double ideal_s = 0;                // the busiest stage's work (compute + TP comm): no bubble
  double bubble_s = 0;               // pipeline_s - ideal_s (idle time and pipeline messages)
  // the busiest stage's work over the iteration's micro-batches
  double gemm_s = 0, attention_s = 0, elementwise_s = 0, tp_comm_s = 0, recompute_s = 0;
  double cp_comm_s = 0;              // context parallelism's ring (exposed: its messages beyond the attention they overlap, the last dK/dV)
  double ep_comm_s = 0;              // expert parallelism's all-to-alls (not overlapped)
  double p2p_per_message_s = 0;      // one pipeline message
  double dp_comm_s = 0;              // DP gradient reduction (+ parameter all-gather), before overlap
  double dp_exposed_s = 0;           // the part not hidden by overlap (+ the tied embedding's all-reduce)
  double optimizer_s = 0;
  double exposed_comm_s = 0;         // tp_comm_s + cp_comm_s + dp_exposed_s + ep_comm_s (communication on the critical path)
  double tokens_per_s = 0, mfu = 0;  // MFU: model FLOPs (the log's formula) / (step x ranks x peak)
  double model_tflops_per_gpu = 0;
};

// A schedule's lists compiled for timing: the same semantics as time_pipeline (parallel/schedule.h: a
// compute action takes its cost, an exchange ends when every message in it has its counterpart
// posted, plus the p2p time if it carries data), as a fixed order of actions with each exchange's
// counterparts, so that timing a layout is one pass over arrays (time_pipeline's simulator, which
// also checks the lists, is ~100x slower). tests/unit/step_time_test.cpp checks that they agree.
class CompiledSchedule {
 public:
  explicit CompiledSchedule(const std::vector<std::vector<Action>>& lists);  // lists that simulate() accepts
  // Costs per stage of one micro-batch's forward, input-gradient and weight-gradient work on its whole
  // share of layers (a chunk's action costs 1 / chunks of it), as time_pipeline takes them.
  // Not thread-safe: one scratch array per compiled schedule.
  PipelineTiming time(const std::vector<double>& f, const std::vector<double>& b, const std::vector<double>& w,
                      double p2p) const;

 private:
  struct Op {
    int stage;
    int kind;             // 0 forward, 1 backward (b + w where the stage has no W), 2 backward B, 3 W, 4 exchange
    bool data = false;    // an exchange that carries a message
    int first_partner = 0, partners = 0;  // into partner_: the counterpart exchanges' ids
  };
  std::vector<Op> ops_;              // id = position in the stage's list + the stage's offset
  std::vector<int> offset_;          // first id of each stage
  std::vector<int> partner_;
  std::vector<int> order_;           // an order in which every action's inputs come first
  int chunks_ = 1;
  mutable std::vector<double> end_;  // time()'s scratch: when each action ends (one caller at a time)
};

// The schedule lists of every stage compiled once per (kind, stages, micro-batches, chunks): the
// search times thousands of layouts over far fewer schedules. (The lists are make_schedule's, which
// tests/unit/schedule_test.cpp simulates for every kind; the compiler still refuses a deadlock.)
// Past a bound the timing does not grow with the micro-batch count M: once the pipeline is in its steady
// state each micro-batch adds the same time (a step of P micro-batches for interleaved 1F1B, whose M is a
// multiple of P), so for P > 1 and M above bound_for(P, v) the makespan is extrapolated from three exact timings
// of fewer micro-batches whose increments agree to 1e-9 (if they do not, the whole schedule is timed);
// the busy times are linear in M exactly. tests/unit/step_time_test.cpp checks it against exact timings.
class ScheduleCache {
 public:
  PipelineTiming time(const Config& resolved, const std::vector<double>& f, const std::vector<double>& b,
                      const std::vector<double>& w, double p2p);
  static int bound_for(int stages, int chunks) { return std::max(32, (chunks + 1) * stages); }

 private:
  const CompiledSchedule& compiled(int kind, int stages, int microbatches, int chunks);
  std::map<std::tuple<int, int, int, int>, CompiledSchedule> compiled_;
};

// The step time of a resolved config (resolve_parallel done) on `hw` with `gpus_per_node` GPUs per
// node; `stages` = stage_memory of every stage (for the parameter buffers).
StepTime estimate_step_time(const Config& resolved, const Hardware& hw, int gpus_per_node,
                            const std::vector<StageMemory>& stages, ScheduleCache& cache);

}  // namespace tpt
