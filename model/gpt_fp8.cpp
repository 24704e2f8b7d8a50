// GPTStage's FP8 parameters (training.fp8_param_gather, docs/FP8.md "FP8 parameters"): the FP8 layers'
// GEMM weights read as the trainer's codes (StageOptions::fp8_param_codes), not from params_.
#include <string>

#include "core/error.h"
#include "model/block.h"
#include "model/gpt.h"

namespace tpt {

CBuf GPTStage::fp8_param(const ParamInfo& info) const {
  TPT_CHECK(info.group.fp8 && opt_.fp8_param_codes && info.offset >= opt_.fp8_param_base);
  return CBuf(opt_.fp8_param_codes + (info.offset - opt_.fp8_param_base), DType::U8);
}

BlockParams<CBuf> GPTStage::weights(int64_t layer) const {
  const LayerSpec& spec = d_.spec(layer);
  BlockParams<CBuf> w = block_params(layout_, spec, params_, layer);
  if (!d_.fp8_params) return w;
  const std::string pre = "h." + std::to_string(layer) + ".";
  for (size_t i = 0; i < spec.parts.size(); ++i)
    if (const ParamInfo* info = layout_.find(pre + spec.parts[i].name() + ".weight"); info && info->group.fp8)
      w.weight[i] = fp8_param(*info);
  return w;
}

void GPTStage::init_fp8_params() {
  if (!d_.fp8_params || !fp8_) return;
  const int64_t G = fp8_gemms_per_layer(d_);
  const MoEDims& m = d_.moe;
  for (int64_t l = fp8_begin_; l < fp8_end_; ++l)
    for (const Fp8StateEntry& e : fp8_state_entries(m.is_moe(l), m.E, m.Fs > 0)) {
      const ParamInfo* info = layout_.find("h." + std::to_string(l) + "." + e.gemm + ".weight");
      TPT_CHECK(info != nullptr);
      // a dense GEMM's weight, or each of the rank's experts' (El of the tensor's E: their slots)
      const int64_t first = e.count == 1 ? 0 : m.expert_begin, count = e.count == 1 ? 1 : m.El;
      const int64_t n = info->numel / count;
      for (int64_t x = 0; x < count; ++x) {
        fp8_params_.push_back({info, (l - fp8_begin_) * G + e.slot + first + x, x * n, n});
        const Fp8Param& p = fp8_params_.back();
        fp8_->set_param_codes(p.gemm, static_cast<uint8_t*>(const_cast<void*>(fp8_param(*info).p)) + p.at);
      }
    }
}

}  // namespace tpt
