// tptrain preprocess: text / JSON lines -> Megatron .bin/.idx with the byte-level tokenizer, GPT-2
// BPE, Llama 3's or Qwen's tokenizer (docs/ARCHITECTURE.md "Command line and exit status"). One sequence
// per document; uint16 tokens below 65500 ids, int32 from there (Megatron's DType.optimal_dtype).
// Documents are tokenized on --workers threads, a batch at a time, and written in input order: the
// output is the same whatever the thread count.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/file_rules.h"
#include "data/indexed_writer.h"
#include "data/megatron_format.h"
#include "data/text_documents.h"
#include "data/tokenizer.h"

namespace tpt {
namespace {

struct Options {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string json_key = "text";
  TokenizerFiles files;
  std::string tokenizer_type;
  bool append_eod = false;
  int64_t workers = 0;
};

// What the options cannot say alone.
void check(const Options& o) {
  if (o.json_key.empty()) input_error("preprocess: --json-key must not be empty");
  const std::string& t = o.tokenizer_type;
  const TokenizerFiles& f = o.files;
  if (t == "GPT2BPETokenizer" && f.vocab_file.empty())
    input_error("preprocess: --tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file");
  if (t == "ByteLevel" && (!f.vocab_file.empty() || !f.tokenizer_model.empty() || !f.tokenizer_file.empty()))
    input_error("preprocess: --tokenizer-type ByteLevel takes no --vocab-file / --merge-file / --tokenizer-model / "
                "--tokenizer-file");
  if (t == "TikTokenizer" && f.tokenizer_model.empty())
    input_error("preprocess: --tokenizer-type TikTokenizer needs --tokenizer-model (tiktoken's tokenizer.model)");
  if (t == "HuggingFaceTokenizer" && f.tokenizer_file.empty() && f.tokenizer_model.empty())
    input_error("preprocess: --tokenizer-type HuggingFaceTokenizer needs --tokenizer-file (tokenizer.json) or "
                "--tokenizer-model (tokenizer.model)");
  for (const std::string& in : o.inputs)  // fail before writing anything
    check_regular_file(in, "preprocess: --input");
}

// Tokenizes docs[i] into tokens[i] on `threads` threads; an error is the first failing document's.
void encode_batch(const Tokenizer& tokenizer, bool append_eod, int threads, const std::vector<std::string>& docs,
                  std::vector<std::vector<int32_t>>& tokens) {
  const int64_t n = int64_t(docs.size());
  tokens.resize(docs.size());
  std::vector<std::exception_ptr> errors(docs.size());
#pragma omp parallel for num_threads(threads) schedule(dynamic, 16)
  for (int64_t i = 0; i < n; ++i) {
    try {
      tokens[size_t(i)].clear();
      tokenizer.encode_document(docs[size_t(i)], append_eod, tokens[size_t(i)]);
    } catch (...) {
      errors[size_t(i)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

int preprocess(const Options& opt) {
  check(opt);
  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tokenizer(opt.files);
  const int32_t vocab = tokenizer.vocab_size(), eod = tokenizer.eod();
  if (opt.append_eod && eod < 0)
    input_error("preprocess: --append-eod, but the tokenizer has no end-of-document token (<|endoftext|> or "
                "<|end_of_text|>)");
  const int dtype = vocab < 65500 ? megatron::kU16 : megatron::kI32;  // Megatron's DType.optimal_dtype
  const int threads =
      opt.workers > 0 ? int(std::min<int64_t>(opt.workers, 4096)) : int(std::max(1u, std::thread::hardware_concurrency()));
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  IndexedDatasetWriter writer(opt.output_prefix, dtype);
  std::vector<std::string> batch;
  std::vector<std::vector<int32_t>> tokens;
  size_t batch_bytes = 0;
  int64_t text_bytes = 0;
  auto flush = [&] {
    encode_batch(tokenizer, opt.append_eod, threads, batch, tokens);
    for (size_t i = 0; i < batch.size(); ++i) writer.add_document(tokens[i]);
    batch.clear();
    batch_bytes = 0;
  };
  const auto t1 = std::chrono::steady_clock::now();
  for (const std::string& in : opt.inputs) {
    const int64_t docs = read_documents(in, opt.json_key, [&](std::string_view text) {
      batch.emplace_back(text);
      batch_bytes += text.size();
      text_bytes += int64_t(text.size());
      if (batch_bytes >= (size_t(16) << 20) || batch.size() >= 65536) flush();
    });
    std::printf("preprocess: %s: %lld documents\n", in.c_str(), static_cast<long long>(docs));
  }
  flush();
  writer.finish();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::printf("preprocess: tokenizer %s loaded in %.2f s; %.2f MB of text in %.2f s on %d thread%s: %.2f MB/s, "
              "%.2f MB/s per thread\n",
              tokenizer.name().c_str(), load_s, double(text_bytes) / 1e6, s, threads, threads == 1 ? "" : "s",
              double(text_bytes) / 1e6 / std::max(s, 1e-9), double(text_bytes) / 1e6 / std::max(s, 1e-9) / threads);
  std::string extras;
  if (!tokenizer.prefix().empty()) {
    extras += ", ";
    for (size_t i = 0; i < tokenizer.prefix().size(); ++i) extras += (i ? " " : "") + std::to_string(tokenizer.prefix()[i]);
    extras += " before each document";
  }
  if (opt.append_eod) extras += ", EOD " + std::to_string(eod) + " after each document";
  std::printf("preprocess: wrote %s.bin and %s.idx: %lld documents, %lld tokens (%s, %s, vocab_size %d%s)\n",
              opt.output_prefix.c_str(), opt.output_prefix.c_str(), static_cast<long long>(writer.num_documents()),
              static_cast<long long>(writer.num_tokens()), megatron::dtype_name(dtype).c_str(), tokenizer.name().c_str(),
              vocab, extras.c_str());
  return 0;
}

}  // namespace

Command add_preprocess_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("preprocess", "text / JSON lines -> Megatron .bin/.idx (byte-level tokenizer, "
                                                   "GPT-2 BPE, Llama 3 or Qwen)");
  cmd->footer("Writes PREFIX.bin / PREFIX.idx (Megatron indexed dataset, one sequence per document; uint16 tokens, "
              "int32 for vocabularies of 65500 ids or more) with the byte-level tokenizer (UTF-8 bytes 0..255, end of "
              "document 256: vocab_size 257), GPT-2 BPE (GPT-2's files: vocab_size 50257, end of document "
              "<|endoftext|> = 50256) or Llama 3's tokenizer (tokenizer.model or tokenizer.json: vocab_size 128256, "
              "<|begin_of_text|> = 128000 starts every document, <|end_of_text|> = 128001 ends it with --append-eod) "
              "or Qwen2's / Qwen3's (tokenizer.json: NFC, single digits, no token before a document, <|endoftext|> = "
              "151643 ends it). "
              "Special-token strings in the text are encoded as text; added tokens that are not special (Qwen's "
              "<think>, <tool_call>, ...) are their ids.");
  auto o = std::make_shared<Options>();
  const CLI::Validator value([](std::string& v) { return v.starts_with("--") ? "needs a value, not '" + v + "'" : ""; },
                             "");  // as before (and Python's argparse): no value starts with --
  cmd->add_option("--input", o->inputs, "*.json / *.jsonl: one JSON object per line, the document under --json-key;\n"
                                        "other files: plain text, documents separated by lines holding only \"%\"\n"
                                        "if the file has such lines, else by blank lines")
      ->required()->type_name("FILE")->check(value);
  cmd->add_option("--output-prefix", o->output_prefix, "writes PREFIX.bin and PREFIX.idx")
      ->required()->type_name("PREFIX")->check(value);
  cmd->add_option("--json-key,--json-keys", o->json_key, "the document's key in JSON lines")
      ->capture_default_str()->check(value);
  cmd->add_flag("--append-eod", o->append_eod, "append the end-of-document token to every document");
  add_bpe_options(*cmd, o->files.vocab_file, o->files.merge_file);
  cmd->get_option("--vocab-file")->check(value);
  cmd->get_option("--merge-file")->check(value);
  CLI::Option* model = cmd->add_option("--tokenizer-model", o->files.tokenizer_model,
                                       "Llama 3's tokenizer: tiktoken's tokenizer.model (base64 token bytes and "
                                       "rank per line; 256 special tokens follow the ranks)")
                           ->type_name("tokenizer.model")->check(value);
  CLI::Option* file = cmd->add_option("--tokenizer-file", o->files.tokenizer_file,
                                      "Hugging Face's tokenizer.json of Llama 3, Qwen2 / Qwen3 or GPT-2 (the family told "
                                      "from its pre-tokenizer regex and normalizer)")
                          ->type_name("tokenizer.json")->check(value);
  model->excludes(file)->excludes("--vocab-file");
  file->excludes("--vocab-file");
  cmd->add_option("--tokenizer-type", o->tokenizer_type, "accepted for Megatron compatibility (GPT2BPETokenizer "
                                                         "needs --vocab-file and --merge-file; TikTokenizer "
                                                         "--tokenizer-model; HuggingFaceTokenizer --tokenizer-file "
                                                         "or --tokenizer-model)")
      ->check(CLI::IsMember({"ByteLevel", "GPT2BPETokenizer", "TikTokenizer", "HuggingFaceTokenizer"}));
  cmd->add_option("--workers", o->workers, "tokenizer threads (0 to 4096; 0, the default: one per core); the output is "
                                           "the same for any number")
      ->check(integer_in(0, 4096))->type_name("N");
  return [o] { return preprocess(*o); };
}

}  // namespace tpt
