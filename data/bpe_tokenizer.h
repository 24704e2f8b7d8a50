// GPT-2's byte-level BPE tokenizer from Hugging Face's vocab.json + merges.txt (the files of the
// "gpt2" model; Megatron's --vocab-file / --merge-file), for `tptrain preprocess` and
// `tptrain generate`:
//   1. pre-tokenisation: GPT-2's regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      implemented by hand over UTF-8 code points (Unicode 14 letters / numbers; bytes that are not
//      valid UTF-8 count as "other" characters);
//   2. every byte of a piece becomes one printable character (GPT-2's bytes_to_unicode, e.g. the
//      space is "Ġ"), and the pair of adjacent symbols with the lowest merge rank is merged (the
//      leftmost first), until no pair has a rank (data/bpe_merge.h, the loop the Llama 3 tokenizer
//      shares);
//   3. each symbol is looked up in vocab.json.
// The tokenizer is immutable once loaded and may encode on several threads at once.
// "<|endoftext|>" (if in the vocabulary) is the end-of-document token; text is never scanned for
// special tokens (as Megatron's GPT-2 tokenizer: "<|endoftext|>" in text is encoded as text).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/bpe_merge.h"

namespace tpt {

// The largest tokenizer file read (vocab.json, merges.txt, tokenizer.model, tokenizer.json): the
// largest published ones are ~35 MB; a file past this is not a tokenizer (InputError).
constexpr uint64_t kMaxTokenizerFileBytes = uint64_t(1) << 30;

class BpeTokenizer {
 public:
  // Reads the two files; InputError naming the file (and line) on anything malformed.
  BpeTokenizer(const std::string& vocab_file, const std::string& merge_file);
  // From the files' contents (`source` names them in errors).
  static BpeTokenizer from_strings(std::string_view vocab_json, std::string_view merges_txt,
                                   const std::string& source = "(in memory)");

  // Tokens of `text` appended to `out`. InputError if a symbol is missing from the vocabulary
  // (GPT-2's has all 256 byte symbols, so every text encodes).
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  std::vector<int32_t> encode(std::string_view text) const;
  // Bytes of the tokens; an id not in the vocabulary becomes U+FFFD.
  std::string decode(std::span<const int32_t> tokens) const;

  int32_t vocab_size() const { return int32_t(id_to_token_.size()); }  // largest id + 1
  int32_t eod() const { return eod_; }                                  // "<|endoftext|>", -1 if absent
  const std::string& token(int32_t id) const { return id_to_token_.at(size_t(id)); }

  // Step 1 alone: the pieces of `text` (views into it), in order; they concatenate to `text`.
  static std::vector<std::string_view> pretokenize(std::string_view text);
  // GPT-2's bytes_to_unicode: the UTF-8 of the printable character that stands for byte b.
  static const std::string& byte_symbol(uint8_t b);

 private:
  BpeTokenizer() = default;
  void load(std::string_view vocab_json, std::string_view merges_txt, const std::string& vocab_name,
            const std::string& merges_name);
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;
  bpe::StringMap<int32_t> bytes_to_id_;  // the bytes a token's symbols stand for -> id
  bpe::StringMap<int32_t> merge_rank_;   // left bytes' length (4 bytes), left, right -> rank (line order)
  int32_t eod_ = -1;
  bpe::PieceCache cache_;  // piece -> tokens, per thread
};

}  // namespace tpt
