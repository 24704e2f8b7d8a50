// The Trainer's side of checkpoints (docs/ARCHITECTURE.md "Checkpoint format"): maps this rank's parameter
// layout (the fp32 master weights) and AdamW moments to parallel/checkpoint.h's boxes, keeps the
// fp16 loss scaler's state in meta.json, and handles the exit signal.
//
// Who writes what (per parameter group, model/param_group.h): each element of a replica group is
// written by the one replica that answers for it (GradSync::unique_ranges), and only from its
// primary copy (ParamGroup::primary: TP-replicated tensors from tp_rank 0, the word embedding from
// the first stage -- the last stage's tied copy is identical and is loaded from the same boxes),
// never the vocabulary padding rows. Without the distributed optimizer that replica is the group's
// rank 0: for the dense group DP x CP rank 0 of each (tp, pp), which writes
// model_tpXX_ppYYY.safetensors (the fp32 parameters) and optim_tpXX_ppYYY_dp000.safetensors
// (exp_avg, exp_avg_sq: every replica holds the same). With it every replica writes the blocks it
// owns (parallel/grad_sync.h) of both, model_tpXX_ppYYY_dpZZZ.safetensors and
// optim_tpXX_ppYYY_dpZZZ.safetensors: a block is a flat range of the layout, saved as boxes of the
// global tensors it covers (flat_range_parts), so either kind loads on any layout with or without
// the distributed optimizer. "dpZZZ" is the rank in DP x CP (Grid::dp_cp_rank), so CP leaves the
// files' layout unchanged; a rank that answers for a group but is not DP x CP rank 0 names its
// model file with it too.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "core/error.h"
#include "parallel/checkpoint.h"
#include "parallel/checkpoint_async.h"
#include "plan/memory.h"
#include "train/trainer.h"

namespace tpt {

namespace {

constexpr const char* kExpAvg = "optimizer.state.exp_avg.";
constexpr const char* kExpAvgSq = "optimizer.state.exp_avg_sq.";

volatile std::sig_atomic_t g_exit_signal = 0;
void on_exit_signal(int) { g_exit_signal = 1; }

int signal_number(const std::string& name) {
  static const std::map<std::string, int> numbers = {
      {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGHUP", SIGHUP}};
  auto it = numbers.find(name);
  if (it == numbers.end()) input_error("checkpoint.exit_signal: unknown signal '" + name + "'");
  return it->second;
}

// This rank's tensors in `buffer` (a host copy of a parameter-shaped buffer), named prefix + name.
// for_save: each global element once (see the file comment): the primary copies' parts in
// `unique`; else every local tensor.
std::vector<CkptTensor> rank_tensors(const ParamLayout& layout, float* buffer, const std::string& prefix,
                                     bool for_save, const std::vector<GradRange>& unique = {}) {
  std::vector<CkptTensor> out;
  for (const ParamInfo& p : layout.params) {
    if (for_save && !p.group.primary) continue;
    CkptTensor t{p, buffer + p.offset};
    t.name = prefix + p.name;
    if (!for_save) {
      out.push_back(std::move(t));
      continue;
    }
    std::vector<std::pair<int64_t, int64_t>> ranges;  // the unique parts of the local tensor
    for (const GradRange& r : unique) {
      const int64_t lo = std::max(p.offset, r.offset), hi = std::min(p.offset + p.numel, r.offset + r.n);
      if (lo < hi) ranges.emplace_back(lo - p.offset, hi - p.offset);
    }
    for (CkptTensor& part : flat_range_parts(t, ranges)) out.push_back(std::move(part));
  }
  return out;
}

double megabytes(double bytes) { return bytes / 1e6; }

}  // namespace

void Trainer::setup_checkpointing() {
  const CheckpointConfig& ck = cfg_.checkpoint;
  start_time_ = std::chrono::steady_clock::now();
  const int sig = signal_number(ck.exit_signal);
  struct sigaction sa {}, old {};
  sa.sa_handler = on_exit_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  g_exit_signal = 0;
  if (::sigaction(sig, &sa, &old) != 0) internal_error("sigaction(" + ck.exit_signal + ") failed");
  exit_signal_guard_ = std::shared_ptr<void>(nullptr, [sig, old](void*) { ::sigaction(sig, &old, nullptr); });
  if (!ck.save.empty() && grid_.world_rank == 0) check_save_dir(ck.save);  // fail before training, not after
  if (!ck.load.empty()) load_checkpoint();
}

std::vector<CheckpointFile> Trainer::stage_checkpoint(float* const host[3]) {
  const std::vector<GradRange> unique = grad_sync_->unique_ranges();  // what this rank answers for
  if (unique.empty()) return {};
  const bool distributed = grad_sync_->distributed();  // every replica saves the blocks it owns
  const int replica = grid_.dp_cp_rank();  // DP rank, or with context parallelism the DP x CP rank
  master_to_host(host[0]);  // the fp32 master weights (with remainders: merged)
  adamw_->to_host(0, host[1]);  // the moments as fp32
  adamw_->to_host(1, host[2]);
  std::vector<CkptTensor> model = rank_tensors(layout_, host[0], "", true, unique);
  // the state outside the parameters (MoE expert biases, FP8 scales and amax histories): every copy is
  // the same, so TP rank 0 / DP x CP rank 0 saves it; copied (training updates it while a background
  // writer runs) on every rank alike, as the plan counts it
  // (and the scaled fp16 optimizer states' scales: the same on every rank of the stage)
  std::vector<CkptTensor> extra = extra_state_tensors();
  std::vector<bool> keep(extra.size(), true);
  for (CkptTensor& t : optimizer_scale_tensors(scale_values_, &keep)) extra.push_back(std::move(t));
  const bool primary = grid_.tp_rank == 0 && grid_.dp_cp_rank() == 0;
  size_t extra_floats = 0;
  for (const CkptTensor& t : extra) extra_floats += size_t(volume(t.local_shape));
  extra_staging_.resize(extra_floats);  // the same size at every save: allocated once
  float* b = extra_staging_.data();
  for (size_t i = 0; i < extra.size(); ++i) {
    CkptTensor t = extra[i];
    std::copy(t.data, t.data + volume(t.local_shape), b);
    t.data = b;
    b += volume(t.local_shape);
    if (primary && keep[i]) model.push_back(std::move(t));
  }
  std::vector<CheckpointFile> files(2);
  files[0].name = distributed || replica != 0 ? model_shard_name(grid_.tp_rank, grid_.pp_rank, replica)
                                              : model_shard_name(grid_.tp_rank, grid_.pp_rank);
  files[0].tensors = std::move(model);
  files[1].name = optim_shard_name(grid_.tp_rank, grid_.pp_rank, replica);
  files[1].tensors = rank_tensors(layout_, host[1], kExpAvg, true, unique);
  for (CkptTensor& t : rank_tensors(layout_, host[2], kExpAvgSq, true, unique)) files[1].tensors.push_back(std::move(t));
  return files;
}

nlohmann::json Trainer::checkpoint_meta() const {
  const int64_t n = iteration_, G = cfg_.training.global_batch_size;
  return {
      {"consumed_samples", n * G},
      {"config", config_to_json(cfg_)},
      {"grid", {{"tensor_model_parallel_size", grid_.tp}, {"pipeline_model_parallel_size", grid_.pp},
                {"data_parallel_size", grid_.dp}, {"context_parallel_size", grid_.cp},
                {"expert_model_parallel_size", grid_.ep}, {"world_size", grid_.world_size}}},
      {"scheduler", {{"iteration", n}, {"lr", learning_rate(cfg_.optimizer, n)}}},
      {"optimizer", {{"type", "adamw"}, {"step", n}, {"state", {"exp_avg", "exp_avg_sq"}},
                     {"distributed", grad_sync_->distributed()}}},
      // fp16's dynamic loss scaler (null for fp32 / bf16, which do not scale)
      {"loss_scaler", dtype_ != DType::F16 ? nlohmann::json(nullptr)
                                           : nlohmann::json{{"scale", scaler_.scale},
                                                            {"growth_tracker", scaler_.growth_tracker},
                                                            {"hysteresis_tracker", scaler_.hysteresis_tracker}}},
      // Every random number is a pure function of (seed, name, index): the seed is the whole state.
      {"rng", {{"seed", cfg_.training.seed}}},
      {"sampler", {{"consumed_samples", n * G}, {"global_batch_size", G}, {"shuffle", cfg_.data.shuffle},
                   {"seed", cfg_.training.seed},
                   // data/run_data.h: the blend's per-component counts at this position (a shortcut on resume)
                   {"blend", blend_state_json(*data_.train, n * G)}}}};
}

void Trainer::save_checkpoint() {
  if (cfg_.checkpoint.async_save) {
    start_async_save();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = iteration_;
  CheckpointWriter writer(*grid_.world, cfg_.checkpoint.save, n);
  std::vector<float> host[3];
  if (!grad_sync_->unique_ranges().empty())
    for (auto& h : host) h.assign(size_t(layout_.total), 0.0f);
  float* const bufs[3] = {host[0].data(), host[1].data(), host[2].data()};
  for (const CheckpointFile& f : stage_checkpoint(bufs)) writer.write_file(f.name, f.tensors);
  const uint64_t bytes = writer.commit(checkpoint_meta(), cfg_.checkpoint.keep_last);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  save_report_.stall_s = s;
  if (grid_.world_rank == 0)
    spdlog::info("saved checkpoint at iteration {} to {} ({:.1f} MB in {:.3f} s, {:.0f} MB/s)", n, writer.path(),
                 megabytes(double(bytes)), s, megabytes(double(bytes)) / std::max(s, 1e-9));
}

// checkpoint.async_save: the copy into the staging buffers is the training loop's stall; a writer
// thread writes the files (parallel/checkpoint_async.h) and a later iteration boundary completes it.
void Trainer::start_async_save() {
  const bool rank0 = grid_.world_rank == 0;
  if (pending_save_) {  // one save at a time: the previous one finishes first
    const int64_t before = pending_save_->iteration();
    double waited = pending_save_->wait();
    grid_.world->all_reduce(&waited, 1, ReduceOp::Max);
    if (rank0)
      spdlog::info("checkpoint: waited {:.3f} s for the background save of iteration {} before saving iteration {}",
                   waited, before, iteration_);
    settle_async_save(agreed_save_failure());
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (!staging_[0] && !grad_sync_->unique_ranges().empty())  // the first save: sized once, reused
    for (float*& h : staging_) h = static_cast<float*>(ops_->alloc_host(size_t(layout_.total) * sizeof(float)));
  auto writer = std::make_unique<CheckpointWriter>(*grid_.world, cfg_.checkpoint.save, iteration_);
  const bool first = !staged_once_;
  std::vector<CheckpointFile> files = stage_checkpoint(staging_);
  if (first && staging_[0]) {  // plan = allocation (plan/memory.cpp checkpoint_staging_bytes)
    staged_once_ = true;
    const int64_t held = 3 * layout_.total * 4 + int64_t(extra_staging_.size()) * 4;
    const int64_t planned = stage_memory(cfg_, grid_.pp_rank, on_gpu_).checkpoint_staging_bytes;
    if (held != planned)
      internal_error("checkpoint staging: " + std::to_string(held) + " bytes held, the plan counts " +
                     std::to_string(planned));
  }
  pending_save_ = std::make_unique<BackgroundSave>(std::move(writer), std::move(files), checkpoint_meta());
  double stall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  grid_.world->all_reduce(&stall, 1, ReduceOp::Max);  // the slowest rank's copy holds everyone up
  pending_stall_s_ = stall;
  save_report_.stall_s = stall;
  if (rank0)
    spdlog::info("saving checkpoint at iteration {} to {} in the background: copied to host memory in {:.3f} s",
                 iteration_, pending_save_->path(), stall);
}

double Trainer::agreed_save_failure() {
  double failed = pending_save_->error().empty() ? 0.0 : 1.0;
  grid_.world->all_reduce(&failed, 1, ReduceOp::Max);
  return failed;
}

bool Trainer::settle_async_save(bool failed) {
  const bool rank0 = grid_.world_rank == 0;
  const int64_t n = pending_save_->iteration();
  if (failed) pending_save_->cancel();  // abandoned on every rank: writers still running stop at their next write
  pending_save_->wait();
  if (failed) {
    const std::string error = pending_save_->error();
    const std::string path = pending_save_->path();
    pending_save_.reset();  // removes iter_N.partial
    grid_.world->barrier();
    if (!error.empty() && error.find("save abandoned") == std::string::npos)
      spdlog::warn("WARNING: checkpoint: rank {}: the background save of iteration {} failed: {}", grid_.world_rank,
                   n, error);
    if (rank0)
      spdlog::warn("WARNING: checkpoint: the save of iteration {} is abandoned ({}.partial removed); the latest "
                   "checkpoint in {} is as it was; the next save tries again",
                   n, path, cfg_.checkpoint.save);
    return false;
  }
  const uint64_t bytes = pending_save_->commit(cfg_.checkpoint.keep_last);
  double write_s = pending_save_->write_seconds();
  grid_.world->all_reduce(&write_s, 1, ReduceOp::Max);  // the slowest rank's writer
  const double gbps = double(bytes) / 1e9 / std::max(write_s, 1e-9);
  save_report_.write_s = write_s;
  save_report_.write_gbps = gbps;
  save_report_.iteration = n;
  if (rank0)
    spdlog::info("saved checkpoint at iteration {} to {} ({:.1f} MB; stall {:.3f} s, background write {:.3f} s, "
                 "{:.3f} GB/s; completed at iteration {})",
                 n, pending_save_->path(), megabytes(double(bytes)), pending_stall_s_, write_s, gbps, iteration_);
  pending_save_.reset();
  return true;
}

void Trainer::finish_async_save() {
  if (!pending_save_) return;
  pending_save_->wait();  // before agreed_save_failure: every writer's outcome is known
  const std::string error = pending_save_->error();
  const int64_t n = pending_save_->iteration();
  if (settle_async_save(agreed_save_failure() > 0)) return;
  input_error("checkpoint.save: the save of iteration " + std::to_string(n) + " failed" +
              (error.empty() ? std::string(" on another rank") : ": " + error) +
              "; the latest checkpoint is the one before it");
}

void Trainer::free_checkpoint_staging() {
  pending_save_.reset();  // a writer still running is stopped before its memory goes
  for (float*& h : staging_) {
    if (h) ops_->free_host(h);
    h = nullptr;
  }
}

bool Trainer::load_checkpoint() {
  const auto t0 = std::chrono::steady_clock::now();
  const bool rank0 = grid_.world_rank == 0;
  const std::string& dir = cfg_.checkpoint.load;
  const size_t total = size_t(layout_.total);
  std::vector<float> host(total, 0.0f);
  const std::vector<CkptTensor> groups[3] = {rank_tensors(layout_, host.data(), "", false),
                                             rank_tensors(layout_, host.data(), kExpAvg, false),
                                             rank_tensors(layout_, host.data(), kExpAvgSq, false)};
  std::vector<float> scales;  // the scaled fp16 states' (0: not in the checkpoint)
  const std::vector<CkptTensor> scale_tensors = optimizer_scale_tensors(scales);
  LoadRequest req;
  req.dir = dir;
  for (const auto& g : groups) req.wanted.insert(req.wanted.end(), g.begin(), g.end());
  const std::vector<CkptTensor> extra = extra_state_tensors();  // MoE's expert biases, FP8's state: into the stages
  req.wanted.insert(req.wanted.end(), extra.begin(), extra.end());
  req.wanted.insert(req.wanted.end(), scale_tensors.begin(), scale_tensors.end());
  // The whole model (one stage, one TP rank): names and global shapes for the shape check.
  const ParamLayout whole = make_param_layout(make_dims(cfg_, 1, 0, 1, 0));
  for (const char* prefix : {"", kExpAvg, kExpAvgSq})
    for (const ParamInfo& p : whole.params) req.model.push_back({prefix + p.name, p.global_shape});
  for (const GlobalTensor& t : expert_bias_model()) req.model.push_back(t);
  for (const GlobalTensor& t : fp8_state_model()) req.model.push_back(t);
  for (const CkptTensor& t : scale_tensors) req.model.push_back({t.name, t.global_shape});
  req.optional = is_optional_state_name;  // FP8's delayed scaling, fp16 optimizer states: with some settings only

  {  // a missing directory is the first run of a requeued job; anything else but a directory is a mistake
    std::error_code ec;
    const auto st = std::filesystem::status(dir, ec);
    if (!ec && std::filesystem::exists(st) && !std::filesystem::is_directory(st))
      input_error("checkpoint.load: '" + dir + "' is not a directory");
  }
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::open(*grid_.world, req);
  if (!reader) {
    if (rank0) spdlog::warn("WARNING: checkpoint.load: no checkpoint in {}; training from scratch", dir);
    return false;
  }
  // the tensors of a group are disjoint parts of `host`: read on this rank's share of the host's cores
  const int threads = int(std::max(1u, std::min(8u, std::thread::hardware_concurrency() / unsigned(std::max(1, grid_.local_size)))));
  const auto t_read = std::chrono::steady_clock::now();
  {  // the fp16 states' scales the checkpoint has (saved by an fp16-state run): the states encode with them
    std::vector<CkptTensor> present;
    for (const CkptTensor& t : scale_tensors)
      if (reader->tensors().count(t.name)) present.push_back(t);
    reader->read_all(present, 1);
  }
  const int64_t T = int64_t(layout_.params.size());
  auto scales_of = [&](int k) -> const float* {  // state k's scales in `scales` (state by state, fp16 ones only)
    const StateDTypes st = state_dtypes(cfg_.optimizer);
    const DType types[3] = {st.exp_avg, st.exp_avg_sq, st.master};
    int64_t at = 0;
    for (int j = 0; j < k; ++j) at += types[j] == DType::F16 ? T : 0;
    return types[k] == DType::F16 ? scales.data() + at : nullptr;
  };
  for (int g = 0; g < 3; ++g) {
    reader->read_all(groups[g], threads);
    // this rank's part (all of it, or its blocks); the master weights with their compute copy, all-gathered
    if (g == 0) master_from_host(host.data(), scales_of(2));
    else adamw_->from_host(g - 1, host.data(), scales_of(g - 1));
  }
  {  // what the checkpoint has of it: FP8 state saved without delayed scaling starts from scale 1
    std::vector<CkptTensor> present;
    for (const CkptTensor& t : extra)
      if (reader->tensors().count(t.name)) present.push_back(t);
    reader->read_all(present, 1);
    fp8_state_loaded(present.size() < extra.size());
  }
  double read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_read).count();
  iteration_ = reader->iteration();
  {  // the blend continues at iteration_ x G from the checkpoint's counts when the weights match
    const nlohmann::json sampler = reader->meta().value("sampler", nlohmann::json::object());
    std::string note;
    const int64_t position = iteration_ * cfg_.training.global_batch_size;
    const nlohmann::json state = sampler.is_object() ? sampler.value("blend", nlohmann::json()) : nlohmann::json();
    const bool seeded = resume_blend(*data_.train, state, position, note);
    if (rank0 && data_.train->num_components() > 1)
      spdlog::info("data: blend resumes at sample {}{}", position,
                   seeded ? " from the checkpoint's per-component counts" : " (" + note + "; replayed from sample 0)");
  }
  // (copies: a const operator[] on a missing key is undefined behaviour in nlohmann::json)
  const nlohmann::json ls = reader->meta().value("loss_scaler", nlohmann::json());
  if (dtype_ == DType::F16 && ls.is_object()) {
    scaler_.scale = ls.value("scale", scaler_.scale);
    scaler_.growth_tracker = ls.value("growth_tracker", scaler_.growth_tracker);
    scaler_.hysteresis_tracker = ls.value("hysteresis_tracker", scaler_.hysteresis_tracker);
  }
  double io[2] = {double(reader->bytes_read()), double(reader->bytes_verified())};
  grid_.world->all_reduce(io, 2, ReduceOp::Sum);
  grid_.world->all_reduce(&read_s, 1, ReduceOp::Max);  // the slowest rank's reads
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rank0) {
    const nlohmann::json& m = reader->meta();
    const int64_t G = cfg_.training.global_batch_size;
    const int64_t consumed = m.value("consumed_samples", int64_t(-1));
    spdlog::info("loaded checkpoint {} at iteration {} (consumed samples {}; saved on {}): "
                 "{:.1f} MB read ({:.2f} GB/s on {} threads per rank), {:.1f} MB checksummed, in {:.3f} s",
                 reader->path(), iteration_, consumed, describe_saved_grid(m.value("grid", nlohmann::json::object())),
                 megabytes(io[0]), io[0] / 1e9 / std::max(read_s, 1e-9), threads, megabytes(io[1]), s);
    if (consumed != iteration_ * G)
      spdlog::warn("WARNING: checkpoint {}: consumed samples {} != iteration {} x global batch size {}: training "
                   "continues at data position {} (the data position follows the iteration)",
                   reader->path(), consumed, iteration_, G, iteration_ * G);
    if (dtype_ == DType::F16 && !ls.is_object())
      spdlog::info("checkpoint {} has no loss-scaler state (saved without fp16): starting from "
                   "optimizer.initial_loss_scale {}", reader->path(), cfg_.optimizer.initial_loss_scale);
    if (!cfg_.model.init_from.empty())
      spdlog::info("checkpoint.load takes precedence over model.init_from ({} is not used)", cfg_.model.init_from);
  }
  return true;
}

bool Trainer::checkpoint_and_check_exit(int64_t k) {
  const CheckpointConfig& ck = cfg_.checkpoint;
  // the exit signal, exit_duration_mins, and a background save's writers: still writing, failed
  double stop[4] = {g_exit_signal ? 1.0 : 0.0, 0.0, 0.0, 0.0};
  if (ck.exit_duration_mins > 0) {
    const double mins = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count() / 60;
    stop[1] = mins >= ck.exit_duration_mins ? 1.0 : 0.0;
  }
  if (pending_save_) {
    const bool done = pending_save_->done();
    stop[2] = done ? 0.0 : 1.0;
    stop[3] = done && !pending_save_->error().empty() ? 1.0 : 0.0;
  }
  grid_.world->all_reduce(stop, 4, ReduceOp::Max);  // every rank stops (and completes a save) at the same iteration
  const bool exiting = stop[0] > 0 || stop[1] > 0;
  const bool last = exiting || k == cfg_.training.train_iters;
  // every writer done (or one failed: the others are stopped): commit or abandon, collectively
  if (pending_save_ && (stop[2] == 0 || stop[3] > 0)) settle_async_save(stop[3] > 0);
  if (!ck.save.empty() && (k % ck.save_interval == 0 || last)) save_checkpoint();
  if (last) finish_async_save();  // nothing left in the background at exit
  if (exiting && grid_.world_rank == 0) {
    if (stop[0] > 0) spdlog::info("exiting program after receiving {} at iteration {}", ck.exit_signal, k);
    else spdlog::info("exiting program after {} minutes (checkpoint.exit_duration_mins) at iteration {}",
                      ck.exit_duration_mins, k);
    if (ck.save.empty()) spdlog::warn("WARNING: checkpoint.save is not set: nothing was saved");
  }
  return exiting;
}

// ---- the optimizer's state between the device and host buffers (load, save, init_from)

namespace {
// f(range, n) for each owned range with n > 0 elements inside the layout (the padding after the
// last tensor left out: the host buffers hold layout.total)
template <class F>
void for_each_owned(const std::vector<ShardRange>& owned, int64_t total, F&& f) {
  for (const ShardRange& r : owned) {
    const int64_t n = std::max<int64_t>(0, std::min(r.n, total - r.offset));
    if (n > 0) f(r, n);
  }
}
}  // namespace

void Trainer::master_from_host(const float* host, const float* scales) {
  if (master_) adamw_->from_host(2, host, scales);
  if (params_compute_.p != master_.p) {
    std::vector<float> stored;  // fp16 master weights: the copy is of the master as stored
    if (master_.t == DType::F16) {
      stored.assign(size_t(layout_.total), 0.0f);
      adamw_->to_host(2, stored.data());
    }
    const float* from = stored.empty() ? host : stored.data();
    std::vector<uint16_t> bits, low;
    // (not the FP8 parameters, after the copy's end: cast from the master weights before they are read)
    const int64_t copy_end = code_span_.n ? code_span_.offset : layout_.total;
    for_each_owned(grad_sync_->owned(), copy_end, [&](const ShardRange& r, int64_t n) {
      if (dtype_ == DType::F32) return ops_->to_device(params_compute_ + r.offset, from + r.offset, n);
      bits.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) bits[size_t(i)] = master_copy_bits(from[r.offset + i], dtype_);
      ops_->to_device(params_compute_ + r.offset, bits.data(), n);
      if (!remainders_) return;
      low.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) low[size_t(i)] = master_remainder(host[r.offset + i]);
      ops_->to_device(Buf(remainders_ + (master_sharded_ ? r.local : r.offset), DType::BF16), low.data(), n);
    });
  }
  grad_sync_->start_param_gather(params_compute_);  // distributed optimizer: every block to every DP rank
  grad_sync_->wait_params(INT_MAX);
  fp8_params_stale_ = true;
}

void Trainer::master_to_host(float* host) const {
  if (master_) return adamw_->to_host(2, host);
  std::vector<uint16_t> bits, low;
  for_each_owned(grad_sync_->owned(), layout_.total, [&](const ShardRange& r, int64_t n) {
    bits.resize(size_t(n));
    low.resize(size_t(n));
    ops_->to_host(bits.data(), params_compute_ + r.offset, n);
    ops_->to_host(low.data(), CBuf(remainders_ + (master_sharded_ ? r.local : r.offset), DType::BF16), n);
    for (int64_t i = 0; i < n; ++i) host[r.offset + i] = master_from_remainder(bits[size_t(i)], low[size_t(i)]);
  });
}

std::vector<CkptTensor> Trainer::optimizer_scale_tensors(std::vector<float>& values, std::vector<bool>* keep) const {
  const StateDTypes st = state_dtypes(cfg_.optimizer);
  const DType types[3] = {st.exp_avg, st.exp_avg_sq, st.master};
  values.clear();
  for (int k = 0; k < 3; ++k)
    if (types[k] == DType::F16) {
      const std::vector<float> s = keep ? adamw_->scales(k) : std::vector<float>(layout_.params.size(), 0.0f);
      values.insert(values.end(), s.begin(), s.end());
    }
  std::vector<CkptTensor> out;
  size_t at = 0;
  for (int k = 0; k < 3; ++k) {
    if (types[k] != DType::F16) continue;
    for (const ParamInfo& p : layout_.params) {
      CkptTensor t;
      t.name = optimizer_scale_name(k, p.name);
      t.global_shape = t.box_size = t.local_shape = {1};
      t.box_offset = {0};
      t.data = values.data() + at++;
      out.push_back(std::move(t));
      if (keep) keep->push_back(p.group.primary);  // not the last stage's tied copy
    }
  }
  return out;
}

}  // namespace tpt
