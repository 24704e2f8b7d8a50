#include "data/tokenizer.h"

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/byte_pair_tokenizer.h"

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

Tokenizer::Tokenizer(const TokenizerFiles& f) {
  const int kinds = !f.vocab_file.empty() + !f.tokenizer_model.empty() + !f.tokenizer_file.empty();
  if (kinds > 1)
    input_error("give one tokenizer: --vocab-file/--merge-file (GPT-2 BPE), --tokenizer-model (tiktoken "
                "tokenizer.model) or --tokenizer-file (Hugging Face tokenizer.json), not several");
  if (!f.vocab_file.empty()) bpe_ = std::make_shared<const BpeTokenizer>(f.vocab_file, f.merge_file);
  if (!f.tokenizer_model.empty())
    pair_ = std::make_shared<const BytePairTokenizer>(BytePairTokenizer::from_tiktoken_file(f.tokenizer_model));
  if (!f.tokenizer_file.empty())
    pair_ = std::make_shared<const BytePairTokenizer>(BytePairTokenizer::from_hf_file(f.tokenizer_file));
}

Tokenizer::Tokenizer(const std::string& vocab_file, const std::string& merge_file)
    : Tokenizer(TokenizerFiles{vocab_file, merge_file, "", ""}) {}

Tokenizer::~Tokenizer() = default;

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (pair_) pair_->encode(text, out);
  else if (bpe_) bpe_->encode(text, out);
  else ByteTokenizer::encode(text, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode(text, out);
  return out;
}

void Tokenizer::encode_document(std::string_view text, bool append_eod, std::vector<int32_t>& out) const {
  const std::vector<int32_t>& pre = prefix();
  out.insert(out.end(), pre.begin(), pre.end());
  encode(text, out);
  if (pair_) out.insert(out.end(), pair_->suffix().begin(), pair_->suffix().end());
  if (append_eod) out.push_back(eod());
}

std::string Tokenizer::decode(std::span<const int32_t> tokens) const {
  if (pair_) return pair_->decode(tokens);
  return bpe_ ? bpe_->decode(tokens) : ByteTokenizer::decode(tokens);
}

int32_t Tokenizer::vocab_size() const {
  if (pair_) return pair_->vocab_size();
  return bpe_ ? bpe_->vocab_size() : ByteTokenizer::kVocabSize;
}

int32_t Tokenizer::eod() const {
  if (pair_) return pair_->eod();
  return bpe_ ? bpe_->eod() : ByteTokenizer::kEod;
}

const std::vector<int32_t>& Tokenizer::prefix() const {
  static const std::vector<int32_t> none;
  return pair_ ? pair_->prefix() : none;
}

bool Tokenizer::is_stop(int32_t id) const {
  if (pair_) return pair_->is_stop(id);
  return id == eod() && id >= 0;
}

std::string Tokenizer::name() const {
  if (pair_) return pair_->name();
  return bpe_ ? "GPT-2 BPE" : "byte-level";
}

}  // namespace tpt
