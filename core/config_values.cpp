// The config's value tables and rules shared beyond the loader (core/config.h): the names of the
// enum choices, in value order, and data.split's one rule; the loader's scalar readers and writers
// (core/config_detail.h).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "core/config.h"
#include "core/config_detail.h"
#include "core/error.h"

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
std::span<const std::string_view> enum_names(MoEScore) {
  static constexpr std::string_view n[] = {"softmax", "sigmoid"};
  return n;
}
std::span<const std::string_view> enum_names(MoEBalancing) {
  static constexpr std::string_view n[] = {"aux_loss", "seq_aux_loss", "global_aux_loss", "none"};
  return n;
}
std::span<const std::string_view> enum_names(MoEDropPolicy) {
  static constexpr std::string_view n[] = {"probs", "position"};
  return n;
}
std::span<const std::string_view> enum_names(MoEDispatcher) {
  static constexpr std::string_view n[] = {"alltoall", "allgather"};
  return n;
}
std::span<const std::string_view> enum_names(Fp8Format) {
  static constexpr std::string_view n[] = {"null", "e4m3", "hybrid"};
  return n;
}
std::span<const std::string_view> enum_names(Fp8Recipe) {
  static constexpr std::string_view n[] = {"delayed", "tensorwise", "blockwise"};
  return n;
}
std::span<const std::string_view> enum_names(StateDType) {
  static constexpr std::string_view n[] = {"fp32", "bf16", "fp16"};
  return n;
}

std::string split_weights_error(const std::vector<double>& w) {
  if (w.size() != 3) return "expected 3 weights (train, valid, test), got " + std::to_string(w.size());
  static const char* kName[] = {"train", "valid", "test"};
  double sum = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double x = w[i];
    if (!(x >= 0) || !std::isfinite(x)) {
      std::ostringstream os;
      os << x;
      return "weights must be finite and non-negative, got " + os.str() + " at entry " + std::to_string(i + 1) + " (" +
             kName[i] + ")";
    }
    sum += x;
    if (!std::isfinite(sum)) {  // two weights of 1e308: every ratio w / sum would be 0
      return "the weights' sum overflows a double at entry " + std::to_string(i + 1) + " (" + kName[i] +
             "): scale them down";
    }
  }
  if (!(sum > 0)) return "expected 3 non-negative weights (train, valid, test) with a positive sum";
  return "";
}

std::string run_length_error(const Config& c, int64_t global_batch, std::string& key) {
  constexpr int64_t kMaxTokens = int64_t(1) << 62;
  const int64_t per_iteration = std::max<int64_t>(1, global_batch) * std::max(1, c.model.seq_length);  // < 2^54
  const int64_t max_iters = kMaxTokens / per_iteration;
  auto error = [&](const char* name, int64_t x) {
    key = name;
    return "must be <= " + std::to_string(max_iters) + " (2^62 tokens / (global batch " + std::to_string(global_batch) +
           " x model.seq_length " + std::to_string(c.model.seq_length) + ")), got " + std::to_string(x);
  };
  if (c.training.train_iters > max_iters) return error("training.train_iters", c.training.train_iters);
  if (c.data.eval_iters > max_iters) return error("data.eval_iters", c.data.eval_iters);
  return "";
}

namespace config_detail {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string describe(const YAML::Node& v) {
  if (v.IsNull()) return "null";
  if (v.IsMap()) return "a map";
  if (v.IsSequence()) return "a list of " + std::to_string(v.size());
  return "'" + v.Scalar() + "'";
}

bool is_plain(const YAML::Node& v) {
  return v.IsScalar() && v.Tag() != "!" && v.Tag() != "tag:yaml.org,2002:str";
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

// [-+]?[0-9]+
bool is_int_text(std::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return !s.empty() && std::all_of(s.begin(), s.end(), is_digit);
}

// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
bool is_float_text(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  auto digits = [&] {
    const size_t b = i;
    while (i < n && is_digit(s[i])) ++i;
    return i - b;
  };
  if (i < n && (s[i] == '-' || s[i] == '+')) ++i;
  size_t mantissa = digits();
  if (i < n && s[i] == '.') {
    ++i;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '-' || s[i] == '+')) ++i;
    if (digits() == 0) return false;
  }
  return i == n;
}

std::optional<double> parse_double(const std::string& s) {
  if (!is_float_text(s)) return std::nullopt;
  errno = 0;
  double x = std::strtod(s.c_str(), nullptr);
  if (errno == ERANGE && std::isinf(x)) return std::nullopt;
  return x;
}

std::optional<double> parse_double(const YAML::Node& v) {
  if (!is_plain(v)) return std::nullopt;
  return parse_double(v.Scalar());
}

std::optional<bool> parse_bool(const YAML::Node& v) {
  if (!is_plain(v)) return std::nullopt;
  const std::string& s = v.Scalar();
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

std::string format_double(double x) {
  char buf[64];
  // whole numbers as integers (rotary_base 500000, not 5e+05)
  const bool whole = std::abs(x) < 1e15 && x == std::trunc(x);
  auto [end, ec] = whole ? std::to_chars(buf, buf + sizeof buf, x, std::chars_format::fixed)
                         : std::to_chars(buf, buf + sizeof buf, x);
  TPT_CHECK(ec == std::errc());
  std::string s(buf, end);
  size_t e = s.find('e');
  if (e != std::string::npos && s.find('.') == std::string::npos) s.insert(e, ".0");
  return s;
}

// The split as Megatron writes it: a list [949, 50, 1] or a string "949,50,1".
std::optional<std::vector<double>> parse_split(const YAML::Node& v) {
  std::vector<double> out;
  if (v.IsSequence()) {
    for (const YAML::Node& e : v) {
      auto x = parse_double(e);
      if (!x) return std::nullopt;
      out.push_back(*x);
    }
  } else if (v.IsScalar()) {
    std::stringstream ss(v.Scalar());
    std::string part;
    while (std::getline(ss, part, ',')) {
      part.erase(0, part.find_first_not_of(" \t"));
      part.erase(part.find_last_not_of(" \t") + 1);
      auto x = parse_double(part);
      if (!x) return std::nullopt;
      out.push_back(*x);
    }
  }
  if (out.size() != 3) return std::nullopt;
  return out;
}

// training.recompute_modules: Megatron's module names as a list (or one name); core_attn must be
// among them (tptrain's selective recompute is built around it); moe_act, layernorm, moe, mlp and
// shared_experts may be; mla_up_proj (no MLA here) is refused.
RecomputeModules parse_recompute_modules(const YAML::Node& v, const std::string& what) {
  const std::string expected = "a list of modules: core_attn, and any of moe_act, layernorm, moe, mlp, shared_experts";
  if (!v.IsSequence() && !v.IsScalar()) input_error(what + ": expected " + expected + ", got " + describe(v));
  std::vector<std::string> names;
  if (v.IsScalar()) names.push_back(v.Scalar());
  for (size_t i = 0; v.IsSequence() && i < v.size(); ++i) {
    if (!v[i].IsScalar()) input_error(what + ": entry " + std::to_string(i) + ": expected a module name, got " + describe(v[i]));
    names.push_back(v[i].Scalar());
  }
  RecomputeModules r;
  bool core = false;
  for (const std::string& n : names) {
    if (n == "core_attn") core = true;
    else if (n == "moe_act") r.moe_act = true;
    else if (n == "layernorm") r.layernorm = true;
    else if (n == "moe") r.moe = true;
    else if (n == "mlp") r.mlp = true;
    else if (n == "shared_experts") r.shared_experts = true;
    else if (n == "mla_up_proj")
      input_error(what + ": Megatron's module '" + n + "' is not built in tptrain (it has no multi-latent attention; it reruns "
                  "core_attn, moe_act, layernorm, moe, mlp, shared_experts)");
    else input_error(what + ": unknown module '" + n + "' (allowed: core_attn | moe_act | layernorm | moe | mlp | shared_experts)");
  }
  if (!core)
    input_error(what + ": must list core_attn: tptrain's selective recompute always reruns the attention core (" +
                expected + ")");
  return r;
}

nlohmann::json recompute_modules_json(const RecomputeModules& r) {
  nlohmann::json a = {"core_attn"};
  if (r.moe_act) a.push_back("moe_act");
  if (r.layernorm) a.push_back("layernorm");
  if (r.moe) a.push_back("moe");
  if (r.mlp) a.push_back("mlp");
  if (r.shared_experts) a.push_back("shared_experts");
  return a;
}

// data.path / data.valid_path: a string, or Megatron's blend [w1, prefix1, w2, prefix2, ...]. Errors
// name the list item (1-based) and what it should be.
DataPath parse_data_path(const YAML::Node& v, const std::string& what) {
  DataPath out;
  if (v.IsScalar() && v.Scalar().empty()) input_error(what + ": empty path");
  if (v.IsScalar()) return {{v.Scalar()}, {}};
  if (!v.IsSequence()) input_error(what + ": expected a path or a blend [weight, path, ...], got " + describe(v));
  const size_t n = v.size();
  const std::string form = " (a blend is Megatron's list [weight1, prefix1, weight2, prefix2, ...])";
  if (n == 0 || n / 2 > 32767) input_error(what + (n ? ": more than 32767 components" : ": empty blend") + form);
  double sum = 0;
  if (n % 2 != 0)
    input_error(what + ": the blend has " + std::to_string(n) + " items, an odd number: item " + std::to_string(n) +
                " (" + describe(v[n - 1]) + ") has no " + (parse_double(v[n - 1]) ? "prefix after it" : "weight") + form);
  for (size_t i = 0; i < n; i += 2) {
    const std::string item = "blend item " + std::to_string(i + 1), comp = " (component " + std::to_string(i / 2 + 1) + ")";
    const auto w = parse_double(v[i]);
    if (!w) input_error(what + ": " + item + comp + " must be a weight (a number), got " + describe(v[i]) + form);
    if (!(*w > 0) || !std::isfinite(*w))
      input_error(what + ": " + item + comp + ": the weight " + v[i].Scalar() + " must be positive and finite");
    const YAML::Node& pv = v[i + 1];
    if (!pv.IsScalar() || pv.Scalar().empty() || parse_double(pv))
      input_error(what + ": blend item " + std::to_string(i + 2) + comp + " must be a path (a prefix), got " +
                  describe(pv) + form);
    out.weights.push_back(*w), out.paths.push_back(pv.Scalar());
    sum += *w;
    if (!std::isfinite(sum))  // two weights of 1e308: normalised, every weight would be 0
      input_error(what + ": " + item + comp + ": the weight " + v[i].Scalar() +
                  " makes the weights' sum overflow a double: scale the weights down");
  }
  return out;
}

}  // namespace config_detail
}  // namespace tpt
