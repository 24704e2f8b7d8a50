#include "model/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/config.h"
#include "core/error.h"
#include "core/math.h"

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

namespace {
constexpr const char* kScalePrefix = "optimizer.fp16_scale.";
}  // namespace

std::string optimizer_scale_name(int k, const std::string& tensor) {
  static const char* const states[3] = {"exp_avg.", "exp_avg_sq.", "main_params."};
  return kScalePrefix + std::string(states[k]) + tensor;
}

bool is_optional_state_name(const std::string& tensor) {
  return is_fp8_state_name(tensor) || tensor.starts_with(kScalePrefix);
}

int64_t scale_table_floats(int64_t tensors) { return (3 * tensors + 63) / 64 * 64; }

AdamW::AdamW(const ParamLayout& layout, Ops& ops, const std::vector<ShardRange>& owned, int64_t owned_size,
             Buf master, bool master_sharded, CBuf grads, Buf compute, uint16_t* remainders, StateDTypes states,
             ReduceMax reduce_max, int64_t compute_end)
    : ops_(ops), reduce_max_(std::move(reduce_max)), tensors_(int64_t(layout.params.size())) {
  TPT_CHECK(!remainders || (compute.t == DType::BF16 && !master));
  for (DType t : {states.exp_avg, states.exp_avg_sq}) TPT_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16);
  TPT_CHECK(states.master == DType::F32 || (states.master == DType::F16 && master.t == DType::F16 && compute));
  TPT_CHECK(!states.scaled() || reduce_max_);
  const bool scaled = states.scaled();
  struct Span {
    int64_t offset, n;
    bool decay;
    int tensor;
  };
  std::vector<Span> spans;  // the layout in runs of the same weight-decay choice (scaled: tensor by tensor)
  for (size_t j = 0; j < layout.params.size(); ++j) {
    const ParamInfo& p = layout.params[j];
    if (!scaled && !spans.empty() && spans.back().decay == p.weight_decay &&
        spans.back().offset + spans.back().n <= p.offset)
      spans.back().n = p.offset + p.numel - spans.back().offset;
    else
      spans.push_back({p.offset, p.numel, p.weight_decay, int(j)});
  }
  for (const ShardRange& r : owned)
    for (const Span& s : spans) {
      const int64_t lo = std::max(s.offset, r.offset), hi = std::min(s.offset + s.n, r.offset + r.n);
      if (lo < hi) segments_.push_back({lo, r.local + (lo - r.offset), hi - lo, s.decay, s.tensor});
    }
  if (compute_end >= 0) {
    TPT_CHECK(compute && !remainders && !scaled && master);
    for (const TensorSegment& t : segments_) {
      TPT_CHECK(t.offset >= compute_end || t.offset + t.n <= compute_end);
      (t.offset < compute_end ? copied_ : uncopied_).push_back(t);
    }
  }
  buffers_.master = master;
  buffers_.master_sharded = master_sharded;
  buffers_.grads = grads;
  buffers_.m = ops_.alloc(owned_size, states.exp_avg);
  buffers_.v = ops_.alloc(owned_size, states.exp_avg_sq);
  buffers_.compute = compute;
  buffers_.remainders = remainders;
  if (!scaled) return;
  // the scales start at 1 (Transformer Engine's; zero moments decode as zeros whatever the scale)
  const int64_t n = scale_table_floats(tensors_);
  host_scales_.assign(size_t(n), 1.0f);
  host_next_.assign(size_t(3 * tensors_), 0.0f);
  scales_ = ops_.alloc(size_t(n));
  ops_.to_device(scales_, host_scales_.data(), n);
  next_scales_ = ops_.alloc(size_t(n));
  buffers_.scales = scales_;
  buffers_.amax = next_scales_;
  buffers_.tensors = int(tensors_);
}

AdamW::~AdamW() {
  ops_.free(buffers_.m.p);
  ops_.free(buffers_.v.p);
  if (scales_) ops_.free(scales_);
  if (next_scales_) ops_.free(next_scales_);
}

StateDTypes state_dtypes(const OptimizerConfig& o) {
  auto dtype = [](StateDType t) -> DType {
    switch (t) {
      case StateDType::FP32: return DType::F32;
      case StateDType::BF16: return DType::BF16;
      case StateDType::FP16: return DType::F16;
    }
    internal_error("optimizer: unknown state dtype");
  };
  return {dtype(o.exp_avg_dtype), dtype(o.exp_avg_sq_dtype), dtype(o.main_params_dtype)};
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
  if (!uncopied_.empty()) {  // the master weights with a compute copy, then those without
    if (!copied_.empty()) ops_.adamw_segments(buffers_, copied_, a, grad_scale);
    AdamWBuffers master_only = buffers_;
    master_only.compute = {};
    ops_.adamw_segments(master_only, uncopied_, a, grad_scale);
    return;
  }
  ops_.adamw_segments(buffers_, segments_, a, grad_scale);
  if (!buffers_.scaled()) return;
  // the tensors' amaxes over the stage, their new scales, the fp16 states written with them
  const int64_t n = 3 * tensors_;
  std::vector<float>& next = host_next_;
  ops_.to_host(next.data(), CBuf(next_scales_), n);
  reduce_max_(next.data(), n);
  for (float& x : next) x = fp16_state_scale(x);
  ops_.to_device(next_scales_, next.data(), n);
  ops_.adamw_store_scaled(buffers_, segments_, a, grad_scale, next_scales_);
  std::swap(scales_, next_scales_);  // the new scales decode from now on; the old table takes the next amaxes
  buffers_.scales = scales_;
  buffers_.amax = next_scales_;
  std::copy(next.begin(), next.end(), host_scales_.begin());
}

std::vector<float> AdamW::scales(int k) const {
  std::vector<float> out(size_t(tensors_), 0.0f);
  if (state(k).t == DType::F16)
    for (int64_t j = 0; j < tensors_; ++j) out[size_t(j)] = host_scales_[size_t(3 * j + k)];
  return out;
}

namespace {
// the owned elements of segments with state k's index (master: by offset unless sharded)
int64_t state_index(const TensorSegment& t, int k, bool master_sharded) {
  return k < 2 || master_sharded ? t.local : t.offset;
}
}  // namespace

void AdamW::to_host(int k, float* host) const {
  const Buf s = state(k);
  for (const TensorSegment& t : segments_) {
    const int64_t at = state_index(t, k, buffers_.master_sharded);
    ops_.to_host(host + t.offset, CBuf(s + at), t.n);
    if (s.t == DType::F32) continue;
    // 16-bit: copied into the first half of the range, widened in place from the end (element i's 4
    // bytes never cover an unread 2-byte element j < i): no host allocation per save
    const auto* raw = reinterpret_cast<const unsigned char*>(host + t.offset);
    const float scale = s.t == DType::F16 ? host_scales_[size_t(3 * t.tensor + k)] : 1.0f;
    for (int64_t i = t.n - 1; i >= 0; --i) {
      uint16_t bits;
      std::memcpy(&bits, raw + 2 * i, sizeof bits);
      host[t.offset + i] = load_state(&bits, s.t, 0, scale);
    }
  }
}

void AdamW::from_host(int k, const float* host, const float* scales) {
  const Buf s = state(k);
  if (s.t == DType::F16) {  // each tensor's scale: given, or its absmax over the stage
    std::vector<float> amax(size_t(3 * tensors_), 0.0f);
    for (const TensorSegment& t : segments_)
      for (int64_t i = 0; i < t.n; ++i)
        amax[size_t(3 * t.tensor + k)] = std::max(amax[size_t(3 * t.tensor + k)], std::fabs(host[t.offset + i]));
    reduce_max_(amax.data(), int64_t(amax.size()));
    for (int64_t j = 0; j < tensors_; ++j)
      host_scales_[size_t(3 * j + k)] =
          scales && scales[j] > 0.0f ? scales[j] : fp16_state_scale(amax[size_t(3 * j + k)]);
    ops_.to_device(scales_, host_scales_.data(), int64_t(host_scales_.size()));
  }
  std::vector<uint16_t> bits;
  for (const TensorSegment& t : segments_) {
    const int64_t at = state_index(t, k, buffers_.master_sharded);
    if (s.t == DType::F32) {
      ops_.to_device(s + at, host + t.offset, t.n);
      continue;
    }
    const float rscale = s.t == DType::F16 ? fp16_state_rscale(host_scales_[size_t(3 * t.tensor + k)]) : 1.0f;
    bits.resize(size_t(t.n));
    for (int64_t i = 0; i < t.n; ++i) store_state(bits.data(), s.t, i, host[t.offset + i], rscale);
    ops_.to_device(s + at, bits.data(), t.n);
  }
}


}  // namespace tpt
