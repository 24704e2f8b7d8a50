// The tokenizers of `tptrain preprocess` and `tptrain generate`: the byte-level one (token = UTF-8
// byte 0..255, plus an end-of-document token 256; vocabulary size 257), or GPT-2's BPE
// (data/bpe_tokenizer.h), behind one face (Tokenizer).
#pragma once
#include <cstdint>
#include <memory>
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

class BpeTokenizer;

// The one choice of tokenizer: GPT-2 BPE from its vocab.json and merges.txt when vocab_file is
// given, else byte-level.
class Tokenizer {
 public:
  Tokenizer(const std::string& vocab_file, const std::string& merge_file);
  void encode(std::string_view text, std::vector<int32_t>& out) const;  // appended to out
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(std::span<const int32_t> tokens) const;
  int32_t vocab_size() const;
  int32_t eod() const;  // -1: a BPE vocabulary without <|endoftext|>
  bool is_bpe() const { return bpe_ != nullptr; }
  std::string name() const { return bpe_ ? "GPT-2 BPE" : "byte-level"; }

 private:
  std::shared_ptr<const BpeTokenizer> bpe_;
};

}  // namespace tpt
