// Config loading (docs/ARCHITECTURE.md "Config"). One table, kFields, lists every section.key with its
// C++ field, whether it is required or nullable, and its allowed values; parsing, suggestions for
// misspellings, YAML and JSON output all walk that table, so a new key is added in one place. The
// scalar readers are in core/config_values.cpp, model.rope_scaling and the model keys' rules in
// core/config_model.cpp (both declared in core/config_detail.h).
#include "core/config.h"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <variant>

#include "core/config_detail.h"
#include "core/error.h"

namespace tpt {
namespace {

using namespace config_detail;  // the scalar readers and writers, the model keys

using FieldRef = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<double>*,
                              DataPath*, RopeScaling*, PipelineSchedule*, Precision*, Recompute*, Device*,
                              LrDecayStyle*, Normalization*, PositionEmbedding*, LayerFreq*, RecomputeModules*, MoEScore*,
                              MoEBalancing*, MoEDropPolicy*, MoEDispatcher*, Fp8Format*, Fp8Recipe*, StateDType*>;

enum class Presence {
  kDefault,   // has a default value; null is a type error
  kNullable,  // null (0 / empty in the struct) means "use the default or derived value"
  kRequired,  // must be given, not null
};

struct Field {
  std::string_view section;
  std::string_view key;
  FieldRef (*ref)(Config&);
  Presence presence = Presence::kDefault;
  // non-empty: the allowed values of a string field, or an enum's names (enum_names)
  std::vector<std::string_view> choices = {};

  std::string name() const { return std::string(section) + "." + std::string(key); }
};

template <class E>
std::vector<std::string_view> names() {
  const std::span<const std::string_view> n = enum_names(E{});
  return {n.begin(), n.end()};
}

#define TPT_FIELD(sec, k, ...) \
  Field { #sec, #k, [](Config& c) -> FieldRef { return &c.sec.k; }, __VA_ARGS__ }

constexpr Presence kReq = Presence::kRequired;
constexpr Presence kNull = Presence::kNullable;
constexpr Presence kDef = Presence::kDefault;

// Sections in contract order, keys in struct order (the order of config_to_yaml's output).
const std::vector<std::string_view> kSections = {"model", "parallel",   "training", "optimizer",
                                                 "data",  "checkpoint", "logging"};

const std::vector<Field>& fields() {
  static const std::vector<Field> kFields = {
      TPT_FIELD(model, num_layers, kReq),
      TPT_FIELD(model, hidden_size, kReq),
      TPT_FIELD(model, num_attention_heads, kReq),
      TPT_FIELD(model, ffn_hidden_size, kNull),
      TPT_FIELD(model, seq_length, kReq),
      TPT_FIELD(model, max_position_embeddings, kNull),
      TPT_FIELD(model, vocab_size, kReq),
      TPT_FIELD(model, make_vocab_size_divisible_by),
      TPT_FIELD(model, layernorm_epsilon),
      TPT_FIELD(model, normalization, kDef, names<Normalization>()),
      TPT_FIELD(model, swiglu),
      TPT_FIELD(model, position_embedding_type, kDef, names<PositionEmbedding>()),
      TPT_FIELD(model, rotary_base),
      TPT_FIELD(model, rotary_percent),
      TPT_FIELD(model, rotary_interleaved),
      TPT_FIELD(model, rope_scaling, kNull),
      TPT_FIELD(model, group_query_attention),
      TPT_FIELD(model, num_query_groups, kNull),
      TPT_FIELD(model, kv_channels, kNull),
      TPT_FIELD(model, untie_embeddings_and_output_weights),
      TPT_FIELD(model, add_bias_linear),
      TPT_FIELD(model, add_qkv_bias),
      TPT_FIELD(model, qk_layernorm),
      TPT_FIELD(model, init_method_std),
      TPT_FIELD(model, hidden_dropout),
      TPT_FIELD(model, attention_dropout),
      TPT_FIELD(model, init_from, kNull),
      TPT_FIELD(model, num_moe_experts, kNull),
      TPT_FIELD(model, moe_ffn_hidden_size, kNull),
      TPT_FIELD(model, moe_layer_freq),
      TPT_FIELD(model, moe_router_topk),
      TPT_FIELD(model, moe_router_score_function, kDef, names<MoEScore>()),
      TPT_FIELD(model, moe_router_pre_softmax),
      TPT_FIELD(model, moe_router_topk_scaling_factor, kNull),
      TPT_FIELD(model, moe_router_num_groups, kNull),
      TPT_FIELD(model, moe_router_group_topk, kNull),
      TPT_FIELD(model, moe_router_enable_expert_bias),
      TPT_FIELD(model, moe_router_bias_update_rate),
      TPT_FIELD(model, moe_router_load_balancing_type, kDef, names<MoEBalancing>()),
      TPT_FIELD(model, moe_aux_loss_coeff),
      TPT_FIELD(model, moe_z_loss_coeff, kNull),
      TPT_FIELD(model, moe_shared_expert_intermediate_size, kNull),
      TPT_FIELD(model, moe_shared_expert_gate),
      TPT_FIELD(model, moe_expert_capacity_factor, kNull),
      TPT_FIELD(model, moe_token_drop_policy, kDef, names<MoEDropPolicy>()),
      TPT_FIELD(model, moe_pad_expert_input_to_capacity),
      TPT_FIELD(model, moe_token_dispatcher_type, kDef, names<MoEDispatcher>()),
      TPT_FIELD(model, moe_dispatch_bound_factor),
      TPT_FIELD(model, moe_kept_rows_factor),
      TPT_FIELD(model, moe_router_dtype, kDef, {"fp32"}),
      TPT_FIELD(parallel, tensor_model_parallel_size),
      TPT_FIELD(parallel, pipeline_model_parallel_size),
      TPT_FIELD(parallel, data_parallel_size, kNull),
      TPT_FIELD(parallel, context_parallel_size),
      TPT_FIELD(parallel, pipeline_schedule, kDef, names<PipelineSchedule>()),
      TPT_FIELD(parallel, virtual_pipeline_model_parallel_size, kNull),
      TPT_FIELD(parallel, sequence_parallel),
      TPT_FIELD(parallel, distributed_optimizer),
      TPT_FIELD(parallel, overlap_param_gather),
      TPT_FIELD(parallel, grad_reduce_in_bf16),
      TPT_FIELD(parallel, overlap_grad_reduce),
      TPT_FIELD(parallel, ddp_bucket_size),
      TPT_FIELD(parallel, expert_model_parallel_size),
      TPT_FIELD(parallel, expert_tensor_parallel_size, kNull),
      TPT_FIELD(parallel, distributed_timeout_minutes),
      TPT_FIELD(training, micro_batch_size),
      TPT_FIELD(training, global_batch_size, kNull),
      TPT_FIELD(training, train_iters, kReq),
      TPT_FIELD(training, precision, kDef, names<Precision>()),
      TPT_FIELD(training, recompute, kDef, names<Recompute>()),
      TPT_FIELD(training, recompute_modules),
      TPT_FIELD(training, seed),
      TPT_FIELD(training, device, kDef, names<Device>()),
      TPT_FIELD(training, cpu_threads, kNull),
      TPT_FIELD(training, nan_iteration_limit),
      TPT_FIELD(training, deterministic),
      TPT_FIELD(training, fp8_format, kNull, names<Fp8Format>()),
      TPT_FIELD(training, fp8_recipe, kDef, names<Fp8Recipe>()),
      TPT_FIELD(training, fp8_margin),
      TPT_FIELD(training, fp8_amax_history_len),
      TPT_FIELD(training, fp8_amax_compute_algo, kDef, {"max", "most_recent"}),
      TPT_FIELD(training, fp8_wgrad),
      TPT_FIELD(training, fp8_param_gather),
      TPT_FIELD(training, first_last_layers_bf16),
      TPT_FIELD(training, num_layers_at_start_in_bf16),
      TPT_FIELD(training, num_layers_at_end_in_bf16),
      TPT_FIELD(optimizer, lr),
      TPT_FIELD(optimizer, min_lr),
      TPT_FIELD(optimizer, lr_warmup_iters),
      TPT_FIELD(optimizer, lr_decay_style, kDef, names<LrDecayStyle>()),
      TPT_FIELD(optimizer, lr_decay_iters, kNull),
      TPT_FIELD(optimizer, weight_decay),
      TPT_FIELD(optimizer, adam_beta1),
      TPT_FIELD(optimizer, adam_beta2),
      TPT_FIELD(optimizer, adam_eps),
      TPT_FIELD(optimizer, clip_grad),
      TPT_FIELD(optimizer, initial_loss_scale),
      TPT_FIELD(optimizer, store_param_remainders),
      TPT_FIELD(optimizer, use_precision_aware_optimizer),
      TPT_FIELD(optimizer, main_grads_dtype, kDef, names<StateDType>()),
      TPT_FIELD(optimizer, main_params_dtype, kDef, names<StateDType>()),
      TPT_FIELD(optimizer, exp_avg_dtype, kDef, names<StateDType>()),
      TPT_FIELD(optimizer, exp_avg_sq_dtype, kDef, names<StateDType>()),
      TPT_FIELD(data, path, kReq),
      TPT_FIELD(data, eod_mask_loss),
      TPT_FIELD(data, reset_position_ids),
      TPT_FIELD(data, reset_attention_mask),
      TPT_FIELD(data, eod_token_id),
      TPT_FIELD(data, shuffle),
      TPT_FIELD(data, split),
      TPT_FIELD(data, valid_path, kNull),
      TPT_FIELD(data, eval_interval),
      TPT_FIELD(data, eval_iters),
      TPT_FIELD(checkpoint, save, kNull),
      TPT_FIELD(checkpoint, save_interval),
      TPT_FIELD(checkpoint, load, kNull),
      TPT_FIELD(checkpoint, keep_last, kNull),
      TPT_FIELD(checkpoint, exit_signal, kDef, {"SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP"}),
      TPT_FIELD(checkpoint, exit_duration_mins, kNull),
      TPT_FIELD(checkpoint, async_save),
      TPT_FIELD(logging, log_interval),
      TPT_FIELD(logging, metrics_file, kNull),
      TPT_FIELD(logging, trace_file, kNull),
      TPT_FIELD(logging, profile_ops),
      TPT_FIELD(logging, tensorboard_dir, kNull),
      TPT_FIELD(logging, log_timers_to_tensorboard),
  };
  return kFields;
}
#undef TPT_FIELD

// Reading a field through the table: the table's accessor takes a mutable Config, reads don't write.
FieldRef cref(const Field& f, const Config& cfg) { return f.ref(const_cast<Config&>(cfg)); }

bool is_section(std::string_view s) {
  return std::find(kSections.begin(), kSections.end(), s) != kSections.end();
}

const Field* find_field(std::string_view section, std::string_view key) {
  for (const Field& f : fields())
    if (f.section == section && f.key == key) return &f;
  return nullptr;
}

// ---- Suggestions for misspelt names ----

// The valid name closest to `word`, or "" when nothing is close. `section` is the section the
// word was found in, or empty for a top-level name; a key that is valid in another section costs
// one edit more than in its own (so "training.lr" finds "optimizer.lr"), and a top-level word may
// be a misspelt section or a key without its section.
std::string closest_name(std::string_view section, std::string_view word) {
  std::string best;
  size_t best_score = std::numeric_limits<size_t>::max();
  auto consider = [&](const std::string& name, size_t score) {
    if (score < best_score) best_score = score, best = name;
  };
  if (section.empty())
    for (std::string_view s : kSections) consider(std::string(s), edit_distance(word, s));
  for (const Field& f : fields())
    consider(f.name(), edit_distance(word, f.key) + (f.section == section ? 0 : 1));
  size_t limit = std::max<size_t>(2, word.size() / 3);
  return best_score <= limit ? best : "";
}

std::string did_you_mean(const std::string& name) {
  return name.empty() ? "" : " (did you mean '" + name + "'?)";
}

std::string suggestion(std::string_view section, std::string_view word) {
  return did_you_mean(closest_name(section, word));
}

// ---- Scalars ----

struct Ctx {
  std::string source;                         // the config file (or parse_config's source name)
  std::map<std::string, std::string> origin;  // key -> where its current non-null value came from

  // Where `key`'s value came from: its override, else the file.
  const std::string& where(const std::string& key) const {
    auto it = origin.find(key);
    return it == origin.end() ? source : it->second;
  }
  bool given(const std::string& key) const { return origin.count(key) != 0; }
  [[noreturn]] void fail(const std::string& key, const std::string& reason) const {
    input_error(where(key) + ": " + key + ": " + reason);
  }
  // A constraint between `key` and `other`: blamed on whichever was overridden, else the file.
  [[noreturn]] void fail(const std::string& key, const std::string& other, const std::string& reason) const {
    const std::string& w = where(key) != source ? where(key) : where(other);
    input_error(w + ": " + key + ": " + reason);
  }
};

std::string join(const std::vector<std::string_view>& xs, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < xs.size(); ++i) out += (i ? std::string(sep) : "") + std::string(xs[i]);
  return out;
}

// Sets field `f` from YAML value `v`; `where` names the file or the --set that gave it.
void assign(Config& cfg, Ctx& ctx, const Field& f, const YAML::Node& v, const std::string& where) {
  const std::string name = f.name();
  auto bad = [&](const std::string& expected) {
    input_error(where + ": " + name + ": expected " + expected + ", got " + describe(v));
  };
  FieldRef ref = f.ref(cfg);
  if (v.IsNull()) {
    if (f.presence == Presence::kRequired) input_error(where + ": " + name + ": required, may not be null");
    if (f.presence == Presence::kDefault) {
      if (!f.choices.empty()) bad("one of " + join(f.choices, " | "));
      std::visit([&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) bad("a bool (true | false)");
        else if constexpr (std::is_same_v<T, std::string>) bad("a string");
        else if constexpr (std::is_same_v<T, std::vector<double>>) bad("a list of 3 numbers");
        else if constexpr (std::is_same_v<T, LayerFreq>) bad("an integer or a list of 0 / 1 per layer");
        else if constexpr (std::is_same_v<T, RecomputeModules>) bad("a list of modules (core_attn, moe_act)");
        else if constexpr (std::is_same_v<T, DataPath>) bad("a path or a blend [weight, path, ...]");
        else if constexpr (std::is_same_v<T, double>) bad("a number");
        else if constexpr (std::is_enum_v<T>) bad("one of " + join(f.choices, " | "));
        else bad("an integer");
      }, ref);
    }
    std::visit([](auto* p) { *p = {}; }, ref);  // null: 0 / empty, resolved later
    ctx.origin.erase(name);
    return;
  }
  std::visit([&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      T x{};
      IntResult r = parse_int(v, x);
      if (!r.is_int || (std::is_unsigned_v<T> && v.Scalar()[0] == '-'))
        bad(std::is_unsigned_v<T> ? "a non-negative integer" : "an integer");
      if (!r.in_range) input_error(where + ": " + name + ": " + v.Scalar() + " is out of range");
      *p = x;
    } else if constexpr (std::is_same_v<T, double>) {
      auto x = parse_double(v);
      if (!x) bad("a number");
      *p = *x;
    } else if constexpr (std::is_same_v<T, bool>) {
      auto x = parse_bool(v);
      if (!x) bad("a bool (true | false)");
      *p = *x;
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.IsScalar()) bad(f.choices.empty() ? "a string" : "one of " + join(f.choices, " | "));
      if (!f.choices.empty() &&
          std::find(f.choices.begin(), f.choices.end(), v.Scalar()) == f.choices.end())
        input_error(where + ": " + name + ": unknown value '" + v.Scalar() +
                    "' (allowed: " + join(f.choices, " | ") + ")");
      *p = v.Scalar();
    } else if constexpr (std::is_same_v<T, DataPath>) {
      *p = parse_data_path(v, where + ": " + name);
    } else if constexpr (std::is_same_v<T, RopeScaling>) {
      *p = parse_rope_scaling(v, where + ": " + name);
    } else if constexpr (std::is_same_v<T, LayerFreq>) {
      *p = parse_layer_freq(v, where + ": " + name);
    } else if constexpr (std::is_same_v<T, RecomputeModules>) {
      *p = parse_recompute_modules(v, where + ": " + name);
    } else if constexpr (std::is_enum_v<T>) {
      const auto it = v.IsScalar() ? std::find(f.choices.begin(), f.choices.end(), v.Scalar()) : f.choices.end();
      if (!v.IsScalar()) bad("one of " + join(f.choices, " | "));
      if (it == f.choices.end())
        input_error(where + ": " + name + ": unknown value '" + v.Scalar() + "' (allowed: " + join(f.choices, " | ") + ")");
      *p = T(it - f.choices.begin());
    } else {
      auto x = parse_split(v);
      if (!x) bad("a list of 3 numbers (train, valid, test)");
      *p = *x;
    }
  }, ref);
  ctx.origin[name] = where;
}

// ---- Validation and derived values ----

int64_t as_int(const FieldRef& r) {
  if (auto p = std::get_if<int*>(&r)) return **p;
  if (auto p = std::get_if<int64_t*>(&r)) return **p;
  internal_error("config: as_int on a non-integer field");
}

// Well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
    if (n < 0 || i + size_t(n) >= s.size() + (n == 0 ? 1 : 0)) return false;
    uint32_t cp = n == 0 ? c : n == 1 ? c & 0x1Fu : n == 2 ? c & 0x0Fu : c & 0x07u;
    for (int k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    const uint32_t min[] = {0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += size_t(n) + 1;
  }
  return true;
}

void validate(Config& c, const Ctx& ctx) {
  for (const Field& f : fields()) {
    const std::string name = f.name();
    if (f.presence == Presence::kRequired && !ctx.given(name)) ctx.fail(name, "missing required key");
    // strings travel into JSON (checkpoints, metrics) and the log: UTF-8 only
    const FieldRef ref = cref(f, c);
    if (auto* str = std::get_if<std::string*>(&ref))
      if (!valid_utf8(**str)) ctx.fail(name, "is not valid UTF-8 text");
    if (auto* dp = std::get_if<DataPath*>(&ref))
      for (const std::string& path : (*dp)->paths) if (!valid_utf8(path)) ctx.fail(name, "is not valid UTF-8 text");
    // Every integer size/count/interval is >= 1 when given, except these two counts.
    bool is_int = std::holds_alternative<int*>(cref(f, c)) || std::holds_alternative<int64_t*>(cref(f, c));
    if (!is_int) continue;
    int64_t x = as_int(cref(f, c));
    if (name == "data.eod_token_id") {
      if (ctx.given(name) && x < 0) ctx.fail(name, "must be >= 0, got " + std::to_string(x));
    } else if (name == "data.eval_iters" || name == "optimizer.lr_warmup_iters" || name == "training.fp8_margin" ||
               name.find("_in_bf16") != std::string::npos) {
      if (x < 0) ctx.fail(name, "must be >= 0, got " + std::to_string(x));
    } else if ((f.presence != Presence::kNullable || ctx.given(name)) && x < 1) {
      ctx.fail(name, "must be >= 1, got " + std::to_string(x) +
                         (f.presence == Presence::kNullable ? " (use null for the default)" : ""));
    }
    // Sane upper bounds: far above any real run, low enough that no size computed from them can
    // overflow before the plan's memory check (plan/memory.h check_plannable) sees it.
    static const std::map<std::string, int64_t, std::less<>> kMax = {
        {"model.num_layers", 100000},           {"model.hidden_size", 1 << 20},
        {"model.num_attention_heads", 1 << 16}, {"model.ffn_hidden_size", 1 << 22},
        {"model.seq_length", 1 << 24},          {"model.max_position_embeddings", 1 << 24},
        {"model.vocab_size", 1 << 24},          {"model.kv_channels", 1 << 16},
        {"model.num_query_groups", 1 << 16},    {"training.micro_batch_size", 1 << 24},
        {"training.global_batch_size", 1 << 30}, {"training.cpu_threads", 4096},
        {"parallel.tensor_model_parallel_size", 1024}, {"parallel.pipeline_model_parallel_size", 1024},
        {"parallel.virtual_pipeline_model_parallel_size", 1024},
        {"parallel.data_parallel_size", 1 << 20}, {"parallel.context_parallel_size", 1024},
        {"model.make_vocab_size_divisible_by", 1 << 24}, {"parallel.ddp_bucket_size", int64_t(1) << 40},
        {"training.fp8_margin", 64}, {"training.fp8_amax_history_len", 1 << 16}};
    auto bound = kMax.find(name);
    if (bound != kMax.end() && x > bound->second)
      ctx.fail(name, "must be <= " + std::to_string(bound->second) + ", got " + std::to_string(x));
  }

  ModelConfig& m = c.model;
  if (m.ffn_hidden_size == 0) m.ffn_hidden_size = 4 * m.hidden_size;  // <= 2^22 by the bounds above
  if (m.max_position_embeddings == 0) m.max_position_embeddings = m.seq_length;
  if (!ctx.given("data.eod_token_id")) c.data.eod_token_id = m.vocab_size - 1;  // both tokenizers' EOD
  if (c.data.eod_token_id >= m.vocab_size)
    ctx.fail("data.eod_token_id", "model.vocab_size", std::to_string(c.data.eod_token_id) +
                                      " is not below model.vocab_size (" + std::to_string(m.vocab_size) + ")");
  if (c.data.reset_attention_mask)
    ctx.fail("data.reset_attention_mask",
             "is not supported: attention blocked across documents would need a per-sequence document mask "
             "in both attention paths (our flash kernels, cuDNN's, the CPU's); use data.reset_position_ids "
             "and data.eod_mask_loss, or set it to false");
  if (c.optimizer.lr_decay_iters == 0) c.optimizer.lr_decay_iters = c.training.train_iters;

  auto str = [](double x) {
    std::ostringstream os;
    os << x;
    return os.str();
  };
  const ModelKeys model_keys{[&](const std::string& key) { return ctx.given(key); },
                             [&](const std::string& key, const std::string& other, const std::string& reason) {
                               other.empty() ? ctx.fail(key, reason) : ctx.fail(key, other, reason);
                             }};
  resolve_model(m, model_keys);
  resolve_moe(m, model_keys);
  resolve_fp8(c, model_keys);
  if (m.seq_length > m.max_position_embeddings)
    ctx.fail("model.seq_length", "model.max_position_embeddings", std::to_string(m.seq_length) +
                                     " is longer than model.max_position_embeddings (" +
                                     std::to_string(m.max_position_embeddings) + ")");
  auto check = [&](const char* key, double x, bool ok, const char* rule) {
    if (!ok) ctx.fail(key, std::string("must be ") + rule + ", got " + str(x));
  };
  auto in_unit = [](double x) { return x >= 0.0 && x < 1.0; };
  check("model.hidden_dropout", m.hidden_dropout, in_unit(m.hidden_dropout), "in [0, 1)");
  check("model.attention_dropout", m.attention_dropout, in_unit(m.attention_dropout), "in [0, 1)");
  check("model.layernorm_epsilon", m.layernorm_epsilon, m.layernorm_epsilon > 0, "> 0");
  check("model.init_method_std", m.init_method_std, m.init_method_std > 0, "> 0");

  check("parallel.distributed_timeout_minutes", c.parallel.distributed_timeout_minutes,
        c.parallel.distributed_timeout_minutes > 0, "> 0");

  const OptimizerConfig& o = c.optimizer;
  check("optimizer.lr", o.lr, o.lr >= 0, ">= 0");
  check("optimizer.min_lr", o.min_lr, o.min_lr >= 0, ">= 0");
  if (o.min_lr > o.lr)
    ctx.fail("optimizer.min_lr", "optimizer.lr", str(o.min_lr) + " is greater than optimizer.lr (" + str(o.lr) + ")");
  check("optimizer.adam_beta1", o.adam_beta1, in_unit(o.adam_beta1), "in [0, 1)");
  check("optimizer.adam_beta2", o.adam_beta2, in_unit(o.adam_beta2), "in [0, 1)");
  check("optimizer.adam_eps", o.adam_eps, o.adam_eps > 0, "> 0");
  check("optimizer.weight_decay", o.weight_decay, o.weight_decay >= 0, ">= 0");
  check("optimizer.clip_grad", o.clip_grad, o.clip_grad >= 0, ">= 0 (0 disables clipping)");
  check("optimizer.initial_loss_scale", o.initial_loss_scale, o.initial_loss_scale > 0, "> 0");
  resolve_optimizer_storage(c, model_keys);

  const CheckpointConfig& ck = c.checkpoint;
  if (ctx.given("checkpoint.exit_duration_mins"))
    check("checkpoint.exit_duration_mins", ck.exit_duration_mins, ck.exit_duration_mins > 0,
          "> 0 (use null to disable)");

  const std::string split = split_weights_error(c.data.split);
  if (!split.empty()) ctx.fail("data.split", split);

  const TrainingConfig& t = c.training;
  if ((t.recompute_modules.moe_act || t.recompute_modules.moe) && !m.is_moe())
    ctx.fail("training.recompute_modules", "model.num_moe_experts",
             std::string(t.recompute_modules.moe ? "moe reruns MoE layers" : "moe_act reruns MoE experts' activations") +
                 ": the model has none");
  if (t.recompute_modules.shared_experts && m.moe_shared_expert_intermediate_size == 0)
    ctx.fail("training.recompute_modules", "model.moe_shared_expert_intermediate_size",
             "shared_experts reruns the MoE shared expert's fc1 and activation: the model has none "
             "(model.moe_shared_expert_intermediate_size)");
  if (t.recompute_modules.mlp) {
    bool dense = false;
    for (int64_t l = 0; l < m.num_layers && !dense; ++l) dense = !m.is_moe_layer(l);
    if (!dense)
      ctx.fail("training.recompute_modules", "model.moe_layer_freq",
               "mlp reruns the dense MLPs' fc1 and activation: every layer is an MoE layer (model.moe_layer_freq)");
  }
  std::string length_key;
  const std::string length = run_length_error(c, t.global_batch_size ? t.global_batch_size : t.micro_batch_size, length_key);
  if (!length.empty()) ctx.fail(length_key, length);
  if (t.global_batch_size != 0 && t.global_batch_size % t.micro_batch_size != 0)
    ctx.fail("training.global_batch_size", "training.micro_batch_size",
             std::to_string(t.global_batch_size) + " is not a multiple of training.micro_batch_size (" +
                 std::to_string(t.micro_batch_size) + ")");

  if (!m.init_from.empty()) {
    std::error_code ec;
    // a safetensors file (HF GPT-2, or Llama with config.json beside it), or a Hugging Face checkpoint
    // directory, its model.safetensors.index.json or config.json (interop/hf/llama.h)
    if (!std::filesystem::is_regular_file(m.init_from, ec) && !std::filesystem::is_directory(m.init_from, ec))
      ctx.fail("model.init_from", "no such file '" + m.init_from +
                                      "' (a safetensors file or a Hugging Face checkpoint directory)");
  }
}

// ---- Reading ----

// Parses YAML text; a syntax error names `where` and, for a file, the line and column.
YAML::Node load_yaml(const std::string& text, const std::string& where, bool is_file) {
  // One document: a "---" line after content starts a second one, which YAML::Load would ignore
  // (YAML::LoadAll cannot be used: it never returns on some inputs, e.g. ",").
  bool content = false;
  for (size_t b = 0; b < text.size();) {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    const std::string_view line(text.data() + b, e - b);
    const bool marker = line.substr(0, 3) == "---" && (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r');
    if (marker && content) input_error(where + ": holds more than one YAML document (a second \"---\"); a config is one document");
    const size_t first = line.find_first_not_of(" \t\r");
    if (!marker && first != std::string_view::npos && line[first] != '#' && line.substr(0, 3) != "...") content = true;
    b = e + 1;
  }
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    std::string at = ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    input_error(where + (is_file ? at : "") + ": YAML syntax error: " + e.msg);
  } catch (const YAML::Exception& e) {
    input_error(where + ": YAML error: " + e.msg);
  }
}

std::string key_text(const YAML::Node& k, const std::string& where) {
  if (!k.IsScalar()) input_error(where + ": keys must be plain names, got " + describe(k));
  return k.Scalar();
}

void apply_file(Config& cfg, Ctx& ctx, const YAML::Node& root) {
  const std::string& src = ctx.source;
  std::set<std::string> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    std::string sec = key_text(it->first, src);
    if (!is_section(sec)) input_error(src + ": " + sec + ": unknown section" + suggestion("", sec));
    if (!seen.insert(sec).second) input_error(src + ": " + sec + ": duplicate section");
    const YAML::Node body = it->second;  // a copy: `it->` yields a temporary
    if (body.IsNull()) continue;
    if (!body.IsMap()) input_error(src + ": " + sec + ": expected a map of keys, got " + describe(body));
    for (auto kv = body.begin(); kv != body.end(); ++kv) {
      std::string key = key_text(kv->first, src);
      const Field* f = find_field(sec, key);
      if (!f) input_error(src + ": " + sec + "." + key + ": unknown key" + suggestion(sec, key));
      if (!seen.insert(sec + "." + key).second) input_error(src + ": " + sec + "." + key + ": duplicate key");
      assign(cfg, ctx, *f, kv->second, src);
    }
  }
}

void apply_override(Config& cfg, Ctx& ctx, const std::string& ov) {
  const std::string where = "--set " + ov;
  size_t eq = ov.find('=');
  std::string name = ov.substr(0, eq);
  size_t dot = name.find('.');
  if (eq == std::string::npos) input_error(where + ": expected section.key=value (no '=')");
  if (dot == std::string::npos || dot == 0)
    input_error(where + ": expected section.key=value" +
                suggestion("", dot == std::string::npos ? name : name.substr(dot + 1)));
  std::string sec = name.substr(0, dot), key = name.substr(dot + 1);
  if (!is_section(sec)) {
    std::string best = closest_name("", sec);
    if (is_section(best) && find_field(best, key)) best += "." + key;  // only the section is misspelt
    input_error(where + ": " + sec + ": unknown section" + did_you_mean(best));
  }
  const Field* f = find_field(sec, key);
  if (!f) input_error(where + ": " + name + ": unknown key" + suggestion(sec, key));
  assign(cfg, ctx, *f, load_yaml(ov.substr(eq + 1), where, false), where);
}

// ---- Writing ----

// A string as a YAML scalar: plain when it cannot be mistaken for anything else, else JSON-quoted
// (a JSON string is a valid YAML double-quoted scalar).
std::string yaml_string(const std::string& s) {
  // Plain: a path-like name, or a name starting with a digit that holds a letter (1f1b) but is no
  // number in YAML 1.1 or 1.2 (1e5, 0x1f).
  // [A-Za-z_./][A-Za-z0-9_./+-]*  |  [1-9][A-Za-z0-9_]*[A-Za-z][A-Za-z0-9_]*
  auto word = [](char c) { return is_alpha(c) || is_digit(c) || c == '_'; };
  const bool path_like = !s.empty() && (is_alpha(s[0]) || s[0] == '_' || s[0] == '.' || s[0] == '/') &&
                         std::all_of(s.begin(), s.end(), [&](char c) {
                           return word(c) || c == '.' || c == '/' || c == '+' || c == '-';
                         });
  const bool digit_name = !s.empty() && s[0] >= '1' && s[0] <= '9' && std::all_of(s.begin(), s.end(), word) &&
                          std::any_of(s.begin() + 1, s.end(), is_alpha);
  static const std::set<std::string, std::less<>> kReserved = {
      "null", "Null", "NULL", "true", "True", "TRUE", "false", "False", "FALSE", "yes",  "Yes",  "YES",
      "no",   "No",   "NO",   "on",   "On",   "ON",   "off",   "Off",   "OFF",   "y",    "Y",    "n",
      "N",    ".inf", ".Inf", ".INF", ".nan", ".NaN", ".NAN"};
  if ((path_like || digit_name) && !kReserved.count(s) && !parse_double(s)) return s;
  return nlohmann::json(s).dump();
}

std::string value_yaml(const Field& f, const Config& cfg) {
  return std::visit([&](auto* p) -> std::string {
    using T = std::remove_pointer_t<decltype(p)>;
    bool null_value = f.presence == Presence::kNullable && *p == T{};
    if (null_value) return "null";
    if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
    else if constexpr (std::is_same_v<T, std::string>) return yaml_string(*p);
    else if constexpr (std::is_enum_v<T>) return yaml_string(name_of(*p));
    else if constexpr (std::is_same_v<T, DataPath>) {
      std::string s = "[";
      for (size_t i = 0; i < p->paths.size() && p->is_blend(); ++i)
        s += (i ? ", " : "") + format_double(p->weights[i]) + ", " + yaml_string(p->paths[i]);
      return p->is_blend() ? s + "]" : yaml_string(p->paths.at(0));
    }
    else if constexpr (std::is_same_v<T, double>) return format_double(*p);
    else if constexpr (std::is_same_v<T, RopeScaling>) return rope_scaling_yaml(*p);
    else if constexpr (std::is_same_v<T, LayerFreq>) return layer_freq_json(*p).dump();
    else if constexpr (std::is_same_v<T, RecomputeModules>) return recompute_modules_json(*p).dump();
    else if constexpr (std::is_same_v<T, std::vector<double>>) {
      std::string s = "[";
      for (size_t i = 0; i < p->size(); ++i) s += (i ? ", " : "") + format_double((*p)[i]);
      return s + "]";
    } else return std::to_string(*p);
  }, cref(f, cfg));
}

nlohmann::json value_json(const Field& f, const Config& cfg) {
  return std::visit([&](auto* p) -> nlohmann::json {
    using T = std::remove_pointer_t<decltype(p)>;
    if (f.presence == Presence::kNullable && *p == T{}) return nullptr;
    if constexpr (std::is_same_v<T, DataPath>) {
      if (!p->is_blend()) return p->paths.at(0);
      nlohmann::json a = nlohmann::json::array();
      for (size_t i = 0; i < p->paths.size(); ++i) a.push_back(p->weights[i]), a.push_back(p->paths[i]);
      return a;
    } else if constexpr (std::is_enum_v<T>) {
      return name_of(*p);
    } else if constexpr (std::is_same_v<T, RopeScaling>) {
      return rope_scaling_json(*p);
    } else if constexpr (std::is_same_v<T, LayerFreq>) {
      return layer_freq_json(*p);
    } else if constexpr (std::is_same_v<T, RecomputeModules>) {
      return recompute_modules_json(*p);
    } else {
      return *p;
    }
  }, cref(f, cfg));
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  YAML::Node root = load_yaml(yaml_text, source_name, true);
  if (root.IsNull())
    input_error(source_name + ": the config is empty (expected sections: " + join(kSections, ", ") + ")");
  if (!root.IsMap())
    input_error(source_name + ": the top level must be a map of sections (" + join(kSections, ", ") +
                "), got " + describe(root));
  Config cfg;
  Ctx ctx{source_name, {}};
  apply_file(cfg, ctx, root);
  for (const std::string& ov : overrides) apply_override(cfg, ctx, ov);
  validate(cfg, ctx);
  return cfg;
}

ModelConfig model_config_from_json(const nlohmann::json& model, const std::string& where) {
  if (!model.is_object()) input_error(where + ": expected a map of model keys, got " + model.dump());
  // JSON is YAML: the section is read as a config file's model section
  const YAML::Node root = load_yaml(nlohmann::json{{"model", model}}.dump(), where, false);
  Config cfg;
  Ctx ctx{where, {}};
  apply_file(cfg, ctx, root);
  for (const Field& f : fields())
    if (f.presence == Presence::kRequired && f.name().rfind("model.", 0) == 0 && !ctx.given(f.name()))
      ctx.fail(f.name(), "missing required key");
  ModelConfig& m = cfg.model;
  if (m.ffn_hidden_size == 0) m.ffn_hidden_size = 4 * m.hidden_size;
  if (m.max_position_embeddings == 0) m.max_position_embeddings = m.seq_length;
  const ModelKeys keys{[&](const std::string& key) { return ctx.given(key); },
                       [&](const std::string& key, const std::string& other, const std::string& reason) {
                         other.empty() ? ctx.fail(key, reason) : ctx.fail(key, other, reason);
                       }};
  resolve_model(m, keys);
  resolve_moe(m, keys);
  return m;
}

namespace {
bool g_stdin_closed = false;  // note_stdin_closed
}  // namespace

void note_stdin_closed() {
  g_stdin_closed = true;
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // the lowest free fd: 0
  if (fd > 0) {
    ::dup2(fd, 0);
    ::close(fd);
  }
}

std::string read_config_stdin() {
  if (g_stdin_closed)
    input_error("-: standard input is closed (--config - reads the config from it: tptrain --config - < cfg.yaml)");
  std::string text;
  char buf[65536];
  const size_t limit = size_t(16) << 20;
  for (;;) {
    const size_t n = std::fread(buf, 1, sizeof(buf), stdin);
    text.append(buf, n);
    if (text.size() > limit) input_error("-: cannot read config from standard input: larger than 16 MiB");
    if (n < sizeof(buf)) {
      if (std::ferror(stdin)) input_error(std::string("-: cannot read config from standard input: ") + std::strerror(errno));
      break;
    }
  }
  return text;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path == "-") return parse_config(read_config_stdin(), "-", overrides);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) input_error(path + ": cannot read config file: is a directory");
  // only regular files of sane size: a FIFO would block, /dev/zero would never end
  const auto st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    input_error(path + ": cannot read config file: not a regular file");
  if (!ec && std::filesystem::exists(st) && std::filesystem::file_size(path, ec) > (uintmax_t(16) << 20))
    input_error(path + ": cannot read config file: larger than 16 MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error(path + ": cannot read config file: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) input_error(path + ": cannot read config file: " + std::strerror(errno));
  return parse_config(text.str(), path, overrides);
}

std::string config_to_yaml(const Config& cfg) {
  std::string out;
  for (std::string_view sec : kSections) {
    out += std::string(sec) + ":\n";
    for (const Field& f : fields())
      if (f.section == sec) out += "  " + std::string(f.key) + ": " + value_yaml(f, cfg) + "\n";
  }
  return out;
}

nlohmann::json config_to_json(const Config& cfg) {
  nlohmann::json j = nlohmann::json::object();
  for (std::string_view sec : kSections) j[std::string(sec)] = nlohmann::json::object();
  for (const Field& f : fields()) j[std::string(f.section)][std::string(f.key)] = value_json(f, cfg);
  return j;
}

std::string DataPath::text() const {
  if (!is_blend()) return paths.empty() ? "null" : paths[0];
  std::string s = "[";
  for (size_t i = 0; i < paths.size(); ++i) s += (i ? ", " : "") + format_double(weights[i]) + ", " + paths[i];
  return s + "]";
}

int padded_vocab_size(int vocab_size, int divisible_by, int tp) {
  TPT_CHECK(vocab_size >= 1 && divisible_by >= 1 && tp >= 1);
  const int64_t multiple = int64_t{divisible_by} * tp;
  const int64_t padded = (vocab_size + multiple - 1) / multiple * multiple;
  if (padded > std::numeric_limits<int>::max())
    input_error("model.vocab_size (" + std::to_string(vocab_size) + ") padded to a multiple of " +
                std::to_string(multiple) + " overflows");
  return static_cast<int>(padded);
}

}  // namespace tpt
