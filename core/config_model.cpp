// The LLaMA-family model keys (docs/ARCHITECTURE.md "Config"): model.rope_scaling's value (parsed,
// written as YAML and JSON), the rules between the model keys and the derived head dim
// (resolve_model, called by the loader in core/config.cpp), and query_groups / rotary_dim.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "core/config.h"
#include "core/config_detail.h"
#include "core/error.h"

namespace tpt {
namespace config_detail {
namespace {

std::string num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

// The keys of model.rope_scaling, in RopeScaling's order (all required), and HF's rope_type.
constexpr std::string_view kRopeKeys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                          "original_max_position_embeddings"};
constexpr std::string_view kRopeType = "rope_type";

// A double as YAML that reads as a float in YAML 1.1 and 1.2: 8 is written 8.0.
std::string float_yaml(double x) {
  std::string s = format_double(x);
  return s.find_first_not_of("-0123456789") == std::string::npos ? s + ".0" : s;
}

}  // namespace

RopeScaling parse_rope_scaling(const YAML::Node& v, const std::string& what) {
  const std::string form = " {factor, low_freq_factor, high_freq_factor, original_max_position_embeddings}";
  if (!v.IsMap()) input_error(what + ": expected null or a map" + form + ", got " + describe(v));
  RopeScaling r;
  std::set<std::string> seen;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it->first.IsScalar()) input_error(what + ": keys must be plain names, got " + describe(it->first));
    const std::string key = it->first.Scalar(), name = what + "." + key;
    const YAML::Node value = it->second;
    if (!seen.insert(key).second) input_error(name + ": duplicate key");
    if (key == kRopeType) {  // HF's configs carry it; only Llama 3's scaling is implemented
      if (!value.IsScalar() || value.Scalar() != "llama3")
        input_error(name + ": only 'llama3' is supported, got " + describe(value));
      continue;
    }
    size_t i = 0;
    while (i < std::size(kRopeKeys) && kRopeKeys[i] != key) ++i;
    if (i == std::size(kRopeKeys)) {
      std::string_view best;
      size_t best_d = std::max<size_t>(2, key.size() / 3) + 1;
      for (std::string_view k : kRopeKeys)
        if (size_t d = edit_distance(key, k); d < best_d) best_d = d, best = k;
      if (size_t d = edit_distance(key, kRopeType); d < best_d) best = kRopeType;
      input_error(name + ": unknown key" +
                  (best.empty() ? "" : " (did you mean 'model.rope_scaling." + std::string(best) + "'?)") +
                  " (rope_scaling holds" + form + ")");
    }
    if (i == 3) {
      int64_t x = 0;
      const IntResult ir = parse_int(value, x);
      if (!ir.is_int) input_error(name + ": expected an integer, got " + describe(value));
      if (!ir.in_range) input_error(name + ": " + value.Scalar() + " is out of range");
      if (x < 1) input_error(name + ": must be >= 1, got " + std::to_string(x));
      r.original_max_position_embeddings = x;
      continue;
    }
    const std::optional<double> x = parse_double(value);
    if (!x) input_error(name + ": expected a number, got " + describe(value));
    if (!(*x > 0)) input_error(name + ": must be > 0, got " + num(*x));
    (i == 0 ? r.factor : i == 1 ? r.low_freq_factor : r.high_freq_factor) = *x;
  }
  for (std::string_view k : kRopeKeys)
    if (!seen.count(std::string(k)))
      input_error(what + "." + std::string(k) + ": missing required key (rope_scaling needs" + form + ")");
  if (!(r.high_freq_factor > r.low_freq_factor))
    input_error(what + ".high_freq_factor: " + num(r.high_freq_factor) +
                " must be greater than model.rope_scaling.low_freq_factor (" + num(r.low_freq_factor) + ")");
  return r;
}

std::string rope_scaling_yaml(const RopeScaling& r) {
  if (!r.enabled()) return "null";
  return "{factor: " + float_yaml(r.factor) + ", low_freq_factor: " + float_yaml(r.low_freq_factor) +
         ", high_freq_factor: " + float_yaml(r.high_freq_factor) +
         ", original_max_position_embeddings: " + std::to_string(r.original_max_position_embeddings) + "}";
}

nlohmann::json rope_scaling_json(const RopeScaling& r) {
  if (!r.enabled()) return nullptr;
  return {{"factor", r.factor},
          {"low_freq_factor", r.low_freq_factor},
          {"high_freq_factor", r.high_freq_factor},
          {"original_max_position_embeddings", r.original_max_position_embeddings}};
}

void resolve_model(ModelConfig& m, const ModelKeys& keys) {
  auto fail = [&](const std::string& key, const std::string& other, const std::string& reason) {
    keys.fail(key, other, reason);
    internal_error("config: ModelKeys::fail returned");
  };
  auto s = [](int64_t x) { return std::to_string(x); };

  // The head dim: kv_channels, by default hidden_size / num_attention_heads.
  if (!keys.given("model.kv_channels")) {
    if (m.hidden_size % m.num_attention_heads != 0)
      fail("model.hidden_size", "model.num_attention_heads",
           s(m.hidden_size) + " is not divisible by model.num_attention_heads (" + s(m.num_attention_heads) +
               ") (or give the head dim model.kv_channels)");
    m.kv_channels = m.hidden_size / m.num_attention_heads;
  }
  if (int64_t{m.num_attention_heads} * m.kv_channels > (1 << 22))
    fail("model.kv_channels", "model.num_attention_heads",
         "model.num_attention_heads (" + s(m.num_attention_heads) + ") * model.kv_channels (" + s(m.kv_channels) +
             ") must be <= " + s(1 << 22));

  // Grouped-query attention: G key/value heads, each shared by num_attention_heads / G query heads.
  const bool groups_given = keys.given("model.num_query_groups");
  if (m.group_query_attention && !groups_given)
    fail("model.group_query_attention", "model.num_query_groups",
         "true needs model.num_query_groups (the number of key/value heads; model.num_attention_heads must be a "
         "multiple of it)");
  if (!m.group_query_attention && groups_given)
    fail("model.num_query_groups", "model.group_query_attention",
         "is only used with model.group_query_attention: true (set it, or set model.num_query_groups: null)");
  if (m.group_query_attention && m.num_attention_heads % m.num_query_groups != 0)
    fail("model.num_attention_heads", "model.num_query_groups",
         s(m.num_attention_heads) + " is not divisible by model.num_query_groups (" + s(m.num_query_groups) + ")");

  if (m.swiglu && !keys.given("model.ffn_hidden_size"))
    fail("model.swiglu", "model.ffn_hidden_size",
         "give model.ffn_hidden_size explicitly with model.swiglu (Llama 3 8B: 14336 for hidden 4096; the default "
         "4 * hidden_size is GPT-2's)");

  // Rotary position embeddings. With learned_absolute, a rotary key set to other than its default is
  // refused (the default itself is accepted: the resolved config lists every key and must re-parse).
  const ModelConfig d;
  if (m.position_embedding_type != PositionEmbedding::Rope) {
    const std::pair<const char*, bool> unused[] = {
        {"model.rotary_base", m.rotary_base != d.rotary_base},
        {"model.rotary_percent", m.rotary_percent != d.rotary_percent},
        {"model.rotary_interleaved", m.rotary_interleaved != d.rotary_interleaved},
        {"model.rope_scaling", m.rope_scaling != d.rope_scaling}};
    for (const auto& [key, set] : unused)
      if (set && keys.given(key))
        fail(key, "model.position_embedding_type",
             "only used with position_embedding_type: rope (model.position_embedding_type is " +
                 name_of(m.position_embedding_type) + ")");
    return;
  }
  if (!(m.rotary_base > 0)) fail("model.rotary_base", "", "must be > 0, got " + num(m.rotary_base));
  if (!(m.rotary_percent > 0 && m.rotary_percent <= 1))
    fail("model.rotary_percent", "", "must be in (0, 1], got " + num(m.rotary_percent));
  const double dim = m.kv_channels * m.rotary_percent;
  const double even = 2 * std::round(dim / 2);
  if (std::abs(dim - even) > 1e-6 * std::max(1.0, dim))
    fail("model.rotary_percent", "model.kv_channels",
         "model.kv_channels (" + s(m.kv_channels) + ") * model.rotary_percent (" + num(m.rotary_percent) +
             ") = " + num(dim) + " is not an even integer (the rotary dimension: channels rotate in pairs)");
}

}  // namespace config_detail

int query_groups(const ModelConfig& m) {
  if (!m.group_query_attention) return m.num_attention_heads;
  TPT_CHECK(m.num_query_groups >= 1);
  return m.num_query_groups;
}

int rotary_dim(const ModelConfig& m) {
  if (m.position_embedding_type != PositionEmbedding::Rope) return 0;
  const int kv = m.kv_channels > 0 ? m.kv_channels : m.hidden_size / m.num_attention_heads;
  return static_cast<int>(std::lround(kv * m.rotary_percent));
}

}  // namespace tpt
