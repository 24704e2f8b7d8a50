// tptrain data (options: add_data_command below): the global samples a run reads, where each comes
// from (blend component, its sample, the documents it spans) and the start of its text. One process;
// the datasets are opened by data/run_data.h exactly as the trainer opens them, so what this prints
// is what training sees.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/config.h"
#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/run_data.h"
#include "data/tokenizer.h"

namespace tpt {
namespace {

struct Args {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string samples;
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

// --samples A:B -> [A, B)
void parse_samples(Args& a) {
  const std::string& r = a.samples;
  const size_t colon = r.find(':');
  if (colon == std::string::npos) input_error("data: --samples expects A:B (e.g. 0:8), got '" + r + "'");
  a.begin = parse_count(r.substr(0, colon), "A");
  a.end = parse_count(r.substr(colon + 1), "B");
  if (a.end < a.begin) input_error("data: --samples " + r + ": B is smaller than A");
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

int show_samples(Args& args) {
  parse_samples(args);
  Config cfg = load_config(args.config_path, args.overrides);
  const RunData data = open_run_data(cfg);
  const BlendedDataset* ds = args.split == "train" ? data.train.get()
                             : args.split == "valid" ? data.valid.get()
                                                     : data.test.get();
  if (!ds)
    input_error("data: no " + args.split + " samples: " + (args.split == "valid" ? data.valid_missing : data.test_missing));
  // bounded work: the lines printed, and the blend's replay of Megatron's greedy from position 0 to A
  // (it has no closed form; ~1 ns per position and component)
  constexpr int64_t kMaxSamples = 1 << 20, kMaxReplay = int64_t(1) << 33;
  if (args.end - args.begin > kMaxSamples)
    input_error("data: --samples " + args.samples + ": " + std::to_string(args.end - args.begin) +
                " samples, more than " + std::to_string(kMaxSamples) + " per call");
  const int64_t reachable = kMaxReplay / ds->num_components();
  if (ds->replay_distance(args.begin) > reachable)
    input_error("data: --samples " + args.samples + ": A is beyond the blend positions that tptrain data replays "
                "Megatron's blending greedy to (below " + std::to_string(reachable) + " for " +
                std::to_string(ds->num_components()) + " components, about 10 s)");
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

}  // namespace

Command add_data_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("data", "the samples training reads: blend component, documents spanned, "
                                             "start of the text (no MPI)");
  cmd->footer("Prints global samples A <= i < B of the split as training reads them: the blend component (0-based "
              "place in data.path), the sample's place within the component (and the component's sample and epoch it "
              "visits), the documents it spans and the start of its text (byte-level when model.vocab_size is 257; "
              "GPT-2 BPE with --vocab-file / --merge-file).");
  auto a = std::make_shared<Args>();
  add_config_options(*cmd, a->config_path, a->overrides);
  cmd->add_option("--samples", a->samples, "global samples A <= i < B of the split (at most 1048576 at a time)")->required()->type_name("A:B");
  cmd->add_flag("--json", a->json, "one object per line: sample, dataset, dataset_sample, component_sample, epoch, "
                                   "documents (ids in the component's corpus), tokens (the first 16 ids), text");
  cmd->add_option("--split", a->split, "the split read")
      ->check(CLI::IsMember({"train", "valid", "test"}))->capture_default_str();
  add_bpe_options(*cmd, a->vocab_file, a->merge_file);
  return [a] { return show_samples(*a); };
}

}  // namespace tpt
