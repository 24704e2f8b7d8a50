#include "data/tokenizer.h"

#include "data/bpe_tokenizer.h"

namespace tpt {

void ByteTokenizer::encode(std::string_view text, std::vector<int32_t>& out) {
  out.reserve(out.size() + text.size());
  for (char c : text) out.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<int32_t> out;
  encode(text, out);
  return out;
}

std::string ByteTokenizer::decode(std::span<const int32_t> tokens) {
  std::string s;
  s.reserve(tokens.size());
  for (int32_t t : tokens) {
    if (t >= 0 && t < 256) s.push_back(static_cast<char>(static_cast<unsigned char>(t)));
    else if (t == kEod) s += "<|endoftext|>";
    else s += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
  }
  return s;
}

Tokenizer::Tokenizer(const std::string& vocab_file, const std::string& merge_file) {
  if (!vocab_file.empty()) bpe_ = std::make_shared<const BpeTokenizer>(vocab_file, merge_file);
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (bpe_) bpe_->encode(text, out);
  else ByteTokenizer::encode(text, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode(text, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> tokens) const {
  return bpe_ ? bpe_->decode(tokens) : ByteTokenizer::decode(tokens);
}

int32_t Tokenizer::vocab_size() const { return bpe_ ? bpe_->vocab_size() : ByteTokenizer::kVocabSize; }
int32_t Tokenizer::eod() const { return bpe_ ? bpe_->eod() : ByteTokenizer::kEod; }

}  // namespace tpt
