// The trainer's side of FP8's delayed scaling (docs/FP8.md "Delayed scaling"): the step's amaxes of every
// FP8 GEMM input of this rank's chunks, reduced (max) over TP x DP x CP -- the ranks that hold parts of
// a layer's tensors (TP, CP) or quantize other micro-batches of the same step (DP) -- then each chunk's
// Fp8State::update; and the scales and amax histories in checkpoints, saved like the MoE expert biases
// (one copy per stage: TP rank 0, DP x CP rank 0) and optional on load.
#include <spdlog/spdlog.h>

#include "parallel/tensor_parallel.h"
#include "train/trainer.h"

namespace tpt {

void Trainer::fp8_begin_step() {
  for (auto& stage : stages_)
    if (Fp8State* f = stage->fp8_state()) f->begin_step();
}

void Trainer::fp8_update() {
  std::vector<float> amax;  // every chunk's, one reduction per group
  for (auto& stage : stages_)
    if (Fp8State* f = stage->fp8_state()) {
      const size_t at = amax.size();
      amax.resize(at + size_t(Fp8State::kTensors * f->gemms()));
      f->read_amaxes(amax.data() + at);
    }
  Comm* groups[2] = {grid_.tp > 1 ? grid_.tp_group.get() : nullptr, grid_.dp_cp_size() > 1 ? &grid_.dp_cp() : nullptr};
  if (!amax.empty()) fp8_amax_reduce(amax.data(), int(amax.size()), groups, 2);
  size_t at = 0;
  for (auto& stage : stages_)
    if (Fp8State* f = stage->fp8_state()) {
      f->update(amax.data() + at);
      at += size_t(Fp8State::kTensors * f->gemms());
    }
}

namespace {
// for each GEMM of a chunk: its scales and its amax histories
template <class F>
void for_each_fp8_gemm(const std::vector<std::unique_ptr<GPTStage>>& stages, F&& f) {
  for (const auto& stage : stages)
    if (Fp8State* s = stage->fp8_state())
      for (int64_t g = 0; g < s->gemms(); ++g)
        f(*s, g, stage->fp8_first_layer() + g / kFp8GemmsPerLayer, g % kFp8GemmsPerLayer);
}
}  // namespace

std::vector<CkptTensor> Trainer::fp8_state_tensors() {
  std::vector<CkptTensor> out;
  if (!fp8_delayed()) return out;
  const int64_t T = Fp8State::kTensors, len = cfg_.training.fp8_amax_history_len;
  for_each_fp8_gemm(stages_, [&](Fp8State& s, int64_t g, int64_t layer, int64_t gemm) {
    CkptTensor scale;
    scale.name = fp8_state_name(layer, gemm, "scale");
    scale.global_shape = scale.box_size = scale.local_shape = {T};
    scale.box_offset = {0};
    scale.data = s.scales(g);
    CkptTensor history = scale;
    history.name = fp8_state_name(layer, gemm, "amax_history");
    history.global_shape = history.box_size = history.local_shape = {T, len};
    history.box_offset = {0, 0};
    history.data = s.history(g);
    out.push_back(std::move(scale));
    out.push_back(std::move(history));
  });
  return out;
}

void Trainer::fp8_state_loaded(bool missing) {
  if (!fp8_delayed()) return;
  for (auto& stage : stages_)
    if (Fp8State* f = stage->fp8_state()) f->scales_loaded();
  if (missing && grid_.world_rank == 0)
    spdlog::warn("WARNING: checkpoint.load: the checkpoint has no FP8 delayed-scaling state (saved without "
                 "training.fp8_recipe: delayed): the scales start from 1 with empty amax histories");
}

std::vector<CkptTensor> Trainer::extra_state_tensors() {
  std::vector<CkptTensor> out = expert_bias_tensors();
  for (CkptTensor& t : fp8_state_tensors()) out.push_back(std::move(t));
  return out;
}

std::vector<GlobalTensor> Trainer::fp8_state_model() const {
  std::vector<GlobalTensor> out;
  if (!fp8_delayed()) return out;
  const TrainingConfig& t = cfg_.training;
  const auto [begin, end] = t.fp8_layer_range(cfg_.model.num_layers);
  for (int64_t l = begin; l < end; ++l)
    for (int64_t g = 0; g < kFp8GemmsPerLayer; ++g) {
      out.push_back({fp8_state_name(l, g, "scale"), {Fp8State::kTensors}});
      out.push_back({fp8_state_name(l, g, "amax_history"), {Fp8State::kTensors, t.fp8_amax_history_len}});
    }
  return out;
}

}  // namespace tpt
