// The resolved run configuration (docs/ARCHITECTURE.md "Config"): YAML sections and keys named after
// Megatron's arguments. load_config() fills every key with its default, applies --set overrides,
// validates types and constraints, and throws InputError naming the key (and the closest valid key
// for a misspelling).
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace tpt {

// The config's choices, parsed once at load (their names below, in value order).
enum class PipelineSchedule { OneFOneB, GPipe, ZeroBubbleH1 };  // parallel.pipeline_schedule
enum class Precision { FP32, BF16, FP16 };                       // training.precision
// training.recompute (model/gpt.h StageOptions):
//   none       keep every activation of a layer until its backward;
//   selective  drop the attention output and its log-sum-exp and rerun the attention core (scores,
//              softmax, weighted values) in backward (the probabilities are never kept: flash-style);
//   full       keep only each layer's input and rerun the layer's forward in backward.
enum class Recompute { None, Selective, Full };
enum class Device { Auto, Cpu, Cuda };                           // training.device
enum class LrDecayStyle { Cosine, Linear, Constant };            // optimizer.lr_decay_style
enum class Normalization { LayerNorm, RMSNorm };                 // model.normalization
enum class PositionEmbedding { LearnedAbsolute, Rope };          // model.position_embedding_type
// Mixture-of-Experts (docs/MOE.md): model.moe_router_score_function, moe_router_load_balancing_type,
// moe_token_drop_policy, moe_token_dispatcher_type
enum class MoEScore { Softmax, Sigmoid };
enum class MoEBalancing { AuxLoss, SeqAuxLoss, GlobalAuxLoss, None };
enum class MoEDropPolicy { Probs, Position };
enum class MoEDispatcher { AllToAll, AllGather };
// FP8 (docs/FP8.md): training.fp8_format (null: none, bf16 as without it), training.fp8_recipe
enum class Fp8Format { None, E4M3, Hybrid };
enum class Fp8Recipe { Delayed, Tensorwise, Blockwise };
// optimizer.main_grads_dtype / main_params_dtype / exp_avg_dtype / exp_avg_sq_dtype (Megatron's
// precision-aware optimizer): the storage of an optimizer state; its math is fp32 whatever this is
enum class StateDType { FP32, BF16, FP16 };

// The names of an enum's values as the config spells them (index = value).
std::span<const std::string_view> enum_names(PipelineSchedule);
std::span<const std::string_view> enum_names(Precision);
std::span<const std::string_view> enum_names(Recompute);
std::span<const std::string_view> enum_names(Device);
std::span<const std::string_view> enum_names(LrDecayStyle);
std::span<const std::string_view> enum_names(Normalization);      // LayerNorm, RMSNorm
std::span<const std::string_view> enum_names(PositionEmbedding);  // learned_absolute, rope
std::span<const std::string_view> enum_names(MoEScore);           // softmax, sigmoid
std::span<const std::string_view> enum_names(MoEBalancing);       // aux_loss, seq_aux_loss, global_aux_loss, none
std::span<const std::string_view> enum_names(MoEDropPolicy);      // probs, position
std::span<const std::string_view> enum_names(MoEDispatcher);      // alltoall, allgather
std::span<const std::string_view> enum_names(Fp8Format);          // null, e4m3, hybrid
std::span<const std::string_view> enum_names(Fp8Recipe);          // delayed, tensorwise, blockwise
std::span<const std::string_view> enum_names(StateDType);         // fp32, bf16, fp16
template <class E>
std::string name_of(E value) {
  return std::string(enum_names(E{})[size_t(value)]);
}

// model.rope_scaling: Llama 3.1's frequency scaling (HF's rope_type "llama3"): wavelengths shorter than
// original_max_position_embeddings / high_freq_factor are kept, those longer than
// original_max_position_embeddings / low_freq_factor divided by factor, those between interpolated.
// null (factor 0) = no scaling.
struct RopeScaling {
  double factor = 0;
  double low_freq_factor = 0;
  double high_freq_factor = 0;
  int64_t original_max_position_embeddings = 0;
  bool enabled() const { return factor != 0; }
  bool operator==(const RopeScaling&) const = default;
};

// model.moe_layer_freq: an int N (layer l is MoE when l % N == 0) or a list of 0/1 per layer.
struct LayerFreq {
  int every = 1;             // the int form (0 when the list is given)
  std::vector<int> pattern;  // the list form: num_layers entries of 0 / 1
  bool operator==(const LayerFreq&) const = default;
};

struct ModelConfig {
  int num_layers = 0;                   // required
  int hidden_size = 0;                  // required
  int num_attention_heads = 0;          // required
  int ffn_hidden_size = 0;              // default 4 * hidden_size (resolved by load_config)
  int seq_length = 0;                   // required
  int max_position_embeddings = 0;      // default seq_length (resolved)
  int vocab_size = 0;                   // required
  int make_vocab_size_divisible_by = 128;
  double layernorm_epsilon = 1e-5;      // of LayerNorm or RMSNorm
  // The LLaMA family (Megatron's names; model/arch.h): each option on its own or together.
  Normalization normalization = Normalization::LayerNorm;  // LayerNorm | RMSNorm (no bias)
  bool swiglu = false;                  // MLP fc2(silu(gate) * up), fc1 = [gate; up]; needs ffn_hidden_size
  PositionEmbedding position_embedding_type = PositionEmbedding::LearnedAbsolute;  // learned_absolute | rope
  double rotary_base = 10000;
  double rotary_percent = 1.0;          // the first rotary_percent of each head's channels are rotated
  bool rotary_interleaved = false;      // false: rotate-half pairs (j, j + d/2) (HF, Megatron); true: (2j, 2j+1)
  RopeScaling rope_scaling;             // null, or Llama 3.1's {factor, low_freq_factor, high_freq_factor, ...}
  bool group_query_attention = false;
  int num_query_groups = 0;             // G with group_query_attention (required then); else null
  int kv_channels = 0;                  // head dim; default hidden_size / num_attention_heads (resolved)
  bool untie_embeddings_and_output_weights = false;  // a separate output layer (lm_head.weight)
  bool add_bias_linear = true;          // biases on QKV, attention projection, fc1, fc2
  bool add_qkv_bias = false;            // a QKV bias even without add_bias_linear (Qwen)
  bool qk_layernorm = false;            // normalization over each head's kv_channels of q and k, before RoPE (Qwen3)
  double init_method_std = 0.02;
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  std::string init_from;                // empty = null
  // Mixture-of-Experts (docs/MOE.md; Megatron's names). num_moe_experts 0 = null: a dense model.
  int num_moe_experts = 0;
  int moe_ffn_hidden_size = 0;          // default ffn_hidden_size (resolved)
  LayerFreq moe_layer_freq;
  int moe_router_topk = 2;
  MoEScore moe_router_score_function = MoEScore::Softmax;
  bool moe_router_pre_softmax = false;
  double moe_router_topk_scaling_factor = 0;  // 0 = null
  int moe_router_num_groups = 0;        // 0 = null
  int moe_router_group_topk = 0;        // 0 = null
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  MoEBalancing moe_router_load_balancing_type = MoEBalancing::AuxLoss;
  double moe_aux_loss_coeff = 0;
  double moe_z_loss_coeff = 0;          // 0 = null
  int moe_shared_expert_intermediate_size = 0;  // 0 = null: no shared expert
  bool moe_shared_expert_gate = false;
  double moe_expert_capacity_factor = 0;  // 0 = null: dropless
  MoEDropPolicy moe_token_drop_policy = MoEDropPolicy::Probs;
  bool moe_pad_expert_input_to_capacity = false;
  MoEDispatcher moe_token_dispatcher_type = MoEDispatcher::AllToAll;
  // dropless with EP > 1: the rows an EP rank's experts take per micro-batch before its dispatch
  // buffers grow (once, with a warning), as a multiple (>= 1) of the balanced load (docs/MOE.md)
  double moe_dispatch_bound_factor = 2.0;
  // dropless with EP > 1: the stage's pool for the rows its MoE layers keep (every layer and
  // micro-batch in flight), as a multiple (>= 1) of their balanced load; past it the pool grows
  // (with a warning) (docs/MOE.md "Buffers")
  double moe_kept_rows_factor = 1.25;
  std::string moe_router_dtype = "fp32";
  bool is_moe() const { return num_moe_experts > 0; }
  // whether layer l (0-based) is an MoE layer (moe_layer_freq); false for every layer of a dense model
  bool is_moe_layer(int64_t l) const;
};

// The number of key/value heads: num_query_groups with group_query_attention, else num_attention_heads.
int query_groups(const ModelConfig& m);
// The rotated channels of each head: kv_channels * rotary_percent (an even integer, checked at load);
// 0 without position_embedding_type: rope.
int rotary_dim(const ModelConfig& m);

struct ParallelConfig {
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  int data_parallel_size = 0;           // 0 = null: derived as world / (TP * CP * PP)
  // Context parallelism (Megatron's name): CP ranks split each sequence into 2 CP chunks, rank r
  // holding chunks r and 2 CP - 1 - r; attention runs as a ring (parallel/context_parallel.h).
  int context_parallel_size = 1;
  PipelineSchedule pipeline_schedule = PipelineSchedule::OneFOneB;  // 1f1b | gpipe | zb-h1 (parallel/schedule.h)
  // Interleaved 1F1B: model chunks per pipeline rank (Megatron's name; 0 = null: one chunk).
  int virtual_pipeline_model_parallel_size = 0;
  bool sequence_parallel = false;
  // Megatron's distributed optimizer (ZeRO-1): gradients reduce-scattered over DP, fp32 master
  // weights and Adam moments sharded over DP, parameters all-gathered after the step
  // (parallel/grad_sync.h); overlap_param_gather: per bucket, waited for by the next forward.
  bool distributed_optimizer = false;
  bool overlap_param_gather = false;
  // Megatron's --grad-reduce-in-bf16: the gradient buffer in bf16, accumulated and reduced in bf16
  // (bf16_grads below; as optimizer.main_grads_dtype: bf16)
  bool grad_reduce_in_bf16 = false;
  // DP gradient all-reduce in buckets of layers, each started as soon as the last micro-batch's
  // backward has finished its layers (Megatron's --overlap-grad-reduce, --ddp-bucket-size: elements).
  bool overlap_grad_reduce = false;
  int64_t ddp_bucket_size = 40000000;
  // Mixture-of-Experts (docs/MOE.md): EP splits each MoE layer's experts over ranks folded into
  // DP x CP (x TP with ETP 1); ETP 0 = null: TP.
  int expert_model_parallel_size = 1;
  int expert_tensor_parallel_size = 0;
  // A rank stuck this long in one communication aborts the job (core/watchdog.h).
  double distributed_timeout_minutes = 10;
};

// training.recompute_modules (Megatron's --recompute-modules): what selective recompute reruns in
// backward (with recompute none or full the list changes nothing). tptrain's selective recompute always reruns the attention
// core (core_attn, which the list must name); moe_act adds the MoE experts' activations (SwiGLU /
// GELU of their fc1 outputs, kept instead), layernorm the layers' two norm outputs (from their kept
// inputs and statistics), moe the MoE layers' whole MLP (router, dispatch, experts, shared expert:
// rerun from the layer's ln2 output before its backward). Other Megatron modules are refused by name.
struct RecomputeModules {
  bool moe_act = false;
  bool layernorm = false;
  bool moe = false;
  bool mlp = false;  // the dense MLPs' fc1 output and activation rerun in backward (Megatron's mlp)
  bool shared_experts = false;  // the MoE shared expert's fc1 output and activation rerun in backward
  bool operator==(const RecomputeModules&) const = default;
};

struct TrainingConfig {
  int micro_batch_size = 1;
  int global_batch_size = 0;            // 0 = null: micro_batch_size * DP
  int64_t train_iters = 0;              // required
  Precision precision = Precision::FP32;  // fp32 | bf16 | fp16
  Recompute recompute = Recompute::None;  // none | selective | full
  RecomputeModules recompute_modules;     // [core_attn] + any of moe_act, layernorm, moe
  uint64_t seed = 1234;
  Device device = Device::Auto;         // auto | cpu | cuda
  int cpu_threads = 0;                  // 0 = null: cores on this host / ranks on this host
  int nan_iteration_limit = 10;         // this many consecutive nan iterations stop the run (exit 1)
  // cuDNN's attention backward with its deterministic algorithm (bitwise reproducible; a B H T T
  // 16-bit workspace); false: dQ summed with atomics (an fp32 B H T D workspace, faster)
  bool deterministic = true;
  // FP8 (Megatron's names and defaults; docs/FP8.md): the transformer layers' linear GEMM inputs in FP8
  Fp8Format fp8_format = Fp8Format::None;     // null | e4m3 | hybrid (E4M3 forward, E5M2 gradients)
  Fp8Recipe fp8_recipe = Fp8Recipe::Delayed;  // delayed | tensorwise | blockwise
  int fp8_margin = 0;                         // scale = (fp8_max / amax) / 2^margin
  int fp8_amax_history_len = 1;               // delayed: amaxes kept per tensor
  std::string fp8_amax_compute_algo = "most_recent";  // delayed: max | most_recent of the history
  bool fp8_wgrad = true;                      // false: weight-gradient GEMMs in bf16
  // Megatron's fp8_param_gather: the FP8 layers' linear weights (attention's, the MLP's, the experts')
  // kept as FP8 codes with no 16-bit copy, cast from the distributed optimizer's master weights and
  // all-gathered as codes (docs/FP8.md "FP8 parameters")
  bool fp8_param_gather = false;
  bool first_last_layers_bf16 = false;        // the first / last layers' GEMMs in bf16
  int num_layers_at_start_in_bf16 = 1;
  int num_layers_at_end_in_bf16 = 1;
  // The global layers [first, second) of num_layers whose linear GEMMs run in FP8 (all but
  // first_last_layers_bf16's); FP8 itself is fp8_format's to say.
  std::pair<int64_t, int64_t> fp8_layer_range(int64_t num_layers) const {
    if (!first_last_layers_bf16) return {0, num_layers};
    return {num_layers_at_start_in_bf16, num_layers - num_layers_at_end_in_bf16};
  }
  // How many of the layers [begin, end) run in FP8 (0 without FP8).
  int64_t fp8_layers_in(int64_t num_layers, int64_t begin, int64_t end) const {
    if (fp8_format == Fp8Format::None) return 0;
    const auto [b, e] = fp8_layer_range(num_layers);
    return std::max<int64_t>(0, std::min(e, end) - std::max(b, begin));
  }
};

struct OptimizerConfig {
  double lr = 6.0e-4;
  double min_lr = 0.0;
  int64_t lr_warmup_iters = 0;
  LrDecayStyle lr_decay_style = LrDecayStyle::Cosine;  // cosine | linear | constant
  int64_t lr_decay_iters = 0;           // 0 = null: train_iters (resolved)
  double weight_decay = 0.1;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1.0e-8;
  double clip_grad = 1.0;               // 0 disables clipping
  double initial_loss_scale = 4294967296.0;
  // NeMo / Apex distributed Adam's store_param_remainders (bf16 only): the fp32 master weight held as
  // the bf16 compute copy plus a 16-bit remainder (core/dtype.h), 2 bytes instead of 4, exact
  bool store_param_remainders = false;
  // Megatron's precision-aware optimizer (--use-precision-aware-optimizer, Transformer Engine's
  // FusedAdam): the dtypes its states are stored in (fp32 without it). The Adam moments: bf16 a
  // rounding (nearest even) of the fp32 result, fp16 scaled per tensor (TE: absmax maps to
  // fp16_max / 2, over the whole tensor); docs/PLAN.md "Optimizer state dtypes". main_grads_dtype
  // bf16: the gradient buffer in bf16 (bf16_grads below). main_params_dtype fp16: the master weights
  // scaled per tensor likewise (not with store_param_remainders).
  bool use_precision_aware_optimizer = false;
  StateDType main_grads_dtype = StateDType::FP32;   // fp32 | bf16
  StateDType main_params_dtype = StateDType::FP32;  // fp32 | fp16
  StateDType exp_avg_dtype = StateDType::FP32;      // fp32 | bf16 | fp16
  StateDType exp_avg_sq_dtype = StateDType::FP32;   // fp32 | bf16 | fp16
};

// data.path / data.valid_path: one path (a Megatron prefix, an llm.c .bin shard or a glob of
// shards), or Megatron's blend [w1, prefix1, w2, prefix2, ...] (weights > 0; they need not sum to 1).
struct DataPath {
  std::vector<std::string> paths;  // one per blend component; empty = null
  std::vector<double> weights;     // as given; empty when the path was given as one string
  bool empty() const { return paths.empty(); }
  bool is_blend() const { return !weights.empty(); }
  std::string text() const;        // "prefix" or "[0.3, a, 0.7, b]", for messages
  bool operator==(const DataPath&) const = default;
};

struct DataConfig {
  DataPath path;                        // required
  bool eod_mask_loss = false;           // Megatron's --eod-mask-loss (data/doc_masks.h)
  bool reset_position_ids = false;      // Megatron's --reset-position-ids
  bool reset_attention_mask = false;    // Megatron's --reset-attention-mask: not supported (exit 2)
  int64_t eod_token_id = -1;            // default (-1, resolved): vocab_size - 1, the end of document of
                                        // both tokenizers (byte-level 256, GPT-2 BPE 50256)
  bool shuffle = true;
  std::vector<double> split = {969, 30, 1};  // train / valid / test weights, by documents
  DataPath valid_path;                  // empty = null
  int64_t eval_interval = 1000;
  int64_t eval_iters = 10;
};

struct CheckpointConfig {
  std::string save;                     // empty = null
  int64_t save_interval = 1000;
  std::string load;                     // empty = null
  int keep_last = 0;                    // 0 = null: keep all
  std::string exit_signal = "SIGTERM";
  double exit_duration_mins = 0;        // 0 = null
  bool async_save = false;              // write in the background (train/trainer_checkpoint.cpp)
};

struct LoggingConfig {
  int64_t log_interval = 1;
  std::string metrics_file;             // empty = null
  std::string trace_file;               // empty = null
  bool profile_ops = false;             // per-op time table after the run (core/op_profile.h)
  std::string tensorboard_dir;          // empty = null: no TensorBoard event file (train/tensorboard.h)
  bool log_timers_to_tensorboard = false;  // per-phase times of each logged iteration as scalars too
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainingConfig training;
  OptimizerConfig optimizer;
  DataConfig data;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
};

// Reads a YAML file, applies "section.key=value" overrides (values parsed as YAML scalars or flow
// sequences), checks every key/type/constraint that does not need the world size, and resolves the
// derived defaults (ffn_hidden_size, max_position_embeddings, lr_decay_iters). Throws InputError.
// path "-": the YAML text from standard input (read_config_stdin).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Standard input to its end, at most 16 MiB as a config file (InputError past that: /dev/zero;
// InputError "standard input is closed" after note_stdin_closed).
std::string read_config_stdin();
// Called by main when fd 0 was closed at start (checked before anything opens a file, which would
// take fd 0 and be read as the config): puts /dev/null on fd 0 and has read_config_stdin say so.
void note_stdin_closed();

// Same, from YAML text (source_name is used in error messages).
Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});

// The model section of a saved config (a checkpoint's meta.json config.model, as config_to_json wrote
// it) through the same table and the model's rules and derived values as a config file's; keys absent
// from older checkpoints take their defaults. InputError "<where>: model.<key>: ..." otherwise.
ModelConfig model_config_from_json(const nlohmann::json& model, const std::string& where);

// Checks that need the world size (TP*PP divides the world, a given DP matches, the expert grid,
// batch sizes divisible) and resolves data_parallel_size, global_batch_size and
// expert_tensor_parallel_size (null or a dense model: TP; an MoE config resolved again for another
// TP needs it null again, as data_parallel_size). Throws InputError.
void resolve_parallel(Config& cfg, int world_size);
// The Mixture-of-Experts layouts with TP > 1 resolve_parallel accepts (core/config_moe.cpp):
// sequence parallelism and ETP 1 (InputError otherwise).
void check_moe_parallel(const Config& cfg);

// What is wrong with data.split's weights (train, valid, test), or "" when they are 3 finite
// non-negative numbers with a positive sum: the one rule, for the config and for
// split_documents (data/dataset.h).
std::string split_weights_error(const std::vector<double>& weights);
// The run's sizes that are products of keys: its tokens (training.train_iters x global batch x
// model.seq_length) and an evaluation's (data.eval_iters x global batch x seq_length) stay below 2^62,
// so no sample position, token count or offset computed from them overflows an int64. "" or the
// error, with `key` set to the key it names; `global_batch` is training.global_batch_size, or its
// lower bound training.micro_batch_size while that is null.
std::string run_length_error(const Config& c, int64_t global_batch, std::string& key);

// The resolved config as YAML (for the log) and as JSON (for checkpoints/metrics).
std::string config_to_yaml(const Config& cfg);
nlohmann::json config_to_json(const Config& cfg);

// Whether the gradient buffer is bf16 (parallel.grad_reduce_in_bf16 or optimizer.main_grads_dtype: bf16,
// Megatron's two ways to ask for it; docs/ARCHITECTURE.md "Numerics"), else fp32.
bool bf16_grads(const Config& c);

// Whether FP8 parameters (training.fp8_param_gather) can be turned on for this config with the
// distributed optimizer: FP8 training, no optimizer.store_param_remainders, no fp16 optimizer state
// (resolve_fp8's rules; what `tptrain plan` suggests and `plan --search` tries).
bool fp8_param_gather_allowed(const Config& c);

// Padded vocabulary: vocab_size rounded up to a multiple of make_vocab_size_divisible_by * TP.
int padded_vocab_size(int vocab_size, int divisible_by, int tp);

}  // namespace tpt
