// tptrain preprocess: text / JSON lines -> Megatron .bin/.idx with the byte-level tokenizer or GPT-2
// BPE (docs/ARCHITECTURE.md "Command line and exit status"). One sequence per document; uint16 tokens (int32 for a
// vocabulary above 65536 ids).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/mmap_file.h"
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
  std::string vocab_file, merge_file, tokenizer_type;
  bool append_eod = false;
};

// What the options cannot say alone.
void check(const Options& o) {
  if (o.json_key.empty()) input_error("preprocess: --json-key must not be empty");
  if (o.tokenizer_type == "GPT2BPETokenizer" && o.vocab_file.empty())
    input_error("preprocess: --tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file");
  if (o.tokenizer_type == "ByteLevel" && !o.vocab_file.empty())
    input_error("preprocess: --tokenizer-type ByteLevel takes no --vocab-file / --merge-file");
  for (const std::string& in : o.inputs)  // fail before writing anything
    if (!file_exists(in)) input_error("preprocess: input file " + in + ": not found (or not a regular file)");
}

int preprocess(const Options& opt) {
  check(opt);
  const Tokenizer tokenizer(opt.vocab_file, opt.merge_file);
  const int32_t vocab = tokenizer.vocab_size(), eod = tokenizer.eod();
  if (opt.append_eod && eod < 0)
    input_error("preprocess: --append-eod, but " + opt.vocab_file + " has no <|endoftext|> token");
  const int dtype = vocab <= 65536 ? megatron::kU16 : megatron::kI32;

  IndexedDatasetWriter writer(opt.output_prefix, dtype);
  std::vector<int32_t> tokens;
  for (const std::string& in : opt.inputs) {
    const int64_t docs = read_documents(in, opt.json_key, [&](std::string_view text) {
      tokens.clear();
      tokenizer.encode(text, tokens);
      if (opt.append_eod) tokens.push_back(eod);
      writer.add_document(tokens);
    });
    std::printf("preprocess: %s: %lld documents\n", in.c_str(), static_cast<long long>(docs));
  }
  writer.finish();
  std::printf("preprocess: wrote %s.bin and %s.idx: %lld documents, %lld tokens (%s, %s, vocab_size %d%s)\n",
              opt.output_prefix.c_str(), opt.output_prefix.c_str(), static_cast<long long>(writer.num_documents()),
              static_cast<long long>(writer.num_tokens()), megatron::dtype_name(dtype).c_str(), tokenizer.name().c_str(), vocab,
              opt.append_eod ? (", EOD " + std::to_string(eod) + " after each document").c_str() : "");
  return 0;
}

}  // namespace

Command add_preprocess_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("preprocess", "text / JSON lines -> Megatron .bin/.idx (byte-level tokenizer or "
                                                   "GPT-2 BPE)");
  cmd->footer("Writes PREFIX.bin / PREFIX.idx (Megatron indexed dataset, one sequence per document, uint16 tokens) with "
              "the byte-level tokenizer (UTF-8 bytes 0..255, end of document 256: vocab_size 257) or GPT-2 BPE "
              "(GPT-2's files: vocab_size 50257, end of document <|endoftext|> = 50256).");
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
  add_bpe_options(*cmd, o->vocab_file, o->merge_file);
  cmd->get_option("--vocab-file")->check(value);
  cmd->get_option("--merge-file")->check(value);
  cmd->add_option("--tokenizer-type", o->tokenizer_type, "accepted for Megatron compatibility (GPT2BPETokenizer "
                                                         "needs --vocab-file and --merge-file)")
      ->check(CLI::IsMember({"ByteLevel", "GPT2BPETokenizer"}));
  cmd->add_option("--workers", "accepted for Megatron compatibility (>= 0); ignored")->check(integer_at_least(0))->type_name("N");
  return [o] { return preprocess(*o); };
}

}  // namespace tpt
