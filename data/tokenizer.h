// The byte-level tokenizer of `tptrain preprocess` and `tptrain generate`: token = UTF-8 byte
// (0..255), plus an end-of-document token 256. Vocabulary size 257.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tpt {

struct ByteTokenizer {
  static constexpr int32_t kVocabSize = 257;
  static constexpr int32_t kEod = 256;

  // The bytes of `text` as tokens, appended to `out`.
  static void encode(std::string_view text, std::vector<int32_t>& out);
  static std::vector<int32_t> encode(std::string_view text);
  // Bytes back to text. EOD becomes "<|endoftext|>"; a token outside [0, 257) (a padded-vocabulary
  // id a model might sample) becomes U+FFFD.
  static std::string decode(std::span<const int32_t> tokens);
};

}  // namespace tpt
