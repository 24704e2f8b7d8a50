// Opening a run's data: components, splits, blends (data/run_data.h).
#include "data/run_data.h"

#include <spdlog/fmt/fmt.h>

#include "core/error.h"

namespace tpt {
namespace {

std::vector<DataComponent> open_components(const DataPath& dp, const char* key, const Config& cfg) {
  std::vector<DataComponent> out;
  const size_t n = dp.paths.size();
  for (size_t i = 0; i < n; ++i) {
    DataComponent c;
    c.path = dp.paths[i];
    c.weight = dp.is_blend() ? dp.weights[i] : 1.0;
    c.label = dp.is_blend() ? fmt::format("{} component {} of {} (weight {}, '{}')", key, i + 1, n, c.weight, c.path)
                            : c.path;
    try {
      c.corpus = open_corpus(c.path, cfg.model.vocab_size);
    } catch (const InputError& e) {
      if (!dp.is_blend()) throw;
      input_error(c.label + ": " + e.what());
    }
    c.splits = split_documents(c.corpus->num_documents(), cfg.data.split);
    out.push_back(std::move(c));
  }
  return out;
}

// The blend of split `s` of the components (or of their whole corpora when `whole`), or null with
// `why` set when a component has no sample there.
std::unique_ptr<BlendedDataset> blend_split(const std::vector<DataComponent>& comps, int s, bool whole, bool shuffle,
                                            const Config& cfg, std::string& why) {
  std::vector<std::unique_ptr<GPTDataset>> parts;
  std::vector<double> weights;
  for (const DataComponent& c : comps) {
    const DocRange docs = whole ? DocRange{0, c.corpus->num_documents()} : c.splits[size_t(s)];
    auto ds = std::make_unique<GPTDataset>(c.corpus, docs, cfg.model.seq_length, shuffle, cfg.training.seed);
    if (ds->num_samples() < 1) {
      why = c.label + ": " + std::to_string(ds->num_tokens()) + " tokens, fewer than one sample of seq_length + 1 = " +
            std::to_string(cfg.model.seq_length + 1);
      return nullptr;
    }
    parts.push_back(std::move(ds));
    weights.push_back(c.weight);
  }
  return std::make_unique<BlendedDataset>(std::move(parts), weights);
}

// Greedy steps x components replayed at most for the exact per-component figures (~0.1 s).
constexpr int64_t kExactReplay = int64_t(1) << 27;

std::string count(int64_t n) { return n < 100000 ? std::to_string(n) : fmt::format("{:.3g}", double(n)); }

}  // namespace

RunData open_run_data(const Config& cfg) {
  RunData d;
  d.components = open_components(cfg.data.path, "data.path", cfg);
  std::string why;
  d.train = blend_split(d.components, 0, false, cfg.data.shuffle, cfg, why);
  if (!d.train) input_error("the train split of " + why);
  if (!cfg.data.valid_path.empty()) {
    d.valid_components = open_components(cfg.data.valid_path, "data.valid_path", cfg);
    d.valid = blend_split(d.valid_components, 1, true, false, cfg, why);
    if (!d.valid) d.valid_missing = "data.valid_path " + why;
  } else {
    d.valid = blend_split(d.components, 1, false, false, cfg, why);
    if (!d.valid) d.valid_missing = "the valid split of " + why;
  }
  d.test = blend_split(d.components, 2, false, false, cfg, why);
  if (!d.test) d.test_missing = "the test split of " + why;
  return d;
}

nlohmann::json run_data_json(const RunData& data, const Config& cfg) {
  const int64_t samples = cfg.training.train_iters * int64_t(cfg.training.global_batch_size);  // < 2^62 (config)
  // Exact when the greedy's replay is short; a run too long to replay at every start (the realistic
  // 10-component blend of 500 000 x 1536 samples took 9.7 s) gets the weights' apportionment, within
  // a few samples of it. Start-up never depends on the run's length.
  const bool exact = data.train->replay_distance(samples) <= kExactReplay / data.train->num_components();
  const std::vector<int64_t> drawn = exact ? data.train->counts_at(samples) : data.train->estimated_counts(samples);
  nlohmann::json comps = nlohmann::json::array();
  for (size_t i = 0; i < data.components.size(); ++i) {
    const DataComponent& c = data.components[i];
    const GPTDataset& t = data.train->component(int(i));
    comps.push_back({{"path", c.path},
                     {"weight", c.weight},
                     {"normalized_weight", data.train->weights()[i]},
                     {"documents", c.corpus->num_documents()},
                     {"train_documents", c.splits[0].end - c.splits[0].begin},
                     {"train_tokens", t.num_tokens()},
                     {"train_samples", t.num_samples()},
                     {"samples_drawn", drawn[i]},
                     {"samples_drawn_exact", exact},
                     {"epochs", double(drawn[i]) / double(t.num_samples())}});
  }
  return {{"train_samples", samples}, {"components", comps}};
}

std::vector<std::string> describe_run_data(const RunData& data, const Config& cfg) {
  const nlohmann::json j = run_data_json(data, cfg);
  std::vector<std::string> lines;
  const bool blend = cfg.data.path.is_blend();
  for (size_t i = 0; i < data.components.size(); ++i) {
    const DataComponent& c = data.components[i];
    const nlohmann::json& x = j["components"][i];
    lines.push_back(fmt::format("{}{}", blend ? fmt::format("component {} (weight {:.4g}): ", i, x["normalized_weight"].get<double>()) : "",
                                c.corpus->description()));
    lines.push_back(fmt::format("{}train split {} documents, {} tokens, {} samples of {} tokens; {} iterations x {} "
                                "draw {}{} of them: {:.3f} epochs",
                                blend ? "  " : "", x["train_documents"].get<int64_t>(),
                                count(x["train_tokens"].get<int64_t>()), x["train_samples"].get<int64_t>(),
                                cfg.model.seq_length, cfg.training.train_iters, cfg.training.global_batch_size,
                                x["samples_drawn_exact"].get<bool>() ? "" : "about ", x["samples_drawn"].get<int64_t>(), x["epochs"].get<double>()));
  }
  return lines;
}

}  // namespace tpt

namespace tpt {

nlohmann::json blend_state_json(const BlendedDataset& blend, int64_t position) {
  return {{"position", position}, {"weights", blend.weights()}, {"counts", blend.counts_at(position)}};
}

bool resume_blend(BlendedDataset& blend, const nlohmann::json& state, int64_t position, std::string& note) {
  if (!state.is_object()) {
    note = "the checkpoint has no blend state";
    return false;
  }
  try {
    const auto weights = state.at("weights").get<std::vector<double>>();
    const auto counts = state.at("counts").get<std::vector<int64_t>>();
    const int64_t at = state.at("position").get<int64_t>();
    if (weights != blend.weights()) {
      note = "the checkpoint's blend weights differ from data.path's";
      return false;
    }
    if (at != position) {
      note = "the checkpoint's blend state is for position " + std::to_string(at);
      return false;
    }
    blend.add_anchor(position, counts);
    return true;
  } catch (const std::exception& e) {  // a damaged state is not fatal: the sequence is replayed instead
    note = std::string("unreadable blend state (") + e.what() + ")";
    return false;
  }
}

}  // namespace tpt
