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

// The gradient norm's table for Ops::grad_stats: the owned part (parallel/grad_sync.h) of every
// tensor, tensor by tensor in layout order and within a tensor range by range; flag = counted in the
// norm, which counts each global element once across the model: only in the primary copy of a
// tensor (ParamGroup::primary: TP-replicated tensors on tp_rank 0, the first stage's word
// embedding, not the last stage's tied copy) and there only in `unique` (GradSync::unique_ranges:
// the one replica of its group that answers for it). The nan/inf check sees all owned parts.
std::vector<TensorSegment> grad_norm_segments(const ParamLayout& layout, const std::vector<ShardRange>& owned,
                                              const std::vector<GradRange>& unique);
// Sum of squares of this rank's gradients over grad_norm_segments (default: all owned, all unique).
double local_grad_sum_squares(const ParamLayout& layout, Ops& ops, CBuf grads,
                              const std::vector<ShardRange>& owned = {{0, INT64_MAX / 2, 0}},
                              const std::vector<GradRange>& unique = {{0, INT64_MAX / 2}});

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

// The Adam moments' storage: F32, or BF16 with the precision-aware optimizer.
struct MomentDTypes {
  DType exp_avg = DType::F32, exp_avg_sq = DType::F32;
};

// AdamW over the parts of the parameter buffer this rank owns (parallel/grad_sync.h: the whole
// buffer, or with the distributed optimizer its block of each DP bucket). The moments exp_avg and
// exp_avg_sq are arrays of owned_size elements (owned range r at [r.local, r.local + r.n)) in fp32
// or, with the precision-aware optimizer, bf16 (moments: their dtypes); the math is fp32 either way.
class AdamW {
 public:
  // master: the fp32 weights it updates: a buffer of the layout (indexed by offset), or with
  // master_sharded an array of owned_size (indexed by local). grads: the gradient buffer (fp32 or bf16).
  // compute: null, or (bf16/fp16 runs) the compute copy of the weights in its dtype, a buffer of
  // the layout whose owned ranges each step refreshes as the updated weights rounded to that dtype.
  // remainders (optimizer.store_param_remainders; compute bf16, master null): the master weights are
  // compute's bits plus these low halves (core/dtype.h), indexed as master would be.
  AdamW(const ParamLayout& layout, Ops& ops, const std::vector<ShardRange>& owned, int64_t owned_size, float* master,
        bool master_sharded, CBuf grads, Buf compute = {}, uint16_t* remainders = nullptr,
        MomentDTypes moments = {});
  // Over the whole layout (no distributed optimizer): master = params, a buffer of the layout.
  AdamW(const ParamLayout& layout, Ops& ops, float* params, CBuf grads, Buf compute = {})
      : AdamW(layout, ops, {{0, layout.total, 0}}, layout.total, params, false, grads, compute) {}
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;
  // One update with bias correction for `step` (1-based) at learning rate lr, of the gradients
  // multiplied by grad_scale (the clip factor; the gradient buffer itself is left as it is). One
  // Ops::adamw_segments call: a single launch on the GPU.
  void step(const OptimizerConfig& o, double lr, int64_t step, float grad_scale = 1.0f);
  Buf exp_avg() const { return buffers_.m; }
  Buf exp_avg_sq() const { return buffers_.v; }

 private:
  Ops& ops_;
  AdamWBuffers buffers_;  // m and v allocated here
  // the owned parts of the layout in runs of consecutive tensors with the same weight-decay choice
  // (flag; the alignment padding between tensors is zero everywhere and stays zero)
  std::vector<TensorSegment> segments_;
};

// The moments' storage for a config (optimizer.exp_avg_dtype / exp_avg_sq_dtype; the plan counts the same).
MomentDTypes moment_dtypes(const OptimizerConfig& o);

}  // namespace tpt
