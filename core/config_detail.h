// Internals of the config loader shared by its files, not an API (include only from core/config*.cpp):
// the scalar readers and writers (core/config_values.cpp), model.rope_scaling's value and the model
// keys' rules (core/config_model.cpp), the fp8 keys' rules (core/config_fp8.cpp), used by the key
// table in core/config.cpp.
#pragma once
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/config.h"

namespace tpt::config_detail {

// ---- Scalars (core/config_values.cpp) ----

std::string describe(const YAML::Node& v);  // null, a map, a list of N, 'text' (for messages)
size_t edit_distance(std::string_view a, std::string_view b);

// A scalar that may be read as a number or bool: plain (not quoted, no !!str tag).
bool is_plain(const YAML::Node& v);

// Hand-written matchers for user strings: std::regex matches recursively and overflows the stack on
// strings of ~26,000 characters.
bool is_digit(char c);
bool is_alpha(char c);
bool is_int_text(std::string_view s);    // [-+]?[0-9]+
bool is_float_text(std::string_view s);  // [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?

// An integer of type T (int, int64_t or uint64_t); "out of range" when it is an integer T cannot hold.
struct IntResult {
  bool is_int = false;
  bool in_range = false;
};
template <typename T>
IntResult parse_int(const YAML::Node& v, T& out) {
  if (!is_plain(v) || !is_int_text(v.Scalar())) return {};
  std::string s = v.Scalar();
  if (s[0] == '+') s.erase(0, 1);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return {true, ec == std::errc() && end == s.data() + s.size()};
}

std::optional<double> parse_double(const std::string& s);  // finite numbers only
std::optional<double> parse_double(const YAML::Node& v);
std::optional<bool> parse_bool(const YAML::Node& v);

// Shortest text that reads back to the same double (whole numbers below 1e15 as integers: 500000);
// "1e-05" is written "1.0e-05" so YAML 1.1 readers (PyYAML) also see a float.
std::string format_double(double x);

// ---- The model keys (core/config_model.cpp) ----

// data.split as Megatron writes it (a list [949, 50, 1] or a string "949,50,1"); nullopt if not 3 numbers.
std::optional<std::vector<double>> parse_split(const YAML::Node& v);
// data.path / data.valid_path: a path, or Megatron's blend [w1, prefix1, ...]; `what` names the key.
DataPath parse_data_path(const YAML::Node& v, const std::string& what);

// model.rope_scaling from a YAML map (not null); `what` is "<where>: model.rope_scaling".
RopeScaling parse_rope_scaling(const YAML::Node& v, const std::string& what);
std::string rope_scaling_yaml(const RopeScaling& r);     // a flow map, or null
nlohmann::json rope_scaling_json(const RopeScaling& r);  // an object, or null

// model.moe_layer_freq from a YAML int or list of 0 / 1 (not null); its value as JSON (an int or a
// list, also its YAML text: a flow list)
LayerFreq parse_layer_freq(const YAML::Node& v, const std::string& what);
nlohmann::json layer_freq_json(const LayerFreq& f);
// training.recompute_modules: a list of Megatron's module names, core_attn first among them
RecomputeModules parse_recompute_modules(const YAML::Node& v, const std::string& what);
nlohmann::json recompute_modules_json(const RecomputeModules& r);

// What the model rules need of the loader: whether a key was given (not null), and a failure naming
// `key` (and `other`, when not empty, for a constraint between two keys); fail throws InputError.
struct ModelKeys {
  std::function<bool(const std::string& key)> given;
  std::function<void(const std::string& key, const std::string& other, const std::string& reason)> fail;
};

// The LLaMA-family keys' rules and derived values (kv_channels), and hidden_size / heads.
void resolve_model(ModelConfig& m, const ModelKeys& keys);
// The Mixture-of-Experts keys' rules and derived values (moe_ffn_hidden_size; core/config_moe.cpp).
void resolve_moe(ModelConfig& m, const ModelKeys& keys);
// The training.fp8_* keys' rules (core/config_fp8.cpp), after resolve_model and resolve_moe.
void resolve_fp8(const Config& c, const ModelKeys& keys);
// optimizer.store_param_remainders and the precision-aware optimizer's keys' rules (core/config_optimizer.cpp).
void resolve_optimizer_storage(const Config& c, const ModelKeys& keys);

}  // namespace tpt::config_detail
