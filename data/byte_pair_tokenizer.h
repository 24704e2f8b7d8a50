// The byte-level BPE tokenizers of `tptrain preprocess` and `tptrain generate` (through
// data/tokenizer.h), from either of two files:
//   - tiktoken's `tokenizer.model` (--tokenizer-model; Meta's original Llama 3 file): one line per
//     token, its bytes in base64 and its rank ("IQ== 0"); the ranks must be 0..N-1 and cover every
//     single byte. The token id is the rank; the 256 special tokens of llama-models follow at
//     N..N+255 (`<|begin_of_text|>` N, `<|end_of_text|>` N+1, ..., `<|eot_id|>` N+9: 128000, 128001,
//     128009 for Llama 3's N = 128000). Pre-tokenization: Llama 3's pattern (kLlama3Pattern).
//   - Hugging Face's `tokenizer.json` (--tokenizer-file) of a known family (kFamilies): a byte-level
//     BPE model (`model.vocab` of GPT-2 byte symbols, `model.merges` as "a b" or ["a", "b"],
//     `model.ignore_merges`), `added_tokens`, the pre-tokenizer `Split` (a Regex, Isolated) followed
//     by `ByteLevel` without its regex, or `ByteLevel` with its regex (GPT-2's pattern) alone, the
//     normalizer (none or `NFC`), and a `TemplateProcessing` post-processor (its special tokens
//     before and after the text: Llama 3's `<|begin_of_text|>`), `ByteLevel` (nothing: Qwen) or none.
//     The family is told from the regex and the normalizer: Llama 3 (\p{N}{1,3}, no normalizer),
//     Qwen2 / Qwen3 (single digits \p{N}, NFC), GPT-2 (ByteLevel's own regex, no normalizer); any
//     other pair is an InputError naming how it differs from each, as PCRE2 is only known to cut
//     these patterns as Hugging Face's engine does.
// Encoding (tiktoken's encode_ordinary; Hugging Face's encode with `encode_special_tokens`, without
// the post-processor): the added tokens that are not special (Qwen's <think>, <tool_call>,
// <|fim_prefix|> ...) are found in the text first, leftmost-longest, and are their ids (those marked
// "normalized" in the text after the normalizer); each text between them is normalized (NFC:
// data/unicode_nfc.h) and cut into pieces by the pattern (data/regex_split.h); a piece that is
// itself a token (tiktoken; tokenizer.json with ignore_merges) is that token, otherwise its bytes are
// merged by data/bpe_merge.h with tiktoken's ranks of the merged bytes or tokenizer.json's merge
// ranks. Special-token strings (<|endoftext|>, <|im_start|>, <|begin_of_text|> ...) in the text are
// plain text. Anything malformed in a file is an InputError naming the file and what is wrong.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tpt {

class BytePairTokenizer {
 public:
  // The pattern of Llama 3 (llama-models' Tokenizer.pat_str; Hugging Face's tokenizer.json Split).
  static constexpr const char* kLlama3Pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  // Qwen2's and Qwen3's (their tokenizer.json Split): Llama 3's with single digits.
  static constexpr const char* kQwen2Pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  // GPT-2's pattern (ByteLevel's use_regex in tokenizer.json).
  static constexpr const char* kGpt2Pattern =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  // llama-models' 256 special tokens, in id order after the base tokens.
  static const std::vector<std::string>& llama3_special_tokens();

  static BytePairTokenizer from_tiktoken_file(const std::string& path);  // tokenizer.model
  static BytePairTokenizer from_hf_file(const std::string& path);        // tokenizer.json
  // From the files' contents (`source` names them in errors).
  static BytePairTokenizer from_tiktoken(std::string_view contents, const std::string& source);
  static BytePairTokenizer from_hf_json(std::string_view contents, const std::string& source);

  // The tokens of `text` (no special tokens added), appended to `out`.
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode(std::string_view text) const;
  // Bytes of the tokens; a special token is its string; an id without a token becomes U+FFFD.
  std::string decode(std::span<const int32_t> tokens) const;
  // The pre-tokenizer's pieces of `text` (views into it).
  std::vector<std::string_view> pretokenize(std::string_view text) const;

  int32_t vocab_size() const;                  // largest id + 1 (base and special tokens)
  const std::vector<int32_t>& prefix() const;  // special tokens before a text: {<|begin_of_text|>}
  const std::vector<int32_t>& suffix() const;  // after a text (none for Llama 3)
  int32_t eod() const;                         // <|end_of_text|> (or <|endoftext|>: Qwen); -1 if none
  bool is_stop(int32_t id) const;              // eod, <|eot_id|>, <|eom_id|>, <|im_end|>
  int32_t id_of(std::string_view token_bytes) const;  // a base token's or special token's id; -1
  const std::string& pattern() const;
  // "Llama 3 tiktoken (tokenizer.model)" / "Qwen2 tokenizer.json (byte-level BPE)" / ...
  std::string name() const;
  const std::string& family() const;  // "Llama 3", "Qwen2", "GPT-2"

  struct Impl;  // the tables (byte_pair_tokenizer.cpp), shared by copies

 private:
  explicit BytePairTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view text, std::vector<int32_t>& out) const;  // NFC, then added, pieces
  void encode_pieces(std::string_view text, std::vector<int32_t>& out) const;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tpt
