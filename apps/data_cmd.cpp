// tptrain data --config FILE --samples A:B [--json] [--split train|valid|test]: the global samples a
// run reads, where each comes from (blend component, its sample, the documents it spans) and the
// start of its text. One process; the datasets are opened by data/run_data.h exactly as the trainer
// opens them, so what this prints is what training sees.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "core/config.h"
#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/run_data.h"
#include "data/tokenizer.h"

namespace tpt {
namespace {

constexpr const char* kUsage =
    "usage: tptrain data --config FILE [--set section.key=value]... --samples A:B [--json]\n"
    "                    [--split train|valid|test] [--vocab-file vocab.json --merge-file merges.txt]\n"
    "  Prints global samples A <= i < B of the split (default train) as training reads them: the blend\n"
    "  component (0-based place in data.path), the sample's place within the component (and the\n"
    "  component's sample and epoch it visits), the documents it spans and the start of its text\n"
    "  (byte-level when model.vocab_size is 257; GPT-2 BPE with --vocab-file / --merge-file).\n"
    "  --json  one object per line: sample, dataset, dataset_sample, component_sample, epoch,\n"
    "          documents (ids in the component's corpus), tokens (the first 16 ids), text\n";

struct Args {
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t begin = -1, end = -1;
  bool json = false;
  std::string split = "train";
  std::string vocab_file, merge_file;
};

int64_t parse_count(const std::string& s, const std::string& what) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos)
    input_error("data: --samples: " + what + " '" + s + "' is not a non-negative integer");
  return std::stoll(s);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i], v;
    const size_t eq = s.find('=');
    const bool inline_value = s.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) v = s.substr(eq + 1), s = s.substr(0, eq);
    auto value = [&]() -> std::string {
      if (inline_value) return v;
      if (i + 1 >= argc) input_error("data: " + s + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (s == "--config") a.config_path = value();
    else if (s == "--set") a.overrides.push_back(value());
    else if (s == "--samples") {
      const std::string r = value();
      const size_t colon = r.find(':');
      if (colon == std::string::npos) input_error("data: --samples expects A:B (e.g. 0:8), got '" + r + "'");
      a.begin = parse_count(r.substr(0, colon), "A");
      a.end = parse_count(r.substr(colon + 1), "B");
      if (a.end < a.begin) input_error("data: --samples " + r + ": B is smaller than A");
    } else if (s == "--json" && !inline_value) a.json = true;
    else if (s == "--split") a.split = value();
    else if (s == "--vocab-file") a.vocab_file = value();
    else if (s == "--merge-file") a.merge_file = value();
    else if (s == "--help" || s == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else input_error("data: unknown argument '" + std::string(argv[i]) + "'\n" + kUsage);
  }
  if (a.config_path.empty()) input_error(std::string("data: --config FILE is required\n") + kUsage);
  if (a.begin < 0) input_error(std::string("data: --samples A:B is required\n") + kUsage);
  if (a.split != "train" && a.split != "valid" && a.split != "test")
    input_error("data: --split must be train, valid or test, got '" + a.split + "'");
  if (a.vocab_file.empty() != a.merge_file.empty())
    input_error("data: --vocab-file and --merge-file go together (GPT-2 BPE needs both)");
  return a;
}

// Printable one-line text: control characters escaped.
std::string one_line(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += char(c);
  }
  return out;
}

}  // namespace

int data_main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  Config cfg = load_config(args.config_path, args.overrides);
  const RunData data = open_run_data(cfg);
  const BlendedDataset* ds = args.split == "train" ? data.train.get()
                             : args.split == "valid" ? data.valid.get()
                                                     : data.test.get();
  if (!ds)
    input_error("data: no " + args.split + " samples: " + (args.split == "valid" ? data.valid_missing : data.test_missing));
  const std::vector<DataComponent>& comps =
      args.split == "valid" && !data.valid_components.empty() ? data.valid_components : data.components;

  std::optional<BpeTokenizer> bpe;
  if (!args.vocab_file.empty()) bpe.emplace(args.vocab_file, args.merge_file);
  const bool bytes = !bpe && cfg.model.vocab_size == ByteTokenizer::kVocabSize;
  auto decode = [&](const std::vector<int32_t>& t) -> std::optional<std::string> {
    if (bpe) return bpe->decode(t);
    if (bytes) return ByteTokenizer::decode(t);
    return std::nullopt;
  };

  const int64_t S = cfg.model.seq_length;
  if (!args.json) {
    std::printf("tptrain data | %s split of %s | %d component%s | seq_length %lld | %s\n", args.split.c_str(),
                cfg.data.path.text().c_str(), ds->num_components(), ds->num_components() == 1 ? "" : "s",
                (long long)S, bpe ? "GPT-2 BPE text" : bytes ? "byte-level text" : "token ids (no tokenizer: pass --vocab-file/--merge-file for GPT-2 BPE)");
    for (int d = 0; d < ds->num_components(); ++d)
      std::printf("  dataset %d: weight %.6g, %lld samples, documents [%lld, %lld) of %s\n", d, ds->weights()[size_t(d)],
                  (long long)ds->component(d).num_samples(), (long long)ds->component(d).documents().begin,
                  (long long)ds->component(d).documents().end, comps[size_t(d)].path.c_str());
  }
  std::vector<int32_t> tokens(size_t(S + 1));
  for (int64_t i = args.begin; i < args.end; ++i) {
    const BlendedDataset::Source src = ds->source(i);
    const GPTDataset& comp = ds->component(src.dataset);
    ds->get(i, tokens.data());
    const int64_t sample = comp.sample_index(src.dataset_sample);
    const int64_t epoch = src.dataset_sample / comp.num_samples();
    const auto [first_doc, last_doc] = comp.document_span(sample);
    const std::vector<int32_t> head(tokens.begin(), tokens.begin() + std::min<int64_t>(16, S + 1));
    const std::vector<int32_t> lead(tokens.begin(), tokens.begin() + std::min<int64_t>(64, S + 1));
    const std::optional<std::string> text = decode(lead);
    if (args.json) {
      nlohmann::json docs = nlohmann::json::array();
      for (int64_t d = first_doc; d <= last_doc; ++d) docs.push_back(d);
      nlohmann::json j = {{"sample", i},         {"dataset", src.dataset}, {"dataset_sample", src.dataset_sample},
                          {"component_sample", sample}, {"epoch", epoch}, {"documents", docs}, {"tokens", head}};
      j["text"] = text ? nlohmann::json(*text) : nlohmann::json(nullptr);
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::string ids;
      for (size_t k = 0; k < head.size(); ++k) ids += (k ? " " : "") + std::to_string(head[k]);
      std::printf("sample %lld | dataset %d sample %lld (its sample %lld, epoch %lld) | documents %lld-%lld | %s\n",
                  (long long)i, src.dataset, (long long)src.dataset_sample, (long long)sample, (long long)epoch,
                  (long long)first_doc, (long long)last_doc,
                  text ? ("\"" + one_line(*text) + "\"").c_str() : ("tokens " + ids).c_str());
    }
  }
  return 0;
}

}  // namespace tpt
