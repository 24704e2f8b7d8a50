// The tokenizers of `tptrain preprocess` and `tptrain generate` behind one face (Tokenizer): the
// byte-level one (token = UTF-8 byte 0..255, plus an end-of-document token 256; vocabulary size
// 257), GPT-2's BPE (data/bpe_tokenizer.h), or Llama 3's and Qwen2's / Qwen3's (data/byte_pair_tokenizer.h:
// tiktoken's tokenizer.model or Hugging Face's tokenizer.json). All of them encode on several threads at once.
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
class BytePairTokenizer;

// The tokenizer files of the command line; at most one kind may be given (none: byte-level).
struct TokenizerFiles {
  std::string vocab_file, merge_file;  // GPT-2 BPE: vocab.json + merges.txt
  std::string tokenizer_model;         // Llama 3: tiktoken's tokenizer.model
  std::string tokenizer_file;          // Llama 3, Qwen2 / Qwen3, GPT-2: Hugging Face's tokenizer.json
};

class Tokenizer {
 public:
  // InputError if several kinds are given, or a file is missing or malformed.
  explicit Tokenizer(const TokenizerFiles& files);
  Tokenizer(const std::string& vocab_file, const std::string& merge_file);  // GPT-2 BPE or byte-level
  ~Tokenizer();

  // The tokens of a plain text (special-token strings in it are text), appended to out.
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode(std::string_view text) const;
  // A document as `tptrain preprocess` stores it (Megatron's tokenizers): prefix(), the text's
  // tokens, the template's suffix, and with append_eod the end-of-document token. Appended to out.
  void encode_document(std::string_view text, bool append_eod, std::vector<int32_t>& out) const;
  std::string decode(std::span<const int32_t> tokens) const;

  int32_t vocab_size() const;  // largest id + 1
  int32_t eod() const;         // -1: a vocabulary without an end-of-document token
  // Special tokens every text starts with: Llama 3's <|begin_of_text|>; none for the others (Qwen's too).
  const std::vector<int32_t>& prefix() const;
  bool is_stop(int32_t id) const;  // ends generation: eod (also Llama 3's <|eot_id|>, <|eom_id|>, Qwen's <|im_end|>)
  bool is_byte_level() const { return !bpe_ && !pair_; }
  bool is_bpe() const { return bpe_ != nullptr; }  // GPT-2 BPE
  std::string name() const;

 private:
  std::shared_ptr<const BpeTokenizer> bpe_;
  std::shared_ptr<const BytePairTokenizer> pair_;
};

}  // namespace tpt
