// The checks inference_test.cpp and inference_llama_test.cpp share: KV-cached decoding
// (model/inference.h) against the logits of the training forward of the whole sequence.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/inference.h"

namespace tpt {

inline std::vector<int32_t> tokens_of(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t(philox4x32_10(1, uint64_t(i), seed).v[0] % uint32_t(vocab));
  return t;
}

// relative 1e-5 (absolute below 1)
inline void expect_close(const float* got, const float* want, int64_t n, const std::string& what) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::abs(double(got[i]) - double(want[i])) / std::max(1.0, std::abs(double(want[i])));
    worst = std::max(worst, err);
  }
  EXPECT_LE(worst, 1e-5) << what;
}

// The summed cross-entropy, in double, of the S x V logits full against targets[0, S).
inline double sequence_xent(const std::vector<float>& full, const int32_t* targets, int64_t S, int64_t V) {
  double xent = 0;
  for (int64_t t = 0; t < S; ++t) {
    const float* row = full.data() + t * V;
    double mx = row[0], sum = 0;
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
    xent += std::log(sum) + mx - row[targets[t]];
  }
  return xent;
}

// inf (fresh) on tokens[0, S) gives the S x V logits full: in one pass (what generate does with a
// prompt), and after prompts of 1 and 5 tokens one token at a time against the KV cache.
inline void expect_cached_decoding_equals(GPTInference& inf, const std::vector<int32_t>& tokens,
                                          const std::vector<float>& full, int64_t S, int64_t V) {
  std::vector<float> logits;
  inf.forward(std::span<const int32_t>(tokens.data(), size_t(S)), logits, true);
  ASSERT_EQ(logits.size(), size_t(S * V));
  expect_close(logits.data(), full.data(), S * V, "one pass over the sequence");
  EXPECT_EQ(inf.length(), S);
  for (int64_t prompt : {int64_t(1), int64_t(5)}) {
    inf.reset();
    inf.forward(std::span<const int32_t>(tokens.data(), size_t(prompt)), logits, true);
    expect_close(logits.data(), full.data(), prompt * V, "prompt of " + std::to_string(prompt));
    std::vector<float> last;
    inf.reset();
    inf.forward(std::span<const int32_t>(tokens.data(), size_t(prompt)), last);  // last position only
    ASSERT_EQ(last.size(), size_t(V));
    expect_close(last.data(), full.data() + (prompt - 1) * V, V, "last position of the prompt");
    for (int64_t t = prompt; t < S; ++t) {
      inf.forward(std::span<const int32_t>(&tokens[size_t(t)], 1), logits);
      expect_close(logits.data(), full.data() + t * V, V, "cached decoding at position " + std::to_string(t));
    }
    EXPECT_EQ(inf.length(), S);
  }
}

}  // namespace tpt
