// The datasets of a run as its config describes them (data.path, data.valid_path, data.split): one
// path or a blend of several, each component split into train / valid / test by documents as
// Megatron does. The trainer, `tptrain data` and `tptrain plan` all open their data here, so what
// `tptrain data` prints is what training reads.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "data/blend.h"
#include "data/dataset.h"

namespace tpt {

struct DataComponent {
  std::string label;       // for messages: the path, or "data.path component 2 of 3 (weight 0.7, 'prefix')"
  std::string path;
  double weight = 1.0;     // as given (1 for a single path)
  std::shared_ptr<const TokenCorpus> corpus;
  std::vector<DocRange> splits;  // train, valid, test documents of the corpus
};

struct RunData {
  std::vector<DataComponent> components;        // data.path
  std::vector<DataComponent> valid_components;  // data.valid_path; empty: the valid splits of data.path
  std::unique_ptr<BlendedDataset> train;        // never null
  std::unique_ptr<BlendedDataset> valid, test;  // null when a component has no sample there (see *_missing)
  std::string valid_missing, test_missing;      // why valid / test is null
};

// Opens and validates every component (InputError naming the component: a missing prefix, tokens
// outside [0, model.vocab_size), a train split shorter than one sample).
RunData open_run_data(const Config& cfg);

// Per component of data.path: documents, tokens, train samples and the epochs of its train split
// that train_iters x global_batch_size samples cover (global_batch_size resolved). Log lines, and
// the same as JSON (tptrain plan --json).
std::vector<std::string> describe_run_data(const RunData& data, const Config& cfg);
nlohmann::json run_data_json(const RunData& data, const Config& cfg);

}  // namespace tpt

namespace tpt {

// The blend's state at `position` (a checkpoint's sampler.blend in meta.json): the normalised
// weights and how many samples each component gave to positions [0, position). The sequence is a
// pure function of the position and the weights, so this only saves replaying the greedy on resume.
nlohmann::json blend_state_json(const BlendedDataset& blend, int64_t position);
// On resume at `position`: when `state` was saved at that position with the same weights, its
// counts seed the blend (add_anchor) and it returns true; otherwise false, with `note` saying why
// (the blend then replays from position 0: the same sequence, more time).
bool resume_blend(BlendedDataset& blend, const nlohmann::json& state, int64_t position, std::string& note);

}  // namespace tpt
