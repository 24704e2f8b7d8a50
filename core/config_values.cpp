// The config's value tables and rules shared beyond the loader (core/config.h): the names of the
// enum choices, in value order, and data.split's one rule.
#include <cmath>
#include <sstream>

#include "core/config.h"

namespace tpt {

std::span<const std::string_view> enum_names(PipelineSchedule) {
  static constexpr std::string_view n[] = {"1f1b", "gpipe", "zb-h1"};
  return n;
}
std::span<const std::string_view> enum_names(Precision) {
  static constexpr std::string_view n[] = {"fp32", "bf16", "fp16"};
  return n;
}
std::span<const std::string_view> enum_names(Recompute) {
  static constexpr std::string_view n[] = {"none", "selective", "full"};
  return n;
}
std::span<const std::string_view> enum_names(Device) {
  static constexpr std::string_view n[] = {"auto", "cpu", "cuda"};
  return n;
}
std::span<const std::string_view> enum_names(LrDecayStyle) {
  static constexpr std::string_view n[] = {"cosine", "linear", "constant"};
  return n;
}

std::span<const std::string_view> enum_names(Normalization) {
  static constexpr std::string_view n[] = {"LayerNorm", "RMSNorm"};
  return n;
}
std::span<const std::string_view> enum_names(PositionEmbedding) {
  static constexpr std::string_view n[] = {"learned_absolute", "rope"};
  return n;
}

std::string split_weights_error(const std::vector<double>& w) {
  if (w.size() != 3) return "expected 3 weights (train, valid, test), got " + std::to_string(w.size());
  double sum = 0;
  for (double x : w) {
    if (!(x >= 0) || !std::isfinite(x)) {
      std::ostringstream os;
      os << x;
      return "weights must be finite and non-negative, got " + os.str();
    }
    sum += x;
  }
  if (!(sum > 0)) return "expected 3 non-negative weights (train, valid, test) with a positive sum";
  return "";
}

}  // namespace tpt
