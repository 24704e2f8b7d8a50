// Shared fixtures of the config tests (config_test.cpp, config_model_test.cpp): a small base config,
// the error message of a bad one, a LLaMA-style config.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"

namespace tpt::config_test {

inline const char* kBase = R"(model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  seq_length: 32
  vocab_size: 100
training:
  train_iters: 10
data:
  path: /nonexistent/tiny_text_document
)";

// The InputError message of parsing `yaml` with `overrides`; fails the test when it parses.
inline std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "test.yaml", overrides);
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << yaml << "overrides: " << ::testing::PrintToString(overrides);
  return "";
}

inline std::string error_of_set(const std::string& override_text) { return error_of(kBase, {override_text}); }

#define EXPECT_HAS(msg, sub) EXPECT_NE((msg).find(sub), std::string::npos) << "message: " << (msg)

// A small LLaMA-style config: every LLaMA-family key set (GQA 4 heads / 2 groups, head dim 16).
inline Config llama_config(std::vector<std::string> more = {}) {
  std::vector<std::string> sets = {
      "model.normalization=RMSNorm", "model.swiglu=true", "model.ffn_hidden_size=172",
      "model.position_embedding_type=rope", "model.rotary_base=500000", "model.group_query_attention=true",
      "model.num_query_groups=2", "model.untie_embeddings_and_output_weights=true", "model.add_bias_linear=false",
      "model.rope_scaling={factor: 8, low_freq_factor: 1, high_freq_factor: 4, "
      "original_max_position_embeddings: 8192, rope_type: llama3}"};
  sets.insert(sets.end(), more.begin(), more.end());
  return parse_config(kBase, "test.yaml", sets);
}

inline std::string resolve_error(Config c, int world) {
  try {
    resolve_parallel(c, world);
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for world " << world;
  return "";
}

// kBase with `lines` added to its model section.
inline std::string with_model(const std::string& lines) {
  std::string y = kBase;
  return y.insert(y.find("model:\n") + 7, lines);
}

}  // namespace tpt::config_test
