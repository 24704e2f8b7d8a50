// AdamW (torch semantics), the LR schedule and global gradient-norm clipping (docs/ARCHITECTURE.md "Numerics").
#pragma once
#include <cstdint>

#include "core/ops.h"
#include "model/gpt.h"

namespace tpt {

struct OptimizerConfig;
class Comm;

// Megatron's schedule: linear warmup lr*k/W for k <= W; then cosine | linear | constant decay from
// lr to min_lr over iterations (W, lr_decay_iters]; min_lr after.
double learning_rate(const OptimizerConfig& o, int64_t iteration);

// Sum of squares of this rank's gradients, counting each global element once across the model:
// TP-replicated tensors only on tp_rank 0, the last stage's tied copy of the word embedding never.
double local_grad_sum_squares(const ParamLayout& layout, Ops& ops, const float* grads, int tp_rank);

// Megatron's DynamicGradScaler (fp16): the loss is multiplied by `scale` before backward. An
// overflowing step (inf/nan in any gradient) is skipped and counts down the hysteresis; when it
// reaches 0 the scale halves (not below min_scale). growth_interval clean steps in a row double the
// scale and re-arm the hysteresis.
struct LossScaler {
  double scale = 1.0;
  double min_scale = 1.0;
  int growth_interval = 1000;
  int hysteresis = 2;
  int growth_tracker = 0;
  int hysteresis_tracker = 2;
  void update(bool found_inf);
};

class AdamW {
 public:
  // compute: null, or (bf16/fp16 runs) the compute copy of params in its dtype, refreshed by each
  // step as the updated params rounded to that dtype.
  AdamW(const ParamLayout& layout, Ops& ops, float* params, const float* grads, Buf compute = {});
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;
  // One update with bias correction for `step` (1-based) at learning rate lr.
  void step(const OptimizerConfig& o, double lr, int64_t step);
  float* exp_avg() { return m_; }
  float* exp_avg_sq() { return v_; }

 private:
  const ParamLayout& layout_;
  Ops& ops_;
  float* params_;
  const float* grads_;
  Buf compute_;
  float *m_ = nullptr, *v_ = nullptr;
  // the layout in runs of consecutive tensors with the same weight-decay choice (one kernel each;
  // the alignment padding between tensors is zero everywhere and stays zero)
  struct Run {
    int64_t offset, n;
    bool decay;
  };
  std::vector<Run> runs_;
};

}  // namespace tpt
