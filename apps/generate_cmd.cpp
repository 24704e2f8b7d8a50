// tptrain generate --checkpoint DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K]
//                  [--seed S] [--vocab-file vocab.json --merge-file merges.txt]
// Text from a checkpoint of any layout, in one process (no MPI launch): the model is read into the
// TP = 1, PP = 1 layout (model/inference.h), the prompt runs in one forward pass, then each new
// token runs alone against the KV cache. stdout gets exactly the prompt and the continuation;
// everything else goes to stderr.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/commands.h"
#include "core/error.h"
#include "core/ops.h"
#include "data/bpe_tokenizer.h"
#include "data/tokenizer.h"
#include "model/inference.h"

namespace tpt {

namespace {

const char* kUsage =
    "usage: tptrain generate --checkpoint DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K]\n"
    "                        [--seed S] [--vocab-file vocab.json --merge-file merges.txt]\n"
    "  --checkpoint DIR    a checkpoint.save directory (its latest complete checkpoint) or one iter_N directory,\n"
    "                      saved on any TP x PP x DP layout\n"
    "  --prompt TEXT       the text to continue (empty: start from the end-of-document token)\n"
    "  --max-new-tokens N  tokens to generate at most (default 128); generation also stops at the end-of-document\n"
    "                      token and when the text fills the model's max_position_embeddings\n"
    "  --temperature T     0: greedy (the most likely token; ties to the lowest id); > 0: sample from\n"
    "                      softmax(logits / T) (default 1.0)\n"
    "  --top-k K           sample among the K most likely tokens only (default 0: all)\n"
    "  --seed S            seed of the sampling (default 1234): the same seed and prompt give the same text\n"
    "  --vocab-file F --merge-file F\n"
    "                      GPT-2 BPE (Hugging Face's vocab.json and merges.txt) instead of the byte-level\n"
    "                      tokenizer (bytes 0..255, end of document 256: vocab_size 257)\n"
    "  --threads N         CPU threads (default: all cores)\n"
    "Prints the prompt and its continuation to stdout; the checkpoint, token counts and speed to stderr.\n";

struct Options {
  std::string checkpoint, prompt, vocab_file, merge_file;
  bool has_prompt = false;
  int64_t max_new_tokens = 128;
  double temperature = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 1234;
  int threads = 0;
};

int64_t parse_int(const std::string& flag, const std::string& v, int64_t min) {
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || x < min)
    input_error("generate: " + flag + " needs an integer >= " + std::to_string(min) + ", got '" + v + "'");
  return x;
}

double parse_double(const std::string& flag, const std::string& v) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || !(x >= 0) || x > 1e6)
    input_error("generate: " + flag + " needs a number >= 0, got '" + v + "'");
  return x;
}

Options parse(int argc, char** argv, bool& help) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], inline_value;
    const bool has_inline = a.rfind("--", 0) == 0 && a.find('=') != std::string::npos;
    if (has_inline) inline_value = a.substr(a.find('=') + 1), a = a.substr(0, a.find('='));
    auto value = [&]() -> std::string {
      if (has_inline) return inline_value;
      if (i + 1 >= argc) input_error("generate: " + a + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      help = true;
      return o;
    }
    if (a == "--checkpoint") o.checkpoint = value();
    else if (a == "--prompt") o.prompt = value(), o.has_prompt = true;
    else if (a == "--max-new-tokens") o.max_new_tokens = parse_int(a, value(), 0);
    else if (a == "--temperature") o.temperature = parse_double(a, value());
    else if (a == "--top-k") o.top_k = parse_int(a, value(), 0);
    else if (a == "--seed") o.seed = uint64_t(parse_int(a, value(), 0));
    else if (a == "--vocab-file") o.vocab_file = value();
    else if (a == "--merge-file") o.merge_file = value();
    else if (a == "--threads") o.threads = int(parse_int(a, value(), 1));
    else input_error("generate: unknown argument '" + std::string(argv[i]) + "'\n" + kUsage);
  }
  if (o.checkpoint.empty() || !o.has_prompt)
    input_error(std::string("generate: --checkpoint and --prompt are required\n") + kUsage);
  if (o.vocab_file.empty() != o.merge_file.empty())
    input_error("generate: --vocab-file and --merge-file go together (GPT-2 BPE needs both)");
  return o;
}

// The byte-level tokenizer or GPT-2 BPE behind one face.
struct TextCodec {
  std::optional<BpeTokenizer> bpe;
  std::vector<int32_t> encode(const std::string& s) const { return bpe ? bpe->encode(s) : ByteTokenizer::encode(s); }
  std::string decode(std::span<const int32_t> t) const { return bpe ? bpe->decode(t) : ByteTokenizer::decode(t); }
  int32_t vocab_size() const { return bpe ? bpe->vocab_size() : ByteTokenizer::kVocabSize; }
  int32_t eod() const { return bpe ? bpe->eod() : ByteTokenizer::kEod; }
  std::string name() const { return bpe ? "GPT-2 BPE" : "byte-level"; }
};

}  // namespace

int generate_main(int argc, char** argv) {
  bool help = false;
  const Options opt = parse(argc, argv, help);
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  // stdout carries only the text: log lines (and the checkpoint reader's warnings) go to stderr
  spdlog::set_default_logger(spdlog::stderr_logger_mt("generate"));
  spdlog::set_pattern("%v");

  TextCodec codec;
  if (!opt.vocab_file.empty()) codec.bpe.emplace(opt.vocab_file, opt.merge_file);

  const auto t_load = std::chrono::steady_clock::now();
  InferenceWeights w = load_inference_weights(opt.checkpoint);
  const int64_t V = w.model.vocab_size, P = w.model.max_position_embeddings;
  if (!codec.bpe && V != ByteTokenizer::kVocabSize)
    input_error("generate: " + w.path + " has vocab_size " + std::to_string(V) +
                "; the byte-level tokenizer needs 257 (bytes + end of document). For a GPT-2 BPE model pass "
                "--vocab-file vocab.json --merge-file merges.txt");
  if (codec.bpe && codec.vocab_size() > V)
    input_error("generate: the tokenizer's vocabulary (" + std::to_string(codec.vocab_size()) +
                " ids) is larger than the model's vocab_size " + std::to_string(V) + " in " + w.path);
  const int threads = opt.threads > 0 ? opt.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  std::unique_ptr<Ops> ops = make_cpu_ops(threads);
  GPTInference model(w.dims, w.layout, *ops, w.params.data());
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  spdlog::info("generate: {} (iteration {}, saved on TP {} x PP {} x DP {}): {} layers, hidden {}, {} heads, vocab {}, "
               "{} positions; loaded in {:.2f} s; {} tokenizer; {}",
               w.path, w.iteration, w.grid.value("tensor_model_parallel_size", 0),
               w.grid.value("pipeline_model_parallel_size", 0), w.grid.value("data_parallel_size", 0), w.model.num_layers,
               w.model.hidden_size, w.model.num_attention_heads, V, P, load_s, codec.name(),
               opt.temperature <= 0 ? std::string("greedy")
                                    : fmt::format("temperature {}, top-k {}, seed {}", opt.temperature, opt.top_k,
                                                  opt.seed));

  // The context: the prompt's tokens, or the end-of-document token alone for an empty prompt
  // (GPT-2's convention for unconditional text).
  std::vector<int32_t> context = codec.encode(opt.prompt);
  if (context.empty()) {
    if (codec.eod() < 0) input_error("generate: an empty --prompt needs an <|endoftext|> token in the vocabulary");
    context.push_back(codec.eod());
  }
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
    if (next == codec.eod()) {
      stop = "end-of-document token";
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

}  // namespace tpt
