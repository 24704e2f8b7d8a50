// tptrain preprocess: text / JSON lines -> Megatron .bin/.idx with the byte-level tokenizer or GPT-2
// BPE (docs/ARCHITECTURE.md "Command line and exit status"). One sequence per document; uint16 tokens (int32 for a
// vocabulary above 65536 ids).
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "core/error.h"
#include "core/mmap_file.h"
#include "data/bpe_tokenizer.h"
#include "data/indexed_writer.h"
#include "data/megatron_format.h"
#include "data/text_documents.h"
#include "data/tokenizer.h"

namespace tpt {
namespace {

constexpr const char* kUsage =
    "usage: tptrain preprocess --input FILE... --output-prefix PREFIX [--json-key KEY] [--append-eod]\n"
    "                          [--vocab-file vocab.json --merge-file merges.txt] [--workers N]\n"
    "  Tokenizes text into PREFIX.bin / PREFIX.idx (Megatron indexed dataset, uint16 tokens) with the\n"
    "  byte-level tokenizer: tokens are UTF-8 bytes 0..255, end of document = 256 (vocab_size 257).\n"
    "  --vocab-file F --merge-file F  GPT-2 byte-level BPE instead, from Hugging Face's vocab.json and\n"
    "                merges.txt (GPT-2's: vocab_size 50257, end of document <|endoftext|> = 50256)\n"
    "  --tokenizer-type ByteLevel|GPT2BPETokenizer  accepted for Megatron compatibility (GPT2BPETokenizer\n"
    "                needs the two files)\n"
    "  *.json / *.jsonl inputs: one JSON object per line, the document under --json-key (default \"text\").\n"
    "  Other inputs: plain text; documents are separated by lines holding only \"%\" if the file has\n"
    "  such lines, else by blank lines.\n"
    "  --append-eod  append the end-of-document token 256 to every document\n"
    "  --workers N   accepted for Megatron compatibility; ignored\n";

struct Options {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string json_key = "text";
  std::string vocab_file, merge_file, tokenizer_type;
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
    } else if (arg == "--vocab-file") {
      o.vocab_file = get(arg);
    } else if (arg == "--merge-file") {
      o.merge_file = get(arg);
    } else if (arg == "--tokenizer-type") {
      o.tokenizer_type = get(arg);
      if (o.tokenizer_type != "ByteLevel" && o.tokenizer_type != "GPT2BPETokenizer")
        input_error("preprocess: --tokenizer-type must be ByteLevel or GPT2BPETokenizer, got '" + o.tokenizer_type + "'");
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
  if (o.vocab_file.empty() != o.merge_file.empty())
    input_error("preprocess: --vocab-file and --merge-file go together (GPT-2 BPE needs both)");
  if (o.tokenizer_type == "GPT2BPETokenizer" && o.vocab_file.empty())
    input_error("preprocess: --tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file");
  if (o.tokenizer_type == "ByteLevel" && !o.vocab_file.empty())
    input_error("preprocess: --tokenizer-type ByteLevel takes no --vocab-file / --merge-file");
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

  std::optional<BpeTokenizer> bpe;
  if (!opt.vocab_file.empty()) bpe.emplace(opt.vocab_file, opt.merge_file);
  const int32_t vocab = bpe ? bpe->vocab_size() : ByteTokenizer::kVocabSize;
  const int32_t eod = bpe ? bpe->eod() : ByteTokenizer::kEod;
  if (opt.append_eod && eod < 0)
    input_error("preprocess: --append-eod, but " + opt.vocab_file + " has no <|endoftext|> token");
  const int dtype = vocab <= 65536 ? megatron::kU16 : megatron::kI32;

  IndexedDatasetWriter writer(opt.output_prefix, dtype);
  std::vector<int32_t> tokens;
  for (const std::string& in : opt.inputs) {
    const int64_t docs = read_documents(in, opt.json_key, [&](std::string_view text) {
      tokens.clear();
      if (bpe) bpe->encode(text, tokens);
      else ByteTokenizer::encode(text, tokens);
      if (opt.append_eod) tokens.push_back(eod);
      writer.add_document(tokens);
    });
    std::printf("preprocess: %s: %lld documents\n", in.c_str(), static_cast<long long>(docs));
  }
  writer.finish();
  const std::string tokenizer = bpe ? "GPT-2 BPE" : "byte-level";
  std::printf("preprocess: wrote %s.bin and %s.idx: %lld documents, %lld tokens (%s, %s, vocab_size %d%s)\n",
              opt.output_prefix.c_str(), opt.output_prefix.c_str(), static_cast<long long>(writer.num_documents()),
              static_cast<long long>(writer.num_tokens()), megatron::dtype_name(dtype).c_str(), tokenizer.c_str(), vocab,
              opt.append_eod ? (", EOD " + std::to_string(eod) + " after each document").c_str() : "");
  return 0;
}

}  // namespace tpt
