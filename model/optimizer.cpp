#include "model/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/config.h"
#include "core/error.h"

namespace tpt {

double learning_rate(const OptimizerConfig& o, int64_t k) {
  const int64_t W = o.lr_warmup_iters;
  if (W > 0 && k <= W) return o.lr * double(k) / double(W);
  if (o.lr_decay_style == LrDecayStyle::Constant) return o.lr;
  const int64_t decay = o.lr_decay_iters;
  if (k > decay) return o.min_lr;
  double ratio = decay > W ? double(k - W) / double(decay - W) : 1.0;
  double coeff = o.lr_decay_style == LrDecayStyle::Linear ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return o.min_lr + coeff * (o.lr - o.min_lr);
}

std::vector<TensorSegment> grad_norm_segments(const ParamLayout& layout, const std::vector<ShardRange>& owned,
                                              const std::vector<GradRange>& unique) {
  std::vector<TensorSegment> segments;
  for (const ParamInfo& p : layout.params)
    for (const ShardRange& r : owned) {
      const int64_t lo = std::max(p.offset, r.offset), hi = std::min(p.offset + p.numel, r.offset + r.n);
      // [lo, hi) cut where it enters or leaves a unique range (ascending, disjoint)
      for (int64_t a = lo; a < hi;) {
        bool in = false;
        int64_t b = hi;
        for (const GradRange& u : unique) {
          if (a >= u.offset && a < u.offset + u.n) {
            in = true;
            b = std::min(hi, u.offset + u.n);
            break;
          }
          if (u.offset > a) {
            b = std::min(hi, u.offset);
            break;
          }
        }
        segments.push_back({a, r.local + (a - r.offset), b - a, p.group.primary && in});
        a = b;
      }
    }
  return segments;
}

double local_grad_sum_squares(const ParamLayout& layout, Ops& ops, CBuf grads,
                              const std::vector<ShardRange>& owned, const std::vector<GradRange>& unique) {
  return ops.grad_stats(grads, grad_norm_segments(layout, owned, unique)).sum_squares;
}

void LossScaler::update(bool found_inf) {
  if (found_inf) {
    growth_tracker = 0;
    if (--hysteresis_tracker <= 0) scale = std::max(scale * 0.5, min_scale);
  } else if (++growth_tracker == growth_interval) {
    growth_tracker = 0;
    hysteresis_tracker = hysteresis;
    scale *= 2.0;
  }
}

AdamW::AdamW(const ParamLayout& layout, Ops& ops, const std::vector<ShardRange>& owned, int64_t owned_size,
             float* master, bool master_sharded, CBuf grads, Buf compute, uint16_t* remainders,
             MomentDTypes moments)
    : ops_(ops) {
  TPT_CHECK(!remainders || (compute.t == DType::BF16 && !master));
  for (DType t : {moments.exp_avg, moments.exp_avg_sq}) TPT_CHECK(t == DType::F32 || t == DType::BF16);
  struct Span {
    int64_t offset, n;
    bool decay;
  };
  std::vector<Span> spans;  // the layout in runs of the same weight-decay choice
  for (const ParamInfo& p : layout.params) {
    if (!spans.empty() && spans.back().decay == p.weight_decay && spans.back().offset + spans.back().n <= p.offset)
      spans.back().n = p.offset + p.numel - spans.back().offset;
    else
      spans.push_back({p.offset, p.numel, p.weight_decay});
  }
  for (const ShardRange& r : owned)
    for (const Span& s : spans) {
      const int64_t lo = std::max(s.offset, r.offset), hi = std::min(s.offset + s.n, r.offset + r.n);
      if (lo < hi) segments_.push_back({lo, r.local + (lo - r.offset), hi - lo, s.decay});
    }
  buffers_ = {master,
              master_sharded,
              grads,
              ops_.alloc(owned_size, moments.exp_avg),
              ops_.alloc(owned_size, moments.exp_avg_sq),
              compute,
              remainders};
}

AdamW::~AdamW() {
  ops_.free(buffers_.m.p);
  ops_.free(buffers_.v.p);
}

MomentDTypes moment_dtypes(const OptimizerConfig& o) {
  auto dtype = [](StateDType t) -> DType {
    if (t == StateDType::FP32) return DType::F32;
    if (t == StateDType::BF16) return DType::BF16;
    internal_error("optimizer: moments stored as " + name_of(t) + " are not built (the config refuses them)");
  };
  return {dtype(o.exp_avg_dtype), dtype(o.exp_avg_sq_dtype)};
}

void AdamW::step(const OptimizerConfig& o, double lr, int64_t step, float grad_scale) {
  AdamWParams a;
  a.lr = float(lr);
  a.beta1 = float(o.adam_beta1);
  a.beta2 = float(o.adam_beta2);
  a.one_minus_beta1 = float(1.0 - o.adam_beta1);
  a.one_minus_beta2 = float(1.0 - o.adam_beta2);
  a.eps = float(o.adam_eps);
  a.weight_decay = float(o.weight_decay);
  a.bias_correction1 = float(1.0 - std::pow(o.adam_beta1, double(step)));
  a.bias_correction2 = float(1.0 - std::pow(o.adam_beta2, double(step)));
  ops_.adamw_segments(buffers_, segments_, a, grad_scale);
}

}  // namespace tpt
