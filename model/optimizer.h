// AdamW (torch semantics), the LR schedule and global gradient-norm clipping (docs/ARCHITECTURE.md "Numerics").
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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

// The optimizer states' storage: F32; the precision-aware optimizer's BF16 moments; F16 moments and
// F16 master weights scaled per tensor (core/math.h load_state).
struct StateDTypes {
  DType exp_avg = DType::F32, exp_avg_sq = DType::F32, master = DType::F32;
  bool scaled() const { return exp_avg == DType::F16 || exp_avg_sq == DType::F16 || master == DType::F16; }
};
// The states' storage for a config (optimizer.exp_avg_dtype / exp_avg_sq_dtype / main_params_dtype;
// the plan counts the same).
StateDTypes state_dtypes(const OptimizerConfig& o);
// With scaled fp16 states: each of the two tables (the scales, the amaxes / next scales) holds 3
// floats per tensor of the rank's layout, rounded up to 64 floats (whole allocation granules).
int64_t scale_table_floats(int64_t tensors);

// Scaled fp16 states in checkpoints (which hold every state as fp32): each tensor's scale of state
// k (0 exp_avg, 1 exp_avg_sq, 2 the master weights), "optimizer.fp16_scale.<exp_avg | exp_avg_sq |
// main_params>.<tensor>" [1], with which a resumed run encodes the state exactly as it was stored.
std::string optimizer_scale_name(int k, const std::string& tensor);
// Tensors a checkpoint has only with some settings (FP8's delayed scaling, fp16 optimizer states):
// optional in either direction (LoadRequest::optional).
bool is_optional_state_name(const std::string& tensor);

// The largest of each value over every rank that holds a part of the same tensors (all the stage's
// ranks: TP x DP x CP, whose layouts list the same tensors in the same order), in place.
using ReduceMax = std::function<void(float* values, int64_t n)>;

// AdamW over the parts of the parameter buffer this rank owns (parallel/grad_sync.h: the whole
// buffer, or with the distributed optimizer its block of each DP bucket). The moments exp_avg and
// exp_avg_sq are arrays of owned_size elements (owned range r at [r.local, r.local + r.n)) stored
// as `states` says; the math is fp32 either way.
//
// Scaled fp16 states (Transformer Engine's FusedAdam with fp16 exp_avg / exp_avg_sq / master
// weights, docs/ARCHITECTURE.md "Numerics"): each state of each tensor has one fp32 scale, from the
// absmax of the tensor's new values after each step. The tensor is the whole global tensor: the
// amax is reduced over every rank holding a part of it (reduce_max), so that every layout stores
// the same codes (Transformer Engine scales each rank's shard). A step is two passes (core/ops.h
// adamw_store_scaled) around that reduction. With an fp16 master the compute copy is the stored
// master rounded (Transformer Engine rounds the value before it is stored): a resumed run computes
// with the same weights.
class AdamW {
 public:
  // master: the master weights it updates (fp32, or F16 with states.master): a buffer of the layout
  // (indexed by offset), or with master_sharded an array of owned_size (indexed by local). grads: the
  // gradient buffer (fp32 or bf16). compute: null, or (bf16/fp16 runs) the compute copy of the
  // weights in its dtype, a buffer of the layout whose owned ranges each step refreshes as the
  // updated weights rounded to that dtype. remainders (optimizer.store_param_remainders; compute
  // bf16, master null): the master weights are compute's bits plus these low halves (core/dtype.h),
  // indexed as master would be. reduce_max: needed with scaled states. compute_end: the compute copy
  // covers the elements below it only (FP8 parameters lie above: the trainer casts those, docs/FP8.md
  // "FP8 parameters"; not with scaled states or remainders); -1: all.
  AdamW(const ParamLayout& layout, Ops& ops, const std::vector<ShardRange>& owned, int64_t owned_size, Buf master,
        bool master_sharded, CBuf grads, Buf compute = {}, uint16_t* remainders = nullptr, StateDTypes states = {},
        ReduceMax reduce_max = {}, int64_t compute_end = -1);
  // Over the whole layout (no distributed optimizer): master = params, a buffer of the layout.
  AdamW(const ParamLayout& layout, Ops& ops, float* params, CBuf grads, Buf compute = {})
      : AdamW(layout, ops, {{0, layout.total, 0}}, layout.total, params, false, grads, compute) {}
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;
  // One update with bias correction for `step` (1-based) at learning rate lr, of the gradients
  // multiplied by grad_scale (the clip factor; the gradient buffer itself is left as it is). One
  // Ops::adamw_segments call (a single launch on the GPU); with scaled states a second after the
  // amax reduction (collective over the stage's ranks).
  void step(const OptimizerConfig& o, double lr, int64_t step, float grad_scale = 1.0f);
  Buf exp_avg() const { return buffers_.m; }
  Buf exp_avg_sq() const { return buffers_.v; }

  // Checkpoints hold fp32 states. The state k (0 exp_avg, 1 exp_avg_sq, 2 the master weights; the
  // owned parts, into / from a host buffer of the layout) as fp32 values: F32 and BF16 as stored,
  // F16 decoded with its tensor's scale. from_host encodes (collective with scaled states): F16 with
  // the tensor's scale in `scales` (host, one per layout tensor, e.g. a checkpoint's) where that is
  // > 0, else with absmax / (65504 / 2) over the stage, as a step would.
  void to_host(int k, float* host) const;
  void from_host(int k, const float* host, const float* scales = nullptr);
  // The scales of state k's tensors (host, one per layout tensor; 0 for a tensor that is not F16).
  std::vector<float> scales(int k) const;

 private:
  Buf state(int k) const { return k == 0 ? buffers_.m : k == 1 ? buffers_.v : buffers_.master; }
  Ops& ops_;
  ReduceMax reduce_max_;
  AdamWBuffers buffers_;  // m and v allocated here
  // scaled states: the scale tables (scale_table_floats each), the one the states decode with and
  // the one that takes the amaxes, then the scales after the step; and a host copy of the first
  float* scales_ = nullptr;
  float* next_scales_ = nullptr;
  std::vector<float> host_scales_, host_next_;  // host_next_: a step's amaxes, then its scales (3 per tensor)
  // the owned parts of the layout in runs of consecutive tensors with the same weight-decay choice
  // (flag; the alignment padding between tensors is zero everywhere and stays zero); with scaled
  // states one or more per tensor (TensorSegment::tensor: its index in the layout)
  std::vector<TensorSegment> segments_;
  // with compute_end: segments_ in the part with a compute copy and the one without (whose step writes
  // only the master weights)
  std::vector<TensorSegment> copied_, uncopied_;
  int64_t tensors_ = 0;
};

}  // namespace tpt
