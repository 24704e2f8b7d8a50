#include "train/trainer.h"

#include <spdlog/spdlog.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>
#include <tuple>
#include <utility>
#include <unistd.h>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/doc_masks.h"
#include "interop/hf/llama.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/profiled_comm.h"
#include "parallel/tensor_parallel.h"  // fp8_amax_reduce: the scaled optimizer states' amaxes
#include "plan/memory.h"  // plan: the memory line below
#ifdef TPTRAIN_HAVE_CUDA
#include <cstdlib>

#include "core/cuda/cuda_ops.h"  // the GPU backend
#endif

namespace tpt {

namespace {

std::string hms(double seconds) {
  int64_t t = int64_t(seconds + 0.5);
  char buf[32];
  snprintf(buf, sizeof(buf), "%02lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60),
           (long long)(t % 60));
  return buf;
}

}  // namespace

Trainer::Trainer(const Config& cfg, Grid& grid) : cfg_(cfg), grid_(grid) {
  setup_backend();
  check_memory(cfg, grid);  // the plan against what this rank has, before any allocation
  setup_data();
  setup_model();
  setup_pipeline();
  reserve_backend_workspace();  // the GPU backend's own buffers: none allocated inside an iteration
  trace_ = std::make_unique<TraceRecorder>(cfg.logging.trace_file, grid.world_rank, grid.tp_rank, grid.pp_rank,
                                           grid.dp_rank);
  if (grid.world_rank == 0) {
    log_setup();
    if (!cfg.logging.metrics_file.empty())
      metrics_ = std::make_unique<AuxOutput>(cfg.logging.metrics_file, "logging.metrics_file");
  }
  if (!cfg.logging.tensorboard_dir.empty() && grid.last_stage() && grid.tp_rank == 0 && grid.dp_rank == 0 &&
      grid.cp_rank == 0) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(cfg.logging.tensorboard_dir);
    spdlog::warn("tensorboard: writing {} (tensorboard --logdir {})", tensorboard_->path(), cfg.logging.tensorboard_dir);
  }
  setup_checkpointing();  // checkpoint: resume from checkpoint.load (the optimizer exists now)
}

// The backend (GPU or CPU ranks, with the op profiler around it when logging.profile_ops).
void Trainer::setup_backend() {
  // threads: cores on this host shared among its ranks, unless cpu_threads says otherwise
  int threads = cfg_.training.cpu_threads;
  if (threads <= 0) {
    unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    threads = std::max(1, int(hw) / std::max(1, grid_.local_size));
  }
  // GPUs for training.device cuda, or auto when every rank has one; else the CPU backend. A
  // grid whose GPU is chosen already (threads as ranks on one GPU, parallel/thread_comm.h) comes
  // with its device groups.
  if (grid_.cuda_device >= 0 || use_cuda_devices(cfg_.training.device, grid_)) {
    if (grid_.cuda_device < 0) setup_cuda_devices(grid_);
#ifdef TPTRAIN_HAVE_CUDA
    CudaOptions cuda_options;
    const char* tf32 = std::getenv("TPTRAIN_CUDA_TF32");  // fp32 GEMMs on TF32 tensor cores (off by default)
    cuda_options.tf32 = tf32 && std::string(tf32) == "1";
    cuda_options.cudnn_deterministic = cfg_.training.deterministic;
    ops_ = make_cuda_ops(grid_.cuda_device, cuda_options);
    on_gpu_ = true;
    omp_set_num_threads(threads);  // the host's own work (MoE routing, model/moe_routing.cpp) on this rank's cores
#else
    internal_error("a GPU grid_, but this tptrain was built without CUDA");
#endif
  } else {
    ops_ = make_cpu_ops(threads);
  }
  if (cfg_.logging.profile_ops) {  // every op and collective timed on the backend's clock
    backend_ = std::move(ops_);
    profile_ = std::make_unique<OpProfile>(*backend_, schedule_clock_us);
    ops_ = make_profiled_ops(*backend_, *profile_, [this](int64_t in, int64_t out) { return linear_name(dims_, in, out); });
    profiled_tp_ = make_profiled_comm(grid_.device_tp(), *profile_, "tp");
    profiled_pp_ = make_profiled_comm(grid_.device_pp(), *profile_, "pp");
    profiled_dp_ = make_profiled_comm(grid_.device_dp_cp(), *profile_, "dp");  // DP x CP with context parallelism
    if (grid_.device_embedding()) profiled_embedding_ = make_profiled_comm(*grid_.device_embedding(), *profile_, "embedding");
  }
}

// The training and validation data: one path or a blend (data/run_data.h).
void Trainer::setup_data() {
  // the same code tptrain data and tptrain plan use
  data_ = open_run_data(cfg_);
  train_data_ = data_.train.get();
  valid_data_ = data_.valid.get();
  if (grid_.world_rank == 0) {
    for (const std::string& line : describe_run_data(data_, cfg_)) spdlog::info("data: {}", line);
    if (valid_data_) {
      int64_t tokens = 0, samples = 0;
      for (int i = 0; i < valid_data_->num_components(); ++i)
        tokens += valid_data_->component(i).num_tokens(), samples += valid_data_->component(i).num_samples();
      spdlog::info("data: validation {} tokens, {} samples{}", tokens, samples,
                   valid_data_->num_components() > 1 ? " (blended as the train split)" : "");
    } else if (cfg_.data.eval_iters > 0) {
      spdlog::warn("WARNING: no validation data ({}): evaluation is skipped", data_.valid_missing);
    }
    if (cfg_.data.eod_mask_loss || cfg_.data.reset_position_ids)
      spdlog::info("data: end of document = token {}{}{}", cfg_.data.eod_token_id,
                   cfg_.data.eod_mask_loss ? "; eod_mask_loss: positions whose input is it do not count in the loss" : "",
                   cfg_.data.reset_position_ids ? "; reset_position_ids: positions restart after it" : "");
  }
}

// This stage's parameters (initialised or from init_from), gradients, DP sync and optimizer.
void Trainer::setup_model() {
  chunk_dims_ = make_chunk_dims(cfg_, grid_.tp, grid_.tp_rank, grid_.pp, grid_.pp_rank);
  for (GPTDims& d : chunk_dims_) {
    apply_context_parallel(d, cfg_, grid_.cp_rank);   // this CP rank's tokens
    apply_expert_parallel(d, grid_.ep, grid_.ep_rank, grid_.etp, grid_.etp_rank);  // its experts (MoE)
  }
  dims_ = chunk_dims_.front();
  layers_ = rank_layers(chunk_dims_);
  layout_ = make_rank_layout(chunk_dims_, replica_group_align(cfg_));
  std::vector<float> host(size_t(layout_.total), 0.0f);
  // model.init_from: HF Llama (a directory, index, config.json or file with config.json beside it) or
  // HF GPT-2 (interop/hf/llama.h); each rank reads only its boxes
  if (!cfg_.model.init_from.empty()) load_init_from(cfg_.model, dims_, layout_, host.data());
  else init_params_host(layout_, cfg_.training.seed, host.data());
  dtype_ = compute_dtype(cfg_);
  // Parameter and gradient buffers: one span per replica group (model/param_group.h), padded for
  // the distributed optimizer's blocks (parallel/grad_sync.h). The dense group: DP, or DP x CP with
  // context parallelism (its ranks hold the same weights), averaged; the experts': EDP.
  const int replicas = grid_.dp_cp_size();
  // (the expert weights' replicas, EDP, can be more than one where DP x CP is one: TP folded into EDP)
  const bool distributed_optimizer = cfg_.parallel.distributed_optimizer && (replicas > 1 || grid_.edp > 1);
  auto replica_comm = [&](ReplicaGroup g) -> ReplicaComm {
    switch (g) {
      case ReplicaGroup::Dense:
        return {replicas > 1 ? &comm(grid_.device_dp_cp(), profiled_dp_) : nullptr, 1.0f / float(replicas)};
      case ReplicaGroup::ExpertData:  // summed over EDP, the same net scale (model/param_group.h)
        TPT_CHECK(grid_.ep == cfg_.parallel.expert_model_parallel_size);
        return {grid_.edp > 1 ? &grid_.device_edp() : nullptr, 1.0f / float(replicas)};
    }
    internal_error("Trainer: no communicator for replica group " + std::to_string(int(g)));
  };
  std::vector<GradGroup> groups = make_grad_groups(layout_, layers_, distributed_optimizer, replica_comm);
  buffer_total_ = grad_buffer_size(layout_, groups);
  grads_ = ops_->alloc(buffer_total_, bf16_grads(cfg_) ? DType::BF16 : DType::F32);
  GradSyncOptions sync;
  sync.overlap = cfg_.parallel.overlap_grad_reduce;
  sync.bucket_size = cfg_.parallel.ddp_bucket_size;
  sync.distributed_optimizer = distributed_optimizer;
  sync.overlap_param_gather = cfg_.parallel.overlap_param_gather;
  // TP-replicated tensors' gradients that are partial sums: over this rank's tokens (sequence
  // parallelism), over this rank's heads (the q/k norms)
  sync.tp_sum = tp_replicated_ranges(layout_, dims_.sequence_parallel);
  if (grid_.tp > 1 && !sync.tp_sum.empty()) sync.tp = &comm(grid_.device_tp(), profiled_tp_);
  else sync.tp_sum.clear();
  // the tied word embedding's two copies (first and last stage) are summed over the embedding group;
  // an untied output layer has its own gradient
  const GradRange tied = tied_embedding_range(layout_);
  TPT_CHECK(tied.n == 0 || grid_.device_embedding());
  grad_sync_ = std::make_unique<GradSync>(*ops_, grads_, std::move(groups),
                                          tied.n > 0 ? &comm(*grid_.device_embedding(), profiled_embedding_) : nullptr,
                                          tied, sync);
  // fp32 master weights: the whole buffer (fp32 runs: the weights compute uses; without the
  // distributed optimizer), else only the owned blocks next to a full compute copy in bf16 / fp16;
  // with store_param_remainders (bf16) their 16-bit remainders instead
  // (fp16 master weights: beside a compute copy, in fp32 too)
  const StateDTypes states = state_dtypes(cfg_.optimizer);
  const bool copy = dtype_ != DType::F32 || states.master == DType::F16;
  master_sharded_ = distributed_optimizer && copy;
  const int64_t master_size = master_sharded_ ? grad_sync_->owned_size() : buffer_total_;
  if (cfg_.optimizer.store_param_remainders)
    remainders_ = static_cast<uint16_t*>(ops_->alloc(master_size, DType::BF16).p);
  else
    master_ = ops_->alloc(master_size, states.master);
  code_span_ = grad_sync_->code_span();  // FP8 parameters: codes only, after the 16-bit copy's end
  TPT_CHECK(code_span_.n == 0 || (copy && master_ && master_.t == DType::F32 && code_span_.offset + code_span_.n == buffer_total_));
  if (code_span_.n) fp8_param_codes_ = static_cast<uint8_t*>(ops_->alloc_bytes(size_t(code_span_.n)));
  params_compute_ = copy ? ops_->alloc(code_span_.n ? code_span_.offset : buffer_total_, dtype_) : master_;
  scaler_.scale = dtype_ == DType::F16 ? cfg_.optimizer.initial_loss_scale : 1.0;
  // scaled fp16 states: a tensor's amax over every rank that holds a part of it (the stage's TP x DP x CP)
  ReduceMax reduce_max;
  if (states.scaled())
    reduce_max = [this](float* v, int64_t n) {
      Comm* groups[2] = {grid_.tp > 1 ? grid_.tp_group.get() : nullptr,
                         grid_.dp_cp_size() > 1 ? &grid_.dp_cp() : nullptr};
      fp8_amax_reduce(v, int(n), groups, 2);
    };
  adamw_ = std::make_unique<AdamW>(layout_, *ops_, grad_sync_->owned(), grad_sync_->owned_size(), master_,
                                   master_sharded_, grads_, copy ? params_compute_ : Buf{},
                                   remainders_, states, std::move(reduce_max), code_span_.n ? code_span_.offset : -1);
  master_from_host(host.data());
  norm_segments_ = grad_norm_segments(layout_, grad_sync_->owned(), grad_sync_->unique_ranges());
}

// The pipeline: schedules, the model stage with its activation slots, the received-message buffers
// and the micro-batch's token buffers.
void Trainer::setup_pipeline() {
  const int dp = grid_.dp;
  num_micro_ = int(cfg_.training.global_batch_size / (cfg_.training.micro_batch_size * dp));
  const int v = int(chunk_dims_.size());
  const ScheduleKind kind = schedule_kind(cfg_.parallel.pipeline_schedule, v);
  train_schedule_ = make_schedule(kind, grid_.pp, grid_.pp_rank, num_micro_, v);
  eval_schedule_ = make_schedule(ScheduleKind::ForwardOnly, grid_.pp, grid_.pp_rank, num_micro_, v);
  slots_ = max_in_flight_per_chunk(train_schedule_);
  slots_.resize(size_t(v), 0);
  StageOptions stage_options{dtype_, cfg_.training.recompute};
  stage_options.split_backward = kind == ScheduleKind::ZeroBubbleH1;  // B and W apart
  if (grid_.cp > 1) stage_options.cp = &grid_.device_cp();
  if (cfg_.training.fp8_format != Fp8Format::None) {  // docs/FP8.md
    const TrainingConfig& t = cfg_.training;
    Fp8LinearOptions& o = stage_options.fp8_options;
    stage_options.fp8 = true;
    o.hybrid = t.fp8_format == Fp8Format::Hybrid;
    o.wgrad = t.fp8_wgrad;
    o.margin = t.fp8_margin;
    o.delayed = t.fp8_recipe == Fp8Recipe::Delayed;  // amaxes over TP x DP x CP after each step (fp8_update)
    o.blockwise = t.fp8_recipe == Fp8Recipe::Blockwise;  // no amax leaves a rank
    o.history_len = t.fp8_amax_history_len;
    o.history_max = t.fp8_amax_compute_algo == "max";
    if (t.fp8_recipe == Fp8Recipe::Tensorwise) {  // current scaling: each GEMM call's amaxes over TP, then CP
      o.amax_groups[0] = grid_.tp > 1 ? &grid_.device_tp() : nullptr;  // device groups: the amaxes stay there
      o.amax_groups[1] = grid_.cp > 1 ? &grid_.device_cp() : nullptr;
    }
    std::tie(stage_options.fp8_layer_begin, stage_options.fp8_layer_end) = t.fp8_layer_range(cfg_.model.num_layers);
  }
  if (cfg_.model.is_moe()) {  // the routing's counts over TP x CP (global_aux_loss: and DP), the EP all-to-all
    if (grid_.tp > 1) stage_options.tp_host = grid_.tp_group.get();
    if (grid_.cp > 1) stage_options.cp_host = grid_.cp_group.get();
    if (grid_.dp > 1) stage_options.dp_host = grid_.dp_group.get();
    if (grid_.ep > 1) stage_options.ep = &grid_.device_ep(), stage_options.ep_host = grid_.ep_group.get();
  }
  // pipeline messages: a stage's output / input gradient, (B*S, C) or with sequence parallelism this
  // TP rank's (B*S/tp, C)
  const int64_t message = stage_message_elements(dims_, cfg_.training.micro_batch_size);
  act_in_.resize(size_t(v));
  grad_in_.resize(size_t(v));
  // the chunks run one pass at a time: one scratch for the passes of all (the largest chunk's)
  int64_t shared_scratch = 0;
  for (const GPTDims& d : chunk_dims_)
    shared_scratch = std::max(shared_scratch, shared_scratch_bytes(d, cfg_.training.micro_batch_size,
                                                                   cfg_.training.recompute, dtype_));
  shared_scratch_ = ops_->alloc_bytes(size_t(shared_scratch));
  shared_scratch_bytes_ = shared_scratch;
  stage_options.shared_scratch = shared_scratch_;
  stage_options.fp8_param_codes = fp8_param_codes_;
  stage_options.fp8_param_base = code_span_.offset;
  // interleaved: the chunks' activation slots in one pool, each micro-batch's slot assigned by the
  // schedules (pool_slots), as many as the rank holds at once -- not each chunk's own peak
  if (pooled_slots(chunk_dims_, stage_options.split_backward)) {
    pool_[0] = pool_slots(eval_schedule_, v, num_micro_);
    pool_[1] = pool_slots(train_schedule_, v, num_micro_);
    const int R = std::max(pool_[0].slots, pool_[1].slots);
    int64_t stride = 0;
    for (const GPTDims& d : chunk_dims_)
      stride = std::max(stride, pooled_slot_bytes(d, cfg_.training.micro_batch_size, cfg_.training.recompute, dtype_));
    slot_pool_ = ops_->alloc_bytes(size_t(R * stride));
    stage_options.slot_pool = slot_pool_;
    stage_options.slot_stride = stride;
    int64_t moe_rows = 0;  // the MoE layers' experts' rows in one pool of the chunks' too
    for (const GPTDims& d : chunk_dims_)
      moe_rows = std::max(moe_rows, moe_pool_slot_bytes(d, cfg_.training.micro_batch_size, cfg_.training.recompute, dtype_));
    if (moe_rows > 0) moe_pool_ = std::make_unique<MoERowPool>(*ops_, R * moe_rows);
    stage_options.moe_pool = moe_pool_.get();
    slots_.assign(size_t(v), R);
  }
  // received messages: as many per chunk as the training and the evaluation schedules hold at once
  const ReceiveBuffers train_rx = receive_buffers(train_schedule_, v), eval_rx = receive_buffers(eval_schedule_, v);
  for (int c = 0; c < v; ++c) {
    slots_[size_t(c)] = std::max(1, slots_[size_t(c)]);  // evaluation runs forwards only
    stages_.push_back(std::make_unique<GPTStage>(chunk_dims_[size_t(c)], layout_, *ops_, comm(grid_.device_tp(), profiled_tp_),
                                                 params_compute_, grads_, cfg_.training.micro_batch_size,
                                                 slots_[size_t(c)], stage_options));
    const size_t ci = size_t(c);
    for (int i = 0; i < std::max(train_rx.activations[ci], eval_rx.activations[ci]); ++i)
      act_in_[ci].push_back(ops_->alloc(message, dtype_));
    for (int i = 0; i < std::max(train_rx.gradients[ci], eval_rx.gradients[ci]); ++i)
      grad_in_[ci].push_back(ops_->alloc(message, dtype_));
  }
  // the micro-batch's tokens (B, S) on the host; on the device this CP rank's (B, S / CP)
  const size_t n = size_t(cfg_.training.micro_batch_size) * size_t(cfg_.model.seq_length);
  tokens_.resize(n);
  targets_.resize(n);
  const size_t n_dev = n / size_t(grid_.cp);
  dev_tokens_ = reinterpret_cast<int32_t*>(ops_->alloc(n_dev));
  dev_targets_ = reinterpret_cast<int32_t*>(ops_->alloc(n_dev));
  if (dims_.position_ids) {  // data.reset_position_ids, or context parallelism's global positions
    positions_.resize(n);
    dev_positions_ = reinterpret_cast<int32_t*>(ops_->alloc(n_dev));
  }
  if (cfg_.data.eod_mask_loss) {
    loss_weights_.resize(n);
    dev_loss_weights_ = ops_->alloc(n_dev);
  }
}

Trainer::~Trainer() {
  if (ops_) free_checkpoint_staging();
  stages_.clear();
  adamw_.reset();
  if (ops_) {
    ops_->free(master_.p);
    if (remainders_) ops_->free(reinterpret_cast<float*>(remainders_));
    ops_->free(grads_.p);
    ops_->free(reinterpret_cast<float*>(dev_tokens_));
    ops_->free(reinterpret_cast<float*>(dev_targets_));
    if (dev_positions_) ops_->free(reinterpret_cast<float*>(dev_positions_));
    if (dev_loss_weights_) ops_->free(dev_loss_weights_);
    for (const auto& chunk : act_in_)
      for (Buf b : chunk) ops_->free(b.p);
    for (const auto& chunk : grad_in_)
      for (Buf b : chunk) ops_->free(b.p);
    if (params_compute_.p != master_.p) ops_->free(params_compute_.p);
    if (fp8_param_codes_) ops_->free(fp8_param_codes_);
    if (shared_scratch_) ops_->free(shared_scratch_);
    if (slot_pool_) ops_->free(slot_pool_);
  }
}

void Trainer::load_microbatch(const BlendedDataset& ds, int64_t base, int m) {
  const int64_t B = cfg_.training.micro_batch_size, S = cfg_.model.seq_length;
  // Megatron's order: micro-batch m of a global batch is B * DP consecutive samples, this DP rank's B.
  std::vector<int32_t> sample(size_t(S + 1));
  for (int64_t b = 0; b < B; ++b) {
    int64_t pos = base + int64_t(m) * B * grid_.dp + int64_t(grid_.dp_rank) * B + b;
    ds.get(pos, sample.data());
    std::copy(sample.begin(), sample.end() - 1, tokens_.begin() + b * S);
    std::copy(sample.begin() + 1, sample.end(), targets_.begin() + b * S);
    const int32_t eod = int32_t(cfg_.data.eod_token_id);
    if (dev_positions_ && cfg_.data.reset_position_ids) document_positions(sample.data(), S, eod, positions_.data() + b * S);
    else if (dev_positions_)
      for (int64_t t = 0; t < S; ++t) positions_[size_t(b * S + t)] = int32_t(t);
    if (dev_loss_weights_) eod_loss_mask(sample.data(), S, eod, loss_weights_.data() + b * S);
  }
  // context parallelism: this CP rank's two chunks of each sequence (parallel/context_parallel.h)
  const int cp = grid_.cp;
  auto upload = [&](auto& host, float* dev) {
    if (cp == 1) return ops_->to_device(dev, host.data(), int64_t(host.size()));
    auto local = host;  // the first host.size() / cp entries receive this rank's chunks
    for (int64_t b = 0; b < B; ++b) cp_select(local.data() + b * (S / cp), host.data() + b * S, S, cp, grid_.cp_rank);
    ops_->to_device(dev, local.data(), int64_t(host.size()) / cp);
  };
  upload(tokens_, reinterpret_cast<float*>(dev_tokens_));
  upload(targets_, reinterpret_cast<float*>(dev_targets_));
  if (dev_positions_) upload(positions_, reinterpret_cast<float*>(dev_positions_));
  if (dev_loss_weights_) upload(loss_weights_, dev_loss_weights_);
}

int64_t Trainer::counted_tokens(const BlendedDataset& ds, int64_t base) const {
  const int64_t G = cfg_.training.global_batch_size, S = cfg_.model.seq_length;
  if (!cfg_.data.eod_mask_loss) return G * S;
  std::vector<int32_t> sample(size_t(S + 1));
  std::vector<float> w(static_cast<size_t>(S));
  int64_t counted = 0;
  for (int64_t i = 0; i < G; ++i) {
    ds.get(base + i, sample.data());
    counted += eod_loss_mask(sample.data(), S, int32_t(cfg_.data.eod_token_id), w.data());
  }
  return counted;
}

// Forward (and backward) of every micro-batch of this rank's share of the global batch starting at
// position `base`, driven by this stage's pipeline schedule. Returns the sum of token losses
// (non-zero on the last stage only).
double Trainer::forward_backward(int64_t base, const BlendedDataset& ds, bool want_grad) {
  // d(mean loss over the global batch's counted tokens) / d(token loss), times DP: DP averaging
  // divides by DP later. Without eod_mask_loss every one of the G * S tokens counts (= 1 / (B*S*M)
  // per rank). fp16: times the loss scale (gradients are unscaled after the reduction). Context
  // parallelism: each rank has S / CP tokens of a sequence and the averaging is over DP x CP.
  const int64_t B = cfg_.training.micro_batch_size, S = dims_.S;
  batch_counted_ = counted_tokens(ds, base);
  // Mixture-of-Experts: each micro-batch's balancing losses weigh as its lm loss (1 / M of this rank's
  // share; x CP: the DP x CP average divides by CP, the CP ranks' parts sum to the micro-batch's loss)
  for (auto& stage : stages_) stage->set_moe_loss_scale(float(scaler_.scale * double(grid_.cp) / double(num_micro_)));
  const float dloss =
      cfg_.data.eod_mask_loss
          ? float(scaler_.scale * double(grid_.dp_cp_size()) / double(std::max<int64_t>(batch_counted_, 1)))
          : float(scaler_.scale / double(B * S * num_micro_));
  const auto& actions = want_grad ? train_schedule_ : eval_schedule_;
  // the distributed optimizer's parameter all-gathers (parallel.overlap_param_gather): training's
  // first forward of each chunk waits for each bucket just before its layers; evaluation for all first
  if (!want_grad) grad_sync_->wait_params(INT_MAX);
  const std::function<void(int64_t)> wait_params = [&](int64_t layer) { grad_sync_->wait_params(local_layer(layer)); };
  // the last micro-batch's backward (or with zb-h1 its W) finishes each layer's gradients: the DP sums may start
  const std::function<void(int64_t)> layer_done = [&](int64_t layer) { grad_sync_->layer_done(local_layer(layer)); };
  const bool split = std::any_of(actions.begin(), actions.end(),
                                 [](const Action& a) { return a.kind == Action::Kind::BackwardWeight; });
  const bool first_input = grid_.first_stage(), last_output = grid_.last_stage();  // chunks 0 / v - 1 only
  const int last_chunk = int(stages_.size()) - 1;
  double loss_sum = 0;
  StageHooks h;
  const int64_t n = stage_message_elements(dims_, B);  // elements of one message, in the compute dtype
  auto slot = [&](int mb, int chunk) {
    return slot_pool_ ? pool_[want_grad].slot[size_t(chunk)][size_t(mb)] : mb % slots_[size_t(chunk)];
  };
  // micro-batch mb's received activation / gradient of a chunk (receive_buffers)
  auto act_in = [&](int mb, int chunk) { return act_in_[size_t(chunk)].at(size_t(mb) % act_in_[size_t(chunk)].size()); };
  auto grad_in = [&](int mb, int chunk) { return grad_in_[size_t(chunk)].at(size_t(mb) % grad_in_[size_t(chunk)].size()); };
  auto fault = [&](int mb) {
    if (fault_in_step_ && mb == num_micro_ - 1)
      internal_error("injected fault (TPTRAIN_FAULT) in the backward of micro-batch " + std::to_string(mb) +
                     " of iteration " + std::to_string(iteration_ + 1));
  };
  h.forward = [&](int mb, int chunk) {
    const bool embed = first_input && chunk == 0, head = last_output && chunk == last_chunk;
    // RoPE with data.reset_position_ids: every stage rotates by the micro-batch's positions
    if (embed || head || (dims_.rot && dev_positions_)) load_microbatch(ds, base, mb);
    stages_[size_t(chunk)]->forward(slot(mb, chunk), dev_tokens_, embed ? CBuf{} : CBuf(act_in(mb, chunk)),
                                    dev_positions_,
                                    mb == 0 && want_grad && grad_sync_->overlapping_param_gather() ? wait_params
                                                                                                  : std::function<void(int64_t)>{});
    if (head) loss_sum += stages_[size_t(chunk)]->loss(slot(mb, chunk), dev_targets_, dloss, want_grad, dev_loss_weights_);
  };
  h.backward = [&](int mb, int chunk) {
    if (chunk == 0) fault(mb);
    const bool head = last_output && chunk == last_chunk, last = mb == num_micro_ - 1 && grad_sync_->overlapping();
    stages_[size_t(chunk)]->backward(slot(mb, chunk), head ? CBuf{} : CBuf(grad_in(mb, chunk)),
                                     last && !split ? layer_done : std::function<void(int64_t)>{},
                                     split ? GPTStage::BackwardPart::Input : GPTStage::BackwardPart::Full);
  };
  h.backward_weight = [&](int mb, int chunk) {
    const bool last = mb == num_micro_ - 1 && grad_sync_->overlapping();
    stages_[size_t(chunk)]->backward_weight(slot(mb, chunk), last ? layer_done : std::function<void(int64_t)>{});
  };
  // messages are the stored tensors themselves, counted in 4-byte words
  auto words = [](CBuf b) { return static_cast<const float*>(b.p); };
  h.activation_out = [&](int mb, int chunk) { return words(stages_[size_t(chunk)]->output(slot(mb, chunk))); };
  h.activation_in = [&](int mb, int chunk) { return static_cast<float*>(act_in(mb, chunk).p); };
  h.grad_out = [&](int, int chunk) { return words(stages_[size_t(chunk)]->input_grad()); };
  h.grad_in = [&](int mb, int chunk) { return static_cast<float*>(grad_in(mb, chunk).p); };
  if (trace_->enabled() && want_grad)
    h.on_action = [&](const Action& a, double t0, double t1) { trace_->record(iteration_ + 1, a, t0, t1); };
  execute_schedule(actions, comm(grid_.device_pp(), profiled_pp_), words_of(n, dtype_), h);
  return loss_sum;
}

Trainer::StepResult Trainer::train_step(int64_t k) {
  const int64_t G = cfg_.training.global_batch_size;
  StepResult r;
  r.loss_scale = scaler_.scale;
  ops_->zero(grads_, buffer_total_);
  const double t_fwd_bwd = schedule_clock_us();
  fp8_weights_changed();  // the last step updated them
  if (fp8_delayed()) fp8_begin_step();
  fp8_cast_params();
  double loss_sum = forward_backward((k - 1) * G, *train_data_, true);
  if (cfg_.model.moe_router_enable_expert_bias) update_expert_bias();
  if (fp8_delayed()) {
    fp8_update();
    fp8_params_stale_ = true;  // new scales: FP8 parameters are cast again before they are read
  }
  // gradients averaged over DP (buckets already started during the last backward finish here;
  // reduce-scattered with the distributed optimizer), the tied word embedding's summed over the
  // embedding group
  const double t_reduce = schedule_clock_us();
  grad_sync_->finish();
  const double t_reduced = schedule_clock_us();
  trace_->record_span(k, "reduce gradients (DP, embedding group)", "allreduce", t_reduce, t_reduced);
  timer_fwd_bwd_s_ += (t_reduce - t_fwd_bwd) * 1e-6;
  timer_reduce_s_ += (t_reduced - t_reduce) * 1e-6;
  const std::vector<ShardRange>& owned = grad_sync_->owned();  // what this rank updates
  auto scale_owned = [&](double factor) {
    for (const ShardRange& o : owned) ops_->scale(grads_ + o.offset, float(factor), o.n);
  };
  if (scaler_.scale != 1.0) scale_owned(1.0 / scaler_.scale);
  // loss: sum over the whole global batch (all DP ranks), on the last stage; an inf/nan anywhere in
  // the gradients of any rank (MAX over the job) skips the step everywhere. The squared gradient
  // norm: each rank's sum over what it answers for (norm_segments_: the primary copies in its
  // unique ranges, so every element once in the world), summed over the world -- at once with the
  // distributed optimizer, else over the model-parallel group, then over the replicas (DP x CP),
  // where each replica group's rank 0 alone brings its group's part. One multi-tensor reduction
  // gives the norm and the nan/inf check (one read to the host on a GPU).
  const GradStats grad_stats = ops_->grad_stats(grads_, norm_segments_);
  double stats[2] = {grid_.last_stage() && grid_.tp_rank == 0 ? loss_sum : 0.0, grad_stats.sum_squares};
  if (grad_sync_->distributed()) {
    grid_.world->all_reduce(stats, 2, ReduceOp::Sum);
  } else {
    grid_.mp_group->all_reduce(stats, 2, ReduceOp::Sum);
    grid_.dp_cp().all_reduce(stats, 2, ReduceOp::Sum);  // every DP and CP rank's tokens too
  }
  const double dp_loss = stats[0];
  double nonfinite = grad_stats.nonfinite ? 1.0 : 0.0;
  grid_.world->all_reduce(&nonfinite, 1, ReduceOp::Max);
  r.lm_loss = dp_loss / double(std::max<int64_t>(batch_counted_, 1));  // G * S without eod_mask_loss
  if (cfg_.model.is_moe()) {
    std::vector<MoEStats> moe;
    for (auto& stage : stages_)
      if (stage->moe()) moe.push_back(stage->moe()->take_stats());
    r.moe = reduce_moe_metrics(cfg_.model, moe, *grid_.world);
  }
  r.grad_norm = std::sqrt(stats[1]);
  if (dtype_ == DType::F16) {
    r.skipped = nonfinite > 0 || !std::isfinite(r.lm_loss);  // an overflowed logit: inf loss, finite gradients
    scaler_.update(r.skipped);
    if (r.skipped) return r;
  } else if (nonfinite > 0 || !std::isfinite(r.lm_loss)) {
    r.nan = true;
    if (++consecutive_nan_ >= cfg_.training.nan_iteration_limit)
      internal_error("iteration " + std::to_string(k) + ": " + std::to_string(consecutive_nan_) +
                     " consecutive iterations with a nan/inf loss or gradient (training.nan_iteration_limit = " +
                     std::to_string(cfg_.training.nan_iteration_limit) + "); stopping");
    return r;
  }
  consecutive_nan_ = 0;
  const double clip = cfg_.optimizer.clip_grad;
  // the clip is folded into the update: AdamW multiplies each gradient by it as it reads it
  const float clip_scale = clip > 0 && r.grad_norm > clip ? float(clip / (r.grad_norm + 1e-6)) : 1.0f;
  const double t_opt = schedule_clock_us();
  adamw_->step(cfg_.optimizer, learning_rate(cfg_.optimizer, k), k, clip_scale);  // also refreshes the compute copy
  grad_sync_->start_param_gather(params_compute_);  // distributed optimizer: the updated blocks to every DP rank
  fp8_params_stale_ = true;  // (FP8 parameters: cast and gathered when the next step begins)
  const double t_opt_end = schedule_clock_us();
  trace_->record_span(k, "optimizer (AdamW)", "optimizer", t_opt, t_opt_end);
  timer_optimizer_s_ += (t_opt_end - t_opt) * 1e-6;
  return r;
}

double Trainer::evaluate() {
  const int64_t G = cfg_.training.global_batch_size;
  fp8_weights_changed();
  if (fp8_params_stale_) fp8_cast_params();
  double sum = 0;
  int64_t counted = 0;  // eval_iters * G * S without eod_mask_loss
  for (int64_t i = 0; i < cfg_.data.eval_iters; ++i) {
    double s = forward_backward(i * G, *valid_data_, false);
    double v = grid_.last_stage() && grid_.tp_rank == 0 ? s : 0.0;
    grid_.world->all_reduce(&v, 1, ReduceOp::Sum);
    sum += v;
    counted += batch_counted_;
  }
  for (auto& stage : stages_)  // evaluation's routing is not the training step's
    if (stage->moe()) stage->moe()->discard_step();
  return sum / double(std::max<int64_t>(counted, 1));
}

void Trainer::log_iteration(int64_t k, const StepResult& r, double lr, double elapsed_ms, int64_t n_iters,
                            int skipped, int nans, std::optional<double> val_loss) {
  const Config& c = cfg_;
  const int64_t G = c.training.global_batch_size;
  const double per_iter_ms = elapsed_ms / double(std::max<int64_t>(1, n_iters));
  const double tokens_per_s = double(G * c.model.seq_length) / (per_iter_ms / 1000.0);
  const double tflops = iteration_model_flops(c, dims_.Vp) / (per_iter_ms / 1000.0) / grid_.world_size / 1e12;
  const double eta_s = double(c.training.train_iters - k) * per_iter_ms / 1000.0;
  if (tensorboard_) {
    std::vector<std::pair<std::string, float>> v = {{"lm loss", float(r.lm_loss)},
                                                    {"learning-rate", float(lr)},
                                                    {"grad-norm", float(r.grad_norm)},
                                                    {"loss-scale", float(r.loss_scale)},
                                                    {"iteration-time", float(per_iter_ms / 1000.0)},
                                                    {"throughput", float(tokens_per_s)},
                                                    {"mem-allocated-bytes", float(ops_->allocated_bytes())},
                                                    {"batch-size", float(G)}};
    for (const auto& [name, value] : r.moe.values()) v.emplace_back(name, float(value));
    if (val_loss) {
      v.emplace_back("lm loss validation", float(*val_loss));
      v.emplace_back("lm loss validation ppl", float(std::exp(std::min(*val_loss, 20.0))));
    }
    if (save_report_.stall_s) v.emplace_back("save-checkpoint-time", float(*save_report_.stall_s));
    if (save_report_.write_s) {
      v.emplace_back("save-checkpoint-write-time", float(*save_report_.write_s));
      v.emplace_back("save-checkpoint-write-throughput", float(*save_report_.write_gbps));
    }
    if (c.logging.log_timers_to_tensorboard) {  // this rank's host time per iteration, seconds
      const double n = double(std::max<int64_t>(1, n_iters));
      v.emplace_back("forward-backward-time", float(timer_fwd_bwd_s_ / n));
      v.emplace_back("grads-reduce-time", float(timer_reduce_s_ / n));
      v.emplace_back("optimizer-time", float(timer_optimizer_s_ / n));
    }
    if (!tensorboard_->add_scalars(k, v)) tensorboard_.reset();  // warned once; training goes on
  }
  timer_fwd_bwd_s_ = timer_reduce_s_ = timer_optimizer_s_ = 0;
  const SaveReport save = std::exchange(save_report_, SaveReport{});
  if (grid_.world_rank != 0) return;
  spdlog::info(
      "iteration {:>8}/{:>8} | consumed samples {:>12} | elapsed time per iteration (ms): {:.1f} | "
      "learning rate {:.3E} | global batch size {:>5} | lm loss {:.6E} | loss scale {:.1f} | grad norm {:.3f} | "
      "number of skipped iterations {:>3} | number of nan iterations {:>3} | tokens/s {:.0f} | "
      "TFLOP/s/device {:.3f} | ETA {}",
      k, c.training.train_iters, k * G, per_iter_ms, lr, G, r.lm_loss, r.loss_scale, r.grad_norm, skipped, nans,
      tokens_per_s, tflops, hms(eta_s));
  if (r.moe.on) {  // Megatron's MoE line: the balancing losses and the routing's imbalance
    std::string line;
    for (const auto& [name, value] : r.moe.values()) line += fmt::format("{}{}: {:.6E}", line.empty() ? "" : " | ", name, value);
    spdlog::info(" MoE: {}", line);
  }
  if (metrics_) {
    nlohmann::json j = {{"iteration", k},
                        {"consumed_samples", k * G},
                        {"lm_loss", r.lm_loss},
                        {"lr", lr},
                        {"grad_norm", r.grad_norm},
                        {"loss_scale", r.loss_scale},
                        {"skipped_iterations", skipped},
                        {"nan_iterations", nans},
                        {"elapsed_ms", per_iter_ms},
                        {"tokens_per_s", tokens_per_s},
                        {"tflops_per_device", tflops},
                        {"mfu", nullptr}};
    if (val_loss) j["val_lm_loss"] = *val_loss;
    if (save.stall_s) j["save_checkpoint_time"] = *save.stall_s;
    if (save.write_s) {
      j["save_checkpoint_iteration"] = save.iteration;
      j["save_checkpoint_write_time"] = *save.write_s;
      j["save_checkpoint_write_gbps"] = *save.write_gbps;
    }
    for (const auto& [name, value] : r.moe.values()) j[name] = value;
    if (!metrics_->append(j.dump() + "\n")) metrics_.reset();  // a whole line or none; warned once
  }
}

void Trainer::write_trace() {
  if (!trace_->enabled()) return;
  trace_->write_part();
  grid_.world->barrier();
  if (grid_.world_rank == 0) {
    if (TraceRecorder::merge(cfg_.logging.trace_file, grid_.world_size))
      spdlog::info("trace: wrote {}", cfg_.logging.trace_file);
  }
}

int Trainer::train() {
  const Config& c = cfg_;
  const bool rank0 = grid_.world_rank == 0;
  using clock = std::chrono::steady_clock;
  auto window_start = clock::now();
  int64_t window_iters = 0, window_counted = 0;
  int window_skipped = 0, window_nan = 0;
  double window_loss = 0;
  // TPTRAIN_FAULT=RANK:ITERATION: that rank fails in that iteration, after its forward and backward
  // have started (tests of the failure path: the job must end with the rank's message, no hang)
  int64_t fault_iteration = -1;
  if (const char* f = std::getenv("TPTRAIN_FAULT")) {
    int r = -1;
    long long it = -1;
    if (std::sscanf(f, "%d:%lld", &r, &it) == 2 && r == grid_.world_rank) fault_iteration = it;
  }
  const int64_t first = iteration_ + 1;
  for (int64_t k = iteration_ + 1; k <= c.training.train_iters; ++k) {
    const auto step_start = clock::now();
    if (k == fault_iteration) fault_in_step_ = true;
    const int64_t calls_before = ops_->allocator_calls();
    StepResult r = train_step(k);
    (k > first ? allocator_calls_later_ : allocator_calls_first_) += ops_->allocator_calls() - calls_before;
    iteration_ = k;
    if (profile_)  // the first iteration is warm-up (GEMM algorithm choice, first touches)
      profile_iteration(k, k > first, std::chrono::duration<double, std::milli>(clock::now() - step_start).count());
    ++window_iters;
    window_skipped += r.skipped;
    window_nan += r.nan;
    if (!r.skipped && !r.nan) window_loss += r.lm_loss, ++window_counted;  // Megatron averages updated steps
    std::optional<double> val;
    const bool eval_now = valid_data_ && c.data.eval_iters > 0 && k % c.data.eval_interval == 0;
    // The window's time ends before a checkpoint's save (Megatron's iteration time leaves it out
    // too); the save comes before the log line, which has its numbers.
    const auto save_start = clock::now();
    double ms = std::chrono::duration<double, std::milli>(save_start - window_start).count();
    const bool stop = checkpoint_and_check_exit(k);  // checkpoint: save_interval / last iteration / exit signal
    // iteration 1 too: the loss where it starts (the first point of the metrics and the plots)
    const bool log_now = k == 1 || k % c.logging.log_interval == 0 || k == c.training.train_iters || eval_now || stop;
    if (!log_now) window_start += clock::now() - save_start;
    if (log_now) {
      // the slowest rank's time (as Megatron's timers): the same number in the log line, the metrics
      // and the TensorBoard file, whichever rank writes them (one double, only on logged iterations)
      if (grid_.world_size > 1) grid_.world->all_reduce(&ms, 1, ReduceOp::Max);
      StepResult avg = r;
      if (window_counted) avg.lm_loss = window_loss / double(window_counted);
      if (eval_now) {
        val = evaluate();
        if (profile_) profile_iteration(k, false, 0);
        if (rank0)
          spdlog::info("validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.6E}", k, *val,
                       std::exp(std::min(*val, 20.0)));
      }
      if (rank0 || tensorboard_) log_iteration(k, avg, learning_rate(c.optimizer, k), ms, window_iters, window_skipped, window_nan, val);
      window_start = clock::now();
      window_iters = window_counted = 0;
      window_skipped = window_nan = 0;
      window_loss = 0;
    }
    if (stop) {
      grad_sync_->wait_params(INT_MAX);
      report_profile();
      report_allocator_calls(first);
      return 0;
    }
  }
  grad_sync_->wait_params(INT_MAX);  // no collective left running
  report_profile();
  report_allocator_calls(first);
  return 0;
}

void Trainer::profile_iteration(int64_t k, bool counted, double wall_ms) {
  for (const OpProfile::Timed& t : profile_->flush(counted)) trace_->record_span(k, t.name, "op", t.t0_us, t.t1_us);
  if (counted) profile_->count_iteration(wall_ms);
}

void Trainer::report_profile() const {
  if (!profile_ || grid_.world_rank != 0) return;
  spdlog::info("op profile of rank 0 (stage 0) over {} iterations (the first iteration excluded), on {}:",
               profile_->iterations(), backend_->name());
  std::string table = profile_->table();
  for (size_t a = 0, b; a < table.size(); a = b + 1) {
    b = table.find('\n', a);
    if (b == std::string::npos) b = table.size();
    spdlog::info("  {}", table.substr(a, b - a));
  }
}

}  // namespace tpt
