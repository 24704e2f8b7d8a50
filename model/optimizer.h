// AdamW (torch semantics), the LR schedule and global gradient-norm clipping (DESIGN "Numerics").
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

class AdamW {
 public:
  AdamW(const ParamLayout& layout, Ops& ops, float* params, const float* grads);
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
  float *m_ = nullptr, *v_ = nullptr;
};

}  // namespace tpt
