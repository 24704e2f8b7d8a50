// tptrain preprocess: text / JSON lines -> Megatron .bin/.idx with the byte-level tokenizer
// (DESIGN "Command line (contract)"). One sequence per document; uint16 tokens.
#include <cstdio>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "data/indexed_writer.h"
#include "data/megatron_format.h"
#include "data/text_documents.h"
#include "data/tokenizer.h"

namespace tpt {
namespace {

constexpr const char* kUsage =
    "usage: tptrain preprocess --input FILE... --output-prefix PREFIX [--json-key KEY] [--append-eod]\n"
    "                          [--workers N]\n"
    "  Tokenizes text into PREFIX.bin / PREFIX.idx (Megatron indexed dataset, uint16 tokens) with the\n"
    "  byte-level tokenizer: tokens are UTF-8 bytes 0..255, end of document = 256 (vocab_size 257).\n"
    "  *.json / *.jsonl inputs: one JSON object per line, the document under --json-key (default \"text\").\n"
    "  Other inputs: plain text; documents are separated by lines holding only \"%\" if the file has\n"
    "  such lines, else by blank lines.\n"
    "  --append-eod  append the end-of-document token 256 to every document\n"
    "  --workers N   accepted for Megatron compatibility; ignored\n";

struct Options {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string json_key = "text";
  bool append_eod = false;
  bool help = false;
};

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i, const std::string& flag) -> std::string {
    if (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0)
      input_error("preprocess: " + flag + " needs a value\n" + kUsage);
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string inline_value;
    const bool has_inline = arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos;
    if (has_inline) {
      inline_value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
    }
    auto get = [&](const std::string& flag) { return has_inline ? inline_value : value(i, flag); };
    if (arg == "--input") {
      o.inputs.push_back(get(arg));
      // More files may follow: --input a.txt b.txt
      while (!has_inline && i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) o.inputs.push_back(argv[++i]);
    } else if (arg == "--output-prefix") {
      o.output_prefix = get(arg);
    } else if (arg == "--json-key" || arg == "--json-keys") {
      o.json_key = get(arg);
    } else if (arg == "--append-eod" && !has_inline) {
      o.append_eod = true;
    } else if (arg == "--workers") {
      const std::string n = get(arg);
      if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos)
        input_error("preprocess: --workers needs a positive integer, got '" + n + "'");
    } else if (arg == "--help" || arg == "-h") {
      o.help = true;
      return o;
    } else {
      input_error("preprocess: unknown argument '" + std::string(argv[i]) + "'\n" + kUsage);
    }
  }
  if (o.inputs.empty()) input_error(std::string("preprocess: --input is required\n") + kUsage);
  if (o.output_prefix.empty()) input_error(std::string("preprocess: --output-prefix is required\n") + kUsage);
  if (o.json_key.empty()) input_error("preprocess: --json-key must not be empty");
  return o;
}

}  // namespace

int preprocess_main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  if (opt.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  for (const std::string& in : opt.inputs)  // fail before writing anything
    if (!file_exists(in)) input_error("preprocess: input file " + in + ": not found (or not a regular file)");

  IndexedDatasetWriter writer(opt.output_prefix, megatron::kU16);
  std::vector<int32_t> tokens;
  for (const std::string& in : opt.inputs) {
    const int64_t docs = read_documents(in, opt.json_key, [&](std::string_view text) {
      tokens.clear();
      ByteTokenizer::encode(text, tokens);
      if (opt.append_eod) tokens.push_back(ByteTokenizer::kEod);
      writer.add_document(tokens);
    });
    std::printf("preprocess: %s: %lld documents\n", in.c_str(), static_cast<long long>(docs));
  }
  writer.finish();
  std::printf("preprocess: wrote %s.bin and %s.idx: %lld documents, %lld tokens (uint16, byte-level, "
              "vocab_size %d%s)\n",
              opt.output_prefix.c_str(), opt.output_prefix.c_str(), static_cast<long long>(writer.num_documents()),
              static_cast<long long>(writer.num_tokens()), ByteTokenizer::kVocabSize,
              opt.append_eod ? ", EOD 256 after each document" : "");
  return 0;
}

}  // namespace tpt
