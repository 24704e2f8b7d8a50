// tptrain export --checkpoint DIR --output DIR
// A checkpoint of any layout -> Hugging Face GPT-2: model.safetensors (HF names without the
// "transformer." prefix, Conv1D weights [in, out], c_attn's columns q, k, v of all heads, the
// unpadded vocabulary) and config.json for transformers.GPT2LMHeadModel. The inverse of
// model/hf_gpt2.cpp (model.init_from). One process, no MPI launch.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "model/checkpoint_model.h"
#include "model/hf_gpt2.h"
#include "model/layers.h"
#include "parallel/checkpoint.h"

namespace tpt {

namespace {

// The model sizes of the checkpoint's resolved config.
struct Shape {
  int64_t L, C, H, F, P, V;
  double eps, init_std, hidden_dropout, attention_dropout;
};

Shape model_shape(const nlohmann::json& meta) {
  const ModelConfig m = checkpoint_model_config(meta);
  if (!is_gpt2_architecture(m))
    input_error("export: writes Hugging Face GPT-2 checkpoints; this checkpoint's model is " + describe_architecture(m) +
                ", which GPT-2 cannot hold (export of the LLaMA family is not supported yet)");
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

int export_hf(const std::string& ckpt, const std::string& out) {
  spdlog::set_pattern("%v");

  auto self = make_self_comm();
  LoadRequest req;
  req.dir = ckpt;
  req.verify_all_files = true;
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::open(*self, req);
  if (!reader) input_error("export: no checkpoint in " + ckpt);
  const Shape s = model_shape(reader->meta());
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
  // each of our tensors under its HF name (model/hf_gpt2.h); Conv1D weights as [in, out]: our 2-D
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

  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec || !std::filesystem::is_directory(out))
    input_error("export: cannot create directory '" + out + "': " + (ec ? ec.message() : "not a directory"));
  SafetensorsWriter w;
  int64_t params = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    w.add(names[i].first, names[i].second, data[i].data());
    params += int64_t(data[i].size());
  }
  w.set_metadata("format", "pt");  // transformers refuses safetensors files without it
  w.write(out + "/model.safetensors");

  const nlohmann::json config = hf_config(s, *reader);
  const std::string cfg_path = out + "/config.json";
  std::ofstream f(cfg_path);
  f << config.dump(2) << "\n";
  f.close();
  if (!f) input_error("export: cannot write " + cfg_path);
  spdlog::info("exported {} (iteration {}; {} layers, hidden {}, {} heads, vocab {}: {:.2f}M parameters) to {}/model.safetensors "
               "and {}",
               reader->path(), reader->iteration(), s.L, C, s.H, s.V, double(params) / 1e6, out, cfg_path);
  return 0;
}

}  // namespace

Command add_export_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("export", "a checkpoint of any layout -> Hugging Face GPT-2 (model.safetensors "
                                               "+ config.json)");
  auto dirs = std::make_shared<std::pair<std::string, std::string>>();
  cmd->add_option("--checkpoint", dirs->first, "a checkpoint.save directory (its latest complete checkpoint) or one "
                                               "iter_N directory")
      ->required()->type_name("DIR");
  cmd->add_option("--output", dirs->second, "receives model.safetensors and config.json (Hugging Face GPT-2, fp32)")
      ->required()->type_name("DIR");
  return [dirs] { return export_hf(dirs->first, dirs->second); };
}

}  // namespace tpt
