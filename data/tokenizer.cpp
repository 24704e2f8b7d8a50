#include "data/tokenizer.h"

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

}  // namespace tpt
