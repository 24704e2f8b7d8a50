// tptrain export --checkpoint DIR --output DIR [--dtype bf16|fp16|fp32] [--max-shard-size 5GB]
// A checkpoint of any layout -> Hugging Face, by its model config:
//  - GPT-2: model.safetensors (HF names without the "transformer." prefix, Conv1D weights [in, out],
//    c_attn's columns q, k, v of all heads, the unpadded vocabulary) and config.json for
//    transformers.GPT2LMHeadModel; the inverse of interop/hf/gpt2.cpp. fp32 unless --dtype says otherwise.
//  - the LLaMA family (interop/hf/llama.h): config.json for transformers.LlamaForCausalLM and
//    model.safetensors, or model-0000i-of-0000n.safetensors + model.safetensors.index.json past
//    --max-shard-size (HF's rule: a shard takes tensors while they fit; a larger tensor gets its own),
//    in --dtype (default: the run's training.precision); the inverse of the Llama import.
// One process, no MPI launch; the Llama export holds one shard's tensors at a time.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "interop/hf/gpt2.h"
#include "interop/hf/llama.h"
#include "model/checkpoint_model.h"
#include "model/layers.h"
#include "parallel/checkpoint.h"

namespace tpt {

namespace {

// The model sizes of the checkpoint's resolved config.
struct Shape {
  int64_t L, C, H, F, P, V;
  double eps, init_std, hidden_dropout, attention_dropout;
};

Shape model_shape(const ModelConfig& m) {
  return {m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_hidden_size, m.max_position_embeddings,
          m.vocab_size, m.layernorm_epsilon, m.init_method_std, m.hidden_dropout, m.attention_dropout};
}

// out (cols, rows) = in (rows, cols)^T
std::vector<float> transpose(const std::vector<float>& in, int64_t rows, int64_t cols) {
  std::vector<float> out(in.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(c * rows + r)] = in[size_t(r * cols + c)];
  return out;
}

// config.json for transformers.GPT2LMHeadModel.
nlohmann::json hf_config(const Shape& s, const CheckpointReader& reader) {
  return {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", s.V},
      {"n_positions", s.P},
      {"n_ctx", s.P},
      {"n_embd", s.C},
      {"n_layer", s.L},
      {"n_head", s.H},
      {"n_inner", s.F},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", s.eps},
      {"initializer_range", s.init_std},
      {"resid_pdrop", s.hidden_dropout},
      {"embd_pdrop", s.hidden_dropout},
      {"attn_pdrop", s.attention_dropout},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"summary_type", "cls_index"},
      {"summary_use_proj", true},
      {"summary_activation", nullptr},
      {"summary_proj_to_labels", true},
      {"summary_first_dropout", 0.1},
      {"use_cache", true},
      {"bos_token_id", s.V - 1},
      {"eos_token_id", s.V - 1},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
      {"tptrain_checkpoint", {{"path", reader.path()}, {"iteration", reader.iteration()}}}};
}

struct ExportOptions {
  std::string checkpoint, output, dtype, max_shard_size;
};

void make_output_dir(const std::string& out) {
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec || !std::filesystem::is_directory(out))
    input_error("export: cannot create directory '" + out + "': " + (ec ? ec.message() : "not a directory"));
}

void write_config(const std::string& path, const nlohmann::json& config) {
  std::ofstream f(path);
  f << config.dump(2) << "\n";
  f.close();
  if (!f) input_error("export: cannot write " + path);
}

DType parse_dtype(const std::string& text) {
  if (text == "fp32") return DType::F32;
  if (text == "bf16") return DType::BF16;
  if (text == "fp16") return DType::F16;
  input_error("export: --dtype must be bf16, fp16 or fp32, got '" + text + "'");
}

int export_gpt2(const ModelConfig& m, CheckpointReader* reader, const ExportOptions& o) {
  if (!o.max_shard_size.empty())
    input_error("export: --max-shard-size is for Llama checkpoints; GPT-2 is written as one model.safetensors");
  const DType dtype = o.dtype.empty() ? DType::F32 : parse_dtype(o.dtype);
  const std::string& out = o.output;
  const Shape s = model_shape(m);
  const int64_t C = s.C, F = s.F;

  // A whole global tensor of the checkpoint, checked against the expected shape.
  auto full = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return read_whole_tensor(*reader, name, shape, "export");
  };

  std::vector<std::pair<std::string, std::vector<int64_t>>> names;
  std::vector<std::vector<float>> data;
  auto put = [&](const std::string& hf, std::vector<int64_t> shape, std::vector<float> v) {
    names.emplace_back(hf, std::move(shape));
    data.push_back(std::move(v));
  };
  // each of our tensors under its HF name (interop/hf/gpt2.h); Conv1D weights as [in, out]: our 2-D
  // view (rows, cols) transposed (qkv (3, C, C) is the (3C, C) matrix: c_attn's columns q, k, v);
  // biases 1-D
  auto put_ours = [&](const std::string& ours, const std::vector<int64_t>& shape) {
    const HFTensor hf = hf_gpt2_name(ours);
    std::vector<float> v = full(ours, shape);
    const int64_t n = int64_t(v.size()), cols = shape.back(), rows = n / cols;
    if (hf.conv1d) put(hf.name, {cols, rows}, transpose(v, rows, cols));
    else put(hf.name, ours.ends_with(".bias") ? std::vector<int64_t>{n} : shape, std::move(v));
  };
  put_ours("wte.weight", {s.V, C});
  put_ours("wpe.weight", {s.P, C});
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    const std::pair<const char*, std::vector<int64_t>> tensors[] = {
        {"ln_1.weight", {C}},       {"ln_1.bias", {C}},        {"attn.qkv.weight", {3, C, C}}, {"attn.qkv.bias", {3, C}},
        {"attn.proj.weight", {C, C}}, {"attn.proj.bias", {C}}, {"ln_2.weight", {C}},          {"ln_2.bias", {C}},
        {"mlp.fc1.weight", {F, C}}, {"mlp.fc1.bias", {F}},     {"mlp.fc2.weight", {C, F}},    {"mlp.fc2.bias", {C}}};
    for (const auto& [name, shape] : tensors) put_ours(h + name, shape);
  }
  put_ours("ln_f.weight", {C});
  put_ours("ln_f.bias", {C});

  make_output_dir(out);
  SafetensorsWriter w;
  int64_t params = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    w.add(names[i].first, names[i].second, data[i].data(), dtype);
    params += int64_t(data[i].size());
  }
  w.set_metadata("format", "pt");  // transformers refuses safetensors files without it
  w.write(out + "/model.safetensors");

  nlohmann::json config = hf_config(s, *reader);
  config["torch_dtype"] = dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32";
  const std::string cfg_path = out + "/config.json";
  write_config(cfg_path, config);
  spdlog::info("exported {} (iteration {}; {} layers, hidden {}, {} heads, vocab {}: {:.2f}M parameters) to {}/model.safetensors "
               "and {}",
               reader->path(), reader->iteration(), s.L, C, s.H, s.V, double(params) / 1e6, out, cfg_path);
  return 0;
}

// HF's shard file names: model.safetensors alone, else model-00001-of-00003.safetensors ...
std::string shard_name(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[96];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

bool is_hf_weights_file(const std::string& name) {
  if (name == "model.safetensors" || name == "model.safetensors.index.json") return true;
  unsigned a = 0, b = 0;
  char tail[32] = {0};
  return name.size() == std::string("model-00001-of-00001.safetensors").size() &&
         std::sscanf(name.c_str(), "model-%5u-of-%5u.%12s", &a, &b, tail) == 3 && std::string(tail) == "safetensors";
}

// The export's files (shards, index, config.json) written into `dir`, their names appended to
// `written`; returns config.json.
nlohmann::json write_llama_files(const ModelConfig& m, const nlohmann::json& rc, CheckpointReader* reader, DType dtype,
                                 const std::vector<std::vector<size_t>>& shards,
                                 const std::vector<HFLlamaTensor>& tensors, int64_t total, const std::string& dir,
                                 std::vector<std::string>& written) {
  // our whole global tensors, the last one kept (q, k, v_proj come from one qkv; gate, up from one fc1)
  std::string cached_name;
  std::vector<float> cached;
  const std::function<const std::vector<float>&(const std::string&)> read = [&](const std::string& ours)
      -> const std::vector<float>& {
    if (ours != cached_name) {
      cached_name.clear();
      cached = read_whole_tensor(*reader, ours, llama_global_shape(m, ours), "export");
      cached_name = ours;
    }
    return cached;
  };
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    std::vector<std::vector<float>> data;
    data.reserve(shards[s].size());
    SafetensorsWriter w;
    for (size_t i : shards[s]) {
      const HFLlamaTensor& t = tensors[i];
      data.push_back(t.make(read));
      TPT_CHECK(int64_t(data.back().size()) == t.numel());
      w.add(t.name, t.shape, data.back().data(), dtype);
      weight_map[t.name] = shard_name(s, shards.size());
    }
    w.set_metadata("format", "pt");  // transformers refuses safetensors files without it
    w.write(dir + "/" + shard_name(s, shards.size()));
    written.push_back(shard_name(s, shards.size()));
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_config(dir + "/model.safetensors.index.json", index);
    written.push_back("model.safetensors.index.json");
  }

  nlohmann::json config = hf_llama_config(m, dtype);
  const nlohmann::json eod = rc.contains("data") ? rc["data"].value("eod_token_id", nlohmann::json()) : nlohmann::json();
  if (eod.is_number_integer()) config["eos_token_id"] = eod;
  config["tptrain_checkpoint"] = {{"path", reader->path()}, {"iteration", reader->iteration()}};
  write_config(dir + "/config.json", config);
  written.push_back("config.json");
  return config;
}

int export_llama(const ModelConfig& m, CheckpointReader* reader, const ExportOptions& o) {
  const nlohmann::json& rc = reader->meta().at("config");
  // default dtype: the precision the run trained in (its compute dtype; fp32 runs keep full precision)
  std::string dtype_text = o.dtype;
  if (dtype_text.empty()) dtype_text = rc.at("training").value("precision", std::string("fp32"));
  const DType dtype = parse_dtype(dtype_text);
  const int64_t limit = parse_byte_size(o.max_shard_size.empty() ? "5GB" : o.max_shard_size);
  const std::vector<HFLlamaTensor> tensors = hf_llama_tensors(m);

  // shards: each takes tensors while they fit in the limit (a tensor larger than it: a shard alone)
  std::vector<std::vector<size_t>> shards;
  int64_t in_shard = 0, total = 0, params = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t bytes = tensors[i].numel() * dtype_bytes(dtype);
    if (shards.empty() || (in_shard > 0 && in_shard + bytes > limit)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
    total += bytes;
    params += tensors[i].numel();
  }

  const std::string& out = o.output;
  make_output_dir(out);
  // Every file goes to a staging folder first and into `out` only once all are written: a tensor that
  // cannot be written (an overflow in a narrower dtype, a full disk) leaves `out` as it was.
  const std::string stage = out + "/.tptrain-export.partial";
  std::error_code ec;
  std::filesystem::remove_all(stage, ec);
  make_output_dir(stage);
  std::vector<std::string> written;  // file names, in `stage`
  nlohmann::json config;
  try {
    config = write_llama_files(m, rc, reader, dtype, shards, tensors, total, stage, written);
  } catch (...) {
    std::filesystem::remove_all(stage, ec);
    throw;
  }
  // weights of an earlier export in the same directory would be mixed up with these: removed
  const std::set<std::string> names(written.begin(), written.end());
  for (const auto& e : std::filesystem::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    if (is_hf_weights_file(n) && !names.count(n) && e.is_regular_file()) std::filesystem::remove(e.path(), ec);
  }
  for (const std::string& n : written) {
    std::filesystem::rename(stage + "/" + n, out + "/" + n, ec);
    if (ec) input_error("export: cannot move " + stage + "/" + n + " to " + out + ": " + ec.message());
  }
  std::filesystem::remove_all(stage, ec);
  const std::string cfg_path = out + "/config.json";
  spdlog::info("exported {} (iteration {}; {}: {} layers, hidden {}, {} heads / {} KV groups, vocab {}: {:.2f}M "
               "parameters, {}) to {}: {} ({:.1f} MB){} and {}",
               reader->path(), reader->iteration(), config["architectures"][0].get<std::string>(), m.num_layers, m.hidden_size, m.num_attention_heads,
               m.group_query_attention ? m.num_query_groups : m.num_attention_heads, m.vocab_size, double(params) / 1e6,
               safetensors_dtype_name(dtype), out,
               shards.size() == 1 ? std::string("model.safetensors") : std::to_string(shards.size()) + " shards",
               double(total) / 1e6, shards.size() == 1 ? "" : " + model.safetensors.index.json", cfg_path);
  return 0;
}

int export_hf(const ExportOptions& o) {
  spdlog::set_pattern("%v");
  if (!o.dtype.empty()) parse_dtype(o.dtype);
  if (!o.max_shard_size.empty()) parse_byte_size(o.max_shard_size);
  auto self = make_self_comm();
  LoadRequest req;
  req.dir = o.checkpoint;
  // the model shards of the newest checkpoint: every file holding a parameter (the optimizer's
  // moments are not exported: a damaged optimizer shard is a warning, not an older iteration)
  req.needs_tensor = [](const std::string& name) { return !name.starts_with("optimizer."); };
  req.warn_other_files = true;
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::open(*self, req);
  if (!reader) input_error("export: no checkpoint in " + o.checkpoint);
  const ModelConfig m = checkpoint_model_config(reader->meta());
  if (m.moe_router_enable_expert_bias)  // its bias is a routing input HF's MoE blocks do not have
    input_error("export: this checkpoint's MoE model routes with an expert bias (model.moe_router_enable_expert_bias), "
                "which Hugging Face Mixtral / Qwen-MoE cannot hold; tptrain generate runs it");
  if (is_gpt2_architecture(m) && !m.is_moe()) return export_gpt2(m, reader.get(), o);
  const std::string why = hf_llama_incompatibility(m);
  if (!why.empty())
    input_error("export: this checkpoint's model is " + describe_architecture(m) +
                (m.is_moe() ? " with " + std::to_string(m.num_moe_experts) + " experts" : std::string()) +
                ", which neither Hugging Face GPT-2, Llama, Mixtral, Qwen2-MoE nor Qwen3-MoE can hold: " + why);
  return export_llama(m, reader.get(), o);
}

}  // namespace

Command add_export_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("export", "a checkpoint of any layout -> Hugging Face GPT-2, Llama, Mixtral, Qwen2-MoE or Qwen3-MoE "
                                               "(model.safetensors or shards + index, config.json)");
  auto o = std::make_shared<ExportOptions>();
  cmd->add_option("--checkpoint", o->checkpoint, "a checkpoint.save directory (its latest complete checkpoint) or one "
                                                 "iter_N directory")
      ->required()->type_name("DIR");
  cmd->add_option("--output", o->output, "receives config.json and model.safetensors (or Llama shards and "
                                         "model.safetensors.index.json)")
      ->required()->type_name("DIR");
  cmd->add_option("--dtype", o->dtype, "stored dtype: bf16, fp16 or fp32 (default: fp32 for GPT-2; for Llama the "
                                       "run's training.precision)")
      ->type_name("bf16|fp16|fp32");
  cmd->add_option("--max-shard-size", o->max_shard_size, "Llama / MoE: split model.safetensors into shards of at most this "
                                                         "size, as Hugging Face (default 5GB; bytes, kB/MB/GB, KiB/MiB/GiB)")
      ->type_name("SIZE");
  return [o] { return export_hf(*o); };
}

}  // namespace tpt
