// The trainer's side of FP8's delayed scaling (docs/FP8.md "Delayed scaling"): the step's amaxes of every
// FP8 GEMM input of this rank's chunks, reduced (max) over TP x DP x CP -- the ranks that hold parts of
// a layer's tensors (TP, CP) or quantize other micro-batches of the same step (DP) -- then each chunk's
// Fp8State::update; and the scales and amax histories in checkpoints, saved like the MoE expert biases
// (one copy per stage: TP rank 0, DP x CP rank 0) and optional on load. A MoE layer's experts: every rank
// holds every expert's state (the ranks without an expert record amax 0, so the reduction gives each its
// owners' amax), saved as one [E, ...] tensor per fc.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>

#include "parallel/tensor_parallel.h"
#include "train/trainer.h"

namespace tpt {

void Trainer::fp8_weights_changed() {
  for (auto& stage : stages_)
    if (Fp8State* f = stage->fp8_state()) f->weights_changed();
}

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

void Trainer::fp8_cast_params() {
  if (!fp8_param_codes_) return;
  // each part of an FP8 parameter this rank owns (its master weights), in the compute dtype through the
  // shared scratch (free between passes), in pieces of at most what it holds
  const int64_t piece = std::max<int64_t>(1, shared_scratch_bytes_ / dtype_bytes(dtype_));
  const Buf tmp(shared_scratch_, dtype_);
  auto parts = [&](const std::function<void(Fp8State&, const GPTStage::Fp8Param&, CBuf, int64_t, int64_t)>& f) {
    for (auto& stage : stages_)
      for (const GPTStage::Fp8Param& p : stage->fp8_params())
        for (const ShardRange& r : grad_sync_->owned()) {
          const int64_t begin = p.info->offset + p.at;
          const int64_t lo = std::max(r.offset, begin), hi = std::min(r.offset + r.n, begin + p.n);
          for (int64_t at = lo; at < hi; at += piece) {
            const int64_t n = std::min(piece, hi - at);
            const int64_t m = master_sharded_ ? r.local + (at - r.offset) : at;
            ops_->master_copy(tmp, master_.f32() + m, n);  // as the 16-bit weight holds it
            f(*stage->fp8_state(), p, tmp, at - begin, n);
          }
        }
  };
  {  // the amaxes of each whole weight first (delayed scaling: the ones the step records)
    for (auto& stage : stages_)
      if (!stage->fp8_params().empty()) stage->fp8_state()->begin_param_amaxes();
    parts([](Fp8State& f, const GPTStage::Fp8Param& p, CBuf x, int64_t at, int64_t n) { f.param_amax(p.gemm, x, at, n); });
    // the GEMMs whose amaxes are reduced together, and over which groups (Fp8State::param_amaxes): current
    // and delayed scaling every GEMM of the rank's chunks over the stage's ranks; blockwise the dense weights'
    // blocks over DP x CP, the experts' over EDP
    const bool blockwise = cfg_.training.fp8_recipe == Fp8Recipe::Blockwise;
    Comm* tp = grid_.tp > 1 ? grid_.tp_group.get() : nullptr;
    Comm* dp_cp = grid_.dp_cp_size() > 1 ? &grid_.dp_cp() : nullptr;
    Comm& edp = grid_.edp_group ? *grid_.edp_group : grid_.dp_cp();
    for (const bool experts : {false, true}) {
      if (!blockwise && experts) break;
      std::vector<std::vector<int64_t>> gemms;  // per chunk, and where its amaxes begin
      std::vector<size_t> begin;
      std::vector<float> amax;
      for (auto& stage : stages_) {
        Fp8State* f = stage->fp8_state();
        gemms.emplace_back();
        begin.push_back(amax.size());
        if (!f || stage->fp8_params().empty()) continue;
        if (!blockwise)
          for (int64_t g = 0; g < f->gemms(); ++g) gemms.back().push_back(g);
        else
          for (const GPTStage::Fp8Param& p : stage->fp8_params())
            if ((p.info->group.replicas == ReplicaGroup::ExpertData) == experts) gemms.back().push_back(p.gemm);
        for (float a : f->param_amaxes(gemms.back())) amax.push_back(a);
      }
      begin.push_back(amax.size());
      Comm* owners = blockwise && experts ? &edp : dp_cp;  // (current and delayed: with the TP shards)
      Comm* groups[2] = {blockwise ? nullptr : tp, owners};
      if (!amax.empty()) fp8_amax_reduce(amax.data(), int(amax.size()), groups, 2);
      for (size_t c = 0; c < stages_.size(); ++c)
        if (!gemms[c].empty())
          stages_[c]->fp8_state()->set_param_amaxes(
              gemms[c], std::vector<float>(amax.begin() + long(begin[c]), amax.begin() + long(begin[c + 1])));
    }
  }
  parts([](Fp8State& f, const GPTStage::Fp8Param& p, CBuf x, int64_t at, int64_t n) { f.cast_param(p.gemm, x, at, n); });
  grad_sync_->start_code_gather(fp8_param_codes_);  // the owned blocks' codes to every replica
  fp8_params_stale_ = false;
}

namespace {
// The checkpoint's delayed-scaling entries of layer l (model/gpt.h fp8_state_entries).
std::vector<Fp8StateEntry> entries(const ModelConfig& m, int64_t l) {
  return fp8_state_entries(m.is_moe_layer(l), m.num_moe_experts, m.moe_shared_expert_intermediate_size > 0);
}
}  // namespace

std::vector<CkptTensor> Trainer::fp8_state_tensors() {
  std::vector<CkptTensor> out;
  if (!fp8_delayed()) return out;
  const int64_t T = Fp8State::kTensors, len = cfg_.training.fp8_amax_history_len;
  const int64_t G = kFp8GemmsPerLayer + (cfg_.model.is_moe() ? 2 * int64_t(cfg_.model.num_moe_experts) : 0);
  for (const auto& stage : stages_) {
    Fp8State* s = stage->fp8_state();
    if (!s) continue;
    for (int64_t i = 0; i < s->gemms() / G; ++i) {
      const int64_t layer = stage->fp8_first_layer() + i;
      for (const Fp8StateEntry& e : entries(cfg_.model, layer)) {  // [3] one GEMM's, [E, 3] the experts'
        const std::vector<int64_t> lead = e.count > 1 ? std::vector<int64_t>{e.count} : std::vector<int64_t>{};
        CkptTensor scale;
        scale.name = fp8_state_name(layer, e.gemm, "scale");
        scale.global_shape = lead;
        scale.global_shape.push_back(T);
        scale.box_size = scale.local_shape = scale.global_shape;
        scale.box_offset.assign(scale.global_shape.size(), 0);
        scale.data = s->scales(i * G + e.slot);
        CkptTensor history = scale;
        history.name = fp8_state_name(layer, e.gemm, "amax_history");
        history.global_shape.push_back(len);
        history.box_size = history.local_shape = history.global_shape;
        history.box_offset.assign(history.global_shape.size(), 0);
        history.data = s->history(i * G + e.slot);
        out.push_back(std::move(scale));
        out.push_back(std::move(history));
      }
    }
  }
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
    for (const Fp8StateEntry& e : entries(cfg_.model, l)) {
      std::vector<int64_t> shape = e.count > 1 ? std::vector<int64_t>{e.count} : std::vector<int64_t>{};
      shape.push_back(Fp8State::kTensors);
      out.push_back({fp8_state_name(l, e.gemm, "scale"), shape});
      shape.push_back(t.fp8_amax_history_len);
      out.push_back({fp8_state_name(l, e.gemm, "amax_history"), shape});
    }
  return out;
}

}  // namespace tpt
