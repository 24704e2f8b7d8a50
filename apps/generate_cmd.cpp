// tptrain generate (options: add_generate_command below, tptrain generate --help).
// Text from a checkpoint of any layout, in one process (no MPI launch): the model is read into the
// TP = 1, PP = 1 layout (model/inference.h), the prompt runs in one forward pass, then each new
// token runs alone against the KV cache. stdout gets exactly the prompt and the continuation;
// everything else goes to stderr.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/ops.h"
#include "data/tokenizer.h"
#include "model/inference.h"
#include "parallel/checkpoint.h"

namespace tpt {

namespace {

struct Options {
  std::string checkpoint, prompt;
  TokenizerFiles files;
  int64_t max_new_tokens = 128;
  double temperature = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 1234;
  int threads = 0;
};

int generate(const Options& opt) {
  // stdout carries only the text: log lines (and the checkpoint reader's warnings) go to stderr
  spdlog::set_default_logger(spdlog::stderr_logger_mt("generate"));
  spdlog::set_pattern("%v");

  const Tokenizer codec(opt.files);  // byte-level, GPT-2 BPE (--vocab-file), Llama 3 or Qwen (--tokenizer-model/-file)

  const auto t_load = std::chrono::steady_clock::now();
  InferenceWeights w = load_inference_weights(opt.checkpoint);
  const int64_t V = w.model.vocab_size, P = w.model.max_position_embeddings;
  if (codec.is_byte_level() && V != ByteTokenizer::kVocabSize)
    input_error("generate: " + w.path + " has vocab_size " + std::to_string(V) +
                "; the byte-level tokenizer needs 257 (bytes + end of document). For a GPT-2 BPE model pass "
                "--vocab-file vocab.json --merge-file merges.txt, for Llama 3 --tokenizer-model tokenizer.model or "
                "--tokenizer-file tokenizer.json, for Qwen --tokenizer-file tokenizer.json");
  if (!codec.is_byte_level() && codec.vocab_size() > V)
    input_error("generate: the " + codec.name() + " tokenizer's vocabulary (" + std::to_string(codec.vocab_size()) +
                " ids) is larger than the model's vocab_size " + std::to_string(V) + " in " + w.path +
                ": its token ids up to " + std::to_string(codec.vocab_size() - 1) +
                " would be >= the model's vocabulary (a tokenizer of another model?)");
  const int threads = opt.threads > 0 ? opt.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  std::unique_ptr<Ops> ops = make_cpu_ops(threads);
  GPTInference model(w.dims, w.layout, *ops, w.params.data(), w.expert_bias);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  spdlog::info("generate: {} (iteration {}, saved on {}): {} layers, hidden {}, {} heads, vocab {}, "
               "{} positions; loaded in {:.2f} s; {} tokenizer; {}",
               w.path, w.iteration, describe_saved_grid(w.grid), w.model.num_layers,
               w.model.hidden_size, w.model.num_attention_heads, V, P, load_s, codec.name(),
               opt.temperature <= 0 ? std::string("greedy")
                                    : fmt::format("temperature {}, top-k {}, seed {}", opt.temperature, opt.top_k,
                                                  opt.seed));

  // The context: the tokenizer's prefix (Llama 3: <|begin_of_text|>) and the prompt's tokens; for an
  // empty prompt without a prefix, the end-of-document token alone (GPT-2's convention for
  // unconditional text).
  std::vector<int32_t> context = codec.prefix();
  codec.encode(opt.prompt, context);
  if (context.empty()) {
    if (codec.eod() < 0) input_error("generate: an empty --prompt needs an <|endoftext|> token in the vocabulary");
    context.push_back(codec.eod());
  }
  for (size_t i = 0; i < context.size(); ++i)
    if (context[i] < 0 || context[i] >= V)
      input_error("generate: token " + std::to_string(context[i]) + " (position " + std::to_string(i) +
                  " of the prompt) is >= the model's vocab_size " + std::to_string(V) + " in " + w.path);
  if (int64_t(context.size()) > P)
    input_error("generate: the prompt has " + std::to_string(context.size()) +
                " tokens; the model's max_position_embeddings is " + std::to_string(P));
  std::fputs(opt.prompt.c_str(), stdout);
  std::fflush(stdout);

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits;
  model.forward(context, logits);  // the prompt in one pass: logits of its last position
  int64_t produced = 0;
  std::string stop = "--max-new-tokens " + std::to_string(opt.max_new_tokens) + " reached";
  while (produced < opt.max_new_tokens) {
    const int32_t next = sample_token(logits, opt.temperature, opt.top_k, opt.seed, uint64_t(produced));
    if (codec.is_stop(next)) {
      stop = next == codec.eod() ? "end-of-document token" : "stop token " + std::to_string(next);
      break;
    }
    ++produced;
    const std::string piece = codec.decode(std::span<const int32_t>(&next, 1));
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (produced == opt.max_new_tokens) break;
    if (model.length() >= P) {
      stop = "the text fills max_position_embeddings (" + std::to_string(P) + " tokens)";
      break;
    }
    model.forward(std::span<const int32_t>(&next, 1), logits);  // one position, against the KV cache
  }
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("generate: prompt {} tokens, {} new tokens in {:.2f} s ({:.1f} tokens/s); stopped: {}", context.size(),
               produced, s, double(produced) / std::max(s, 1e-9), stop);
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("generate", "text from a checkpoint of any layout (one process, KV cache; "
                                                 "temperature 0 = greedy)");
  cmd->footer("Prints the prompt and its continuation to stdout; the checkpoint, token counts and speed to stderr.");
  auto o = std::make_shared<Options>();
  cmd->add_option("--checkpoint", o->checkpoint, "a checkpoint.save directory (its latest complete checkpoint) or "
                                                 "one iter_N directory, saved on any TP x PP x DP layout")
      ->required()->type_name("DIR");
  cmd->add_option("--prompt", o->prompt, "the text to continue (empty: start from the end-of-document token)")
      ->required()->type_name("TEXT");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate at most (>= 0); generation also stops at the "
                                                         "end-of-document token and when the text fills the "
                                                         "model's max_position_embeddings")
      ->check(integer_at_least(0))->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0: greedy (the most likely token; ties to the lowest id); "
                                                   "> 0 (up to 1e6): sample from softmax(logits / T)")
      ->check(number_in(0, 1e6, false))->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "sample among the K most likely tokens only (0: all; >= 0)")
      ->check(integer_at_least(0))->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the sampling (>= 0): the same seed and prompt give the same text")
      ->check(integer_at_least(0))->capture_default_str();
  add_bpe_options(*cmd, o->files.vocab_file, o->files.merge_file);
  CLI::Option* model = cmd->add_option("--tokenizer-model", o->files.tokenizer_model,
                                       "Llama 3's tokenizer: tiktoken's tokenizer.model (the prompt starts with "
                                       "<|begin_of_text|>)")
                           ->type_name("tokenizer.model");
  CLI::Option* file = cmd->add_option("--tokenizer-file", o->files.tokenizer_file,
                                      "Hugging Face's tokenizer.json of Llama 3, Qwen2 / Qwen3 or GPT-2 (the family told "
                                      "from its pre-tokenizer regex and normalizer)")
                          ->type_name("tokenizer.json");
  model->excludes(file)->excludes("--vocab-file");
  file->excludes("--vocab-file");
  cmd->add_option("--threads", o->threads, "CPU threads (1 to 4096, as training.cpu_threads; default: all cores)")
      ->check(integer_in(1, 4096));
  return [o] { return generate(*o); };
}

}  // namespace tpt
