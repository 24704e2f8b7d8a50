// The training loop: ties the grid, the model stage, the optimizer and the data together, and
// writes the contract's log line and metrics.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "core/config.h"
#include "core/op_profile.h"
#include "core/ops.h"
#include "data/dataset.h"
#include "data/run_data.h"
#include "model/chunks.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "parallel/grad_sync.h"
#include "parallel/checkpoint.h"
#include "parallel/checkpoint_async.h"
#include "parallel/grid.h"
#include "parallel/schedule.h"
#include "train/aux_output.h"
#include "train/moe_metrics.h"
#include "train/tensorboard.h"
#include "train/trace.h"

namespace tpt {

class Trainer {
 public:
  Trainer(const Config& cfg, Grid& grid);
  ~Trainer();
  // Runs train_iters iterations (from the current one); returns the exit status.
  int train();
  // Writes logging.trace_file (collective: every rank must call it).
  void write_trace();

  struct StepResult {
    double lm_loss = 0;    // mean over the global batch
    double grad_norm = 0;  // before clipping (of the unscaled gradients)
    double loss_scale = 1;  // the scale this step ran with
    bool skipped = false;  // fp16 overflow: no update
    bool nan = false;      // nan loss or gradient (bf16/fp32): no update
    MoEMetrics moe;        // Mixture-of-Experts: the balancing losses and the routing's imbalance
  };
  // One iteration k (1-based) over its global batch: forward/backward of every micro-batch,
  // gradient reduction, clipping and the AdamW update.
  StepResult train_step(int64_t k);
  // Mean loss over eval_iters global batches of the validation data (no update).
  double evaluate();
  // The backend's device allocator calls so far (Ops::allocator_calls; the tests' check that
  // iterations after the first make none).
  int64_t allocator_calls() const { return ops_->allocator_calls(); }

 private:
  // Loads micro-batch m of global positions starting at `base` for this DP rank: tokens (B, S)
  // and targets (B, S) into the host buffers.
  void load_microbatch(const BlendedDataset& ds, int64_t base, int m);
  double forward_backward(int64_t base, const BlendedDataset& ds, bool want_grad);
  // data.eod_mask_loss: target tokens of the global batch at `base` that count in the loss (on
  // every DP rank alike, so the mean is over the whole batch whatever the layout); else G * S.
  int64_t counted_tokens(const BlendedDataset& ds, int64_t base) const;
  // The master weights of a host buffer of the layout (layout_.total floats): the owned ranges of
  // master_ (fp16 master weights: encoded with `scales`, AdamW::from_host), their compute copy
  // (master_copy_bits of the master as stored; with remainders that and remainders_), then the
  // distributed optimizer's all-gather of the compute copy. master_to_host: the master weights of
  // the owned ranges into such a buffer as fp32 (with remainders, merged on the host).
  void master_from_host(const float* host, const float* scales = nullptr);
  void master_to_host(float* host) const;
  // Scaled fp16 optimizer states (model/optimizer.h): one checkpoint tensor [1] per fp16 state and
  // layout tensor (optimizer_scale_name), state by state, each pointing into `values` (filled with
  // the optimizer's scales; for a load, zeros: a tensor the checkpoint lacks keeps 0); keep[i]: the
  // i-th is this rank's to save (its tensor's primary copy).
  std::vector<CkptTensor> optimizer_scale_tensors(std::vector<float>& values, std::vector<bool>* keep = nullptr) const;
  void log_iteration(int64_t k, const StepResult& r, double lr, double elapsed_ms, int64_t n_iters,
                     int skipped, int nans, std::optional<double> val_loss);
  // Mixture-of-Experts (train/trainer_moe.cpp): the expert biases' update once per global batch, and
  // their checkpoint tensors h.<l>.mlp.router.expert_bias (E) -- written by TP rank 0 of replica 0 of
  // each stage (for_save), read by every rank -- with the whole model's names for the shape check.
  void update_expert_bias();
  // FP8's delayed scaling (docs/FP8.md): the step's amaxes zeroed before it, reduced over TP x DP x CP
  // and turned into the next step's scales after it; the state in checkpoints (fp8_state_tensors)
  bool fp8_delayed() const {
    return cfg_.training.fp8_format != Fp8Format::None && cfg_.training.fp8_recipe == Fp8Recipe::Delayed;
  }
  void fp8_weights_changed();  // the FP8 layers' kept weight copies stale (a step or an evaluation begins)
  // FP8 parameters (training.fp8_param_gather, docs/FP8.md "FP8 parameters"): each stage's cast from this
  // rank's master weights (its owned blocks; current scaling: the amaxes over TP x DP x CP first) and the
  // all-gather of the codes over the replicas. Before each step (delayed scaling records the weights'
  // amaxes there, as their quantization in the first forward would) and before an evaluation when the
  // weights changed since the last cast.
  void fp8_cast_params();
  void fp8_begin_step();
  void fp8_update();
  std::vector<CkptTensor> fp8_state_tensors();
  void fp8_state_loaded(bool missing);  // after a load wrote fp8_state_tensors (missing: the checkpoint had none)
  // expert_bias_tensors and fp8_state_tensors: this rank's, as checkpoints hold them
  std::vector<CkptTensor> extra_state_tensors();
  std::vector<GlobalTensor> fp8_state_model() const;
  std::vector<CkptTensor> expert_bias_tensors();
  std::vector<GlobalTensor> expert_bias_model() const;

  const Config& cfg_;
  Grid& grid_;
  // The backend; with logging.profile_ops, ops_ wraps it and times every call into profile_, and
  // the device communicators are wrapped the same way (comm() picks the wrapper).
  std::unique_ptr<Ops> backend_;
  std::unique_ptr<OpProfile> profile_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<Comm> profiled_tp_, profiled_pp_, profiled_dp_, profiled_embedding_;
  Comm& comm(Comm& device, const std::unique_ptr<Comm>& profiled) { return profiled ? *profiled : device; }
  // After iteration k (counted: a training iteration after the first, taking wall_ms): the op
  // profile's spans of the iteration into its totals and the trace.
  void profile_iteration(int64_t k, bool counted, double wall_ms);
  void report_profile() const;
  void check_memory(const Config& cfg, const Grid& grid) const;
  // The constructor's parts, in order (train/trainer.cpp).
  void setup_backend();
  void setup_data();
  void setup_model();
  void setup_pipeline();
  void log_setup();
  // The rank's model chunks (model/chunks.h: one, or v with the interleaved schedule): their dims,
  // dims_ = chunk 0's (the sizes all chunks share), the rank's layers (global indices, ascending)
  // and the layout of all chunks' parameters.
  std::vector<GPTDims> chunk_dims_;
  GPTDims dims_;
  std::vector<int64_t> layers_;
  ParamLayout layout_;
  int64_t buffer_total_ = 0;  // elements of the parameter / gradient buffers (GradSync::buffer_size)
  // master weights: the buffer, or (master_sharded_) the owned blocks; fp32, or with
  // optimizer.main_params_dtype fp16 scaled fp16 codes (model/optimizer.h)
  Buf master_;
  bool master_sharded_ = false;
  // optimizer.store_param_remainders: no master_; the master weights are params_compute_'s bf16
  // bits plus these low halves (indexed like master_)
  uint16_t* remainders_ = nullptr;
  Buf grads_;                 // buffer_total_ elements, fp32 or bf16 (bf16_grads)
  DType dtype_ = DType::F32;
  Buf params_compute_;  // the weights compute uses: master_ in fp32, else their bf16/fp16 copy
  // FP8 parameters: their codes (the layout's span code_span_, after every 16-bit one: params_compute_
  // ends there), and whether the master weights changed since their last cast
  uint8_t* fp8_param_codes_ = nullptr;
  GradRange code_span_;
  bool fp8_params_stale_ = true;
  LossScaler scaler_;
  int consecutive_nan_ = 0;
  std::vector<std::unique_ptr<GPTStage>> stages_;  // one per chunk
  void* shared_scratch_ = nullptr;  // the chunks' scratch within a pass (StageOptions::shared_scratch)
  int64_t shared_scratch_bytes_ = 0;
  void* slot_pool_ = nullptr;       // interleaved: the chunks' activation slots (StageOptions::slot_pool)
  std::unique_ptr<MoERowPool> moe_pool_;  // and their MoE layers' experts' rows (StageOptions::moe_pool)
  SlotPool pool_[2];                // ... each micro-batch's slot in evaluation [0] and training [1]
  std::unique_ptr<AdamW> adamw_;
  std::vector<TensorSegment> norm_segments_;  // the gradient norm's table (grad_norm_segments)
  std::unique_ptr<GradSync> grad_sync_;  // DP (and embedding group) gradient sums
  RunData data_;  // data.path (one path or a blend), data.valid_path
  const BlendedDataset* train_data_ = nullptr;
  const BlendedDataset* valid_data_ = nullptr;  // null: no validation
  std::vector<int32_t> tokens_, targets_;  // host (B, S)
  int32_t *dev_tokens_ = nullptr, *dev_targets_ = nullptr;
  // data.reset_position_ids / data.eod_mask_loss: positions (B, S) and loss weights (B, S)
  std::vector<int32_t> positions_;
  std::vector<float> loss_weights_;
  int32_t* dev_positions_ = nullptr;
  float* dev_loss_weights_ = nullptr;
  int64_t batch_counted_ = 0;  // counted_tokens() of the last forward_backward's global batch
  int num_micro_ = 1;
  std::vector<Action> train_schedule_, eval_schedule_;
  // per chunk: received activations / gradients, as many as the schedules hold at once
  // (receive_buffers; micro-batch mb's is mb mod their count), in the compute dtype (the pipeline's
  // messages travel as they are stored: 16-bit values in bf16/fp16 runs)
  std::vector<std::vector<Buf>> act_in_, grad_in_;
  std::vector<int> slots_;  // activation slots per chunk (max_in_flight_per_chunk of the schedule)
  // the local chunk's layer hooks' argument for the DP sync (model/chunks.h local_layer_index)
  int local_layer(int64_t layer) const { return local_layer_index(layers_, layer, dims_.L); }
  // logging.metrics_file (rank 0): one JSON line per logged iteration; reset after a write error
  std::unique_ptr<AuxOutput> metrics_;
  // logging.tensorboard_dir: on the last stage's first TP / DP rank (Megatron's writer rank)
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  // logging.log_timers_to_tensorboard: host seconds of each phase summed since the last log line
  double timer_fwd_bwd_s_ = 0, timer_reduce_s_ = 0, timer_optimizer_s_ = 0;
  std::unique_ptr<TraceRecorder> trace_;
  int64_t iteration_ = 0;
  bool fault_in_step_ = false;  // TPTRAIN_FAULT: fail in this iteration's last backward (tests)
  // The backend: a GPU's, whose own buffers (core/ops.h BackendWorkspace) the plan counts and the
  // constructor reserves (workspace_: what it holds after that); the device allocator's calls then,
  // and its calls inside iterations after the first (there must be none).
  bool on_gpu_ = false;
  BackendWorkspace workspace_;
  int64_t allocator_calls_reserved_ = 0, allocator_calls_first_ = 0, allocator_calls_later_ = 0;
  void reserve_backend_workspace();
  // After training: whether iterations after the first called the device allocator (all ranks); the
  // MoE layers' pool peak and their routing's host time.
  void report_allocator_calls(int64_t first_iteration);

  // checkpoint: train/trainer_checkpoint.cpp (docs/ARCHITECTURE.md "Checkpoint format")
 public:
  // Collective. Writes iteration_ (model shards, Adam moments, meta.json) to checkpoint.save; with
  // checkpoint.async_save starts writing it in the background (checkpoint_and_check_exit completes it).
  void save_checkpoint();
  // Collective. Resumes from checkpoint.load; false (a warning) when it holds no checkpoint.
  bool load_checkpoint();

 private:
  // Exit-signal handler, save-directory check, resume: called at the end of the constructor.
  void setup_checkpointing();
  // After iteration k: agrees on the exit signal / exit_duration_mins over all ranks (MAX), saves
  // at save_interval, the last iteration or an exit. True when training must stop now.
  bool checkpoint_and_check_exit(int64_t k);
  std::chrono::steady_clock::time_point start_time_;
  std::shared_ptr<void> exit_signal_guard_;  // restores the previous handler
  // This rank's shard files of a checkpoint: the master weights, exp_avg and exp_avg_sq copied into
  // host[0..2] (layout_.total floats each; only the owned ranges are written), and meta.json's content.
  std::vector<CheckpointFile> stage_checkpoint(float* const host[3]);
  nlohmann::json checkpoint_meta() const;
  // checkpoint.async_save (collective): waits for a pending save and completes it, copies the
  // shards into staging_ and starts a BackgroundSave.
  void start_async_save();
  // Collective, once every rank's writer is done (wait()ed): commits the pending save, or (failed
  // on some rank) abandons it with a warning. True when committed.
  bool settle_async_save(bool failed);
  double agreed_save_failure();  // collective: 1 if the pending save failed on any rank
  // Collective: waits for the pending save and settles it; InputError if it failed (at exit).
  void finish_async_save();
  void free_checkpoint_staging();
  // checkpoint.async_save's staging: host copies of the master weights, exp_avg and exp_avg_sq
  // (layout_.total floats each, Ops::alloc_host: page-locked with CUDA; the plan's
  // checkpoint_staging_bytes), made at the first save and reused; the MoE expert biases' copy
  float* staging_[3] = {nullptr, nullptr, nullptr};
  std::vector<float> extra_staging_;
  std::vector<float> scale_values_;  // the fp16 optimizer states' scales a save stages (optimizer_scale_tensors)
  bool staged_once_ = false;
  std::unique_ptr<BackgroundSave> pending_save_;
  double pending_stall_s_ = 0;
  // A save's numbers for the next log line's metrics and TensorBoard scalars (the iteration that
  // started it: stall_s; the one that completed it: write_s, write_gbps of the save of `iteration`)
  struct SaveReport {
    std::optional<double> stall_s, write_s, write_gbps;
    int64_t iteration = 0;
  };
  SaveReport save_report_;
};

}  // namespace tpt
