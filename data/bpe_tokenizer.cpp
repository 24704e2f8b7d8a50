#include "data/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_rules.h"

namespace tpt {
namespace {

struct CodeRange {
  uint32_t lo, hi;
};
#include "data/bpe_unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&ranges)[N], uint32_t cp) {
  auto it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                             [](uint32_t c, const CodeRange& r) { return c < r.lo; });
  return it != std::begin(ranges) && cp <= std::prev(it)->hi;
}

// The classes of GPT-2's regex: \s (Unicode White_Space, as Python's regex module), \p{L}, \p{N},
// and everything else.
enum class CharClass { Space, Letter, Number, Other };

CharClass classify(uint32_t cp) {
  if (cp < 0x80) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::Space;
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::Letter;
    if (cp >= '0' && cp <= '9') return CharClass::Number;
    return CharClass::Other;
  }
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
      cp == 0x202F || cp == 0x205F || cp == 0x3000)
    return CharClass::Space;
  if (in_ranges(kLetters, cp)) return CharClass::Letter;
  if (in_ranges(kNumbers, cp)) return CharClass::Number;
  return CharClass::Other;
}

struct CodePoint {
  uint32_t cp;     // 0xFFFFFFFF for a byte that is not valid UTF-8 (an "other" character)
  size_t pos;      // byte offset in the text
  CharClass cls;
};

// Decodes UTF-8; each invalid byte becomes one code point of its own.
std::vector<CodePoint> decode_utf8(std::string_view s) {
  std::vector<CodePoint> out;
  out.reserve(s.size());
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = b[i];
    size_t len = 0;
    uint32_t cp = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) len = 1, cp = c;
    else if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned cc = b[i + k];
      ok = k == 1 ? (cc >= lo && cc <= hi) : (cc >= 0x80 && cc <= 0xBF);
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {
      out.push_back({0xFFFFFFFFu, i, CharClass::Other});
      ++i;
      continue;
    }
    out.push_back({cp, i, classify(cp)});
    i += len;
  }
  return out;
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else if (cp < 0x800) {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s.push_back(char(0xE0 | (cp >> 12)));
    s.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(char(0xF0 | (cp >> 18)));
    s.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's bytes_to_unicode: printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves,
// the other 68 bytes, in order, for U+0100, U+0101, ...
struct ByteMap {
  std::array<std::string, 256> symbol;
  std::unordered_map<uint32_t, uint8_t> byte_of;  // code point -> byte
  ByteMap() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? b : next++;
      append_utf8(symbol[b], cp);
      byte_of[cp] = uint8_t(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// A symbol string ("Ġthe") as the bytes its characters stand for (" the"); false if one stands for none.
bool symbols_to_bytes(std::string_view sym, std::string& out) {
  const ByteMap& m = byte_map();
  out.clear();
  for (const CodePoint& c : decode_utf8(sym)) {
    auto b = m.byte_of.find(c.cp);
    if (c.cp == 0xFFFFFFFFu || b == m.byte_of.end()) return false;
    out.push_back(static_cast<char>(b->second));
  }
  return true;
}

// The symbols of some bytes (for messages).
std::string bytes_to_symbols(std::string_view bytes) {
  std::string s;
  for (char c : bytes) s += byte_map().symbol[static_cast<uint8_t>(c)];
  return s;
}

// A string as a JSON literal (invalid UTF-8 replaced), for error messages.
std::string json_quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}


}  // namespace

const std::string& BpeTokenizer::byte_symbol(uint8_t b) { return byte_map().symbol[b]; }

std::vector<std::string_view> BpeTokenizer::pretokenize(std::string_view text) {
  const std::vector<CodePoint> cps = decode_utf8(text);
  const size_t n = cps.size();
  auto at = [&](size_t i) { return i < n ? cps[i].pos : text.size(); };  // byte offset of code point i
  auto is = [&](size_t i, char c) { return i < n && cps[i].cp == uint32_t(static_cast<unsigned char>(c)); };
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < n) {
    size_t end = i + 1;
    const CharClass c = cps[i].cls;
    if (is(i, '\'') && (is(i + 1, 's') || is(i + 1, 't') || is(i + 1, 'm') || is(i + 1, 'd'))) {
      end = i + 2;  // 's 't 'm 'd
    } else if (is(i, '\'') && ((is(i + 1, 'r') && is(i + 2, 'e')) || (is(i + 1, 'v') && is(i + 2, 'e')) ||
                               (is(i + 1, 'l') && is(i + 2, 'l')))) {
      end = i + 3;  // 're 've 'll
    } else if (c != CharClass::Space || (is(i, ' ') && i + 1 < n && cps[i + 1].cls != CharClass::Space)) {
      // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional space, then a run of one class
      const size_t first = c == CharClass::Space ? i + 1 : i;
      end = first + 1;
      while (end < n && cps[end].cls == cps[first].cls) ++end;
    } else {
      // "\s+(?!\S)": whitespace up to the end, or up to (not including) the last whitespace
      // character before a non-space; "\s+": a single whitespace character before a non-space.
      size_t run = i + 1;
      while (run < n && cps[run].cls == CharClass::Space) ++run;
      end = run == n || run - i == 1 ? run : run - 1;
    }
    out.push_back(text.substr(at(i), at(end) - at(i)));
    i = end;
  }
  return out;
}

BpeTokenizer::BpeTokenizer(const std::string& vocab_file, const std::string& merge_file) {
  load(read_regular_file(vocab_file, "--vocab-file", kMaxTokenizerFileBytes),
       read_regular_file(merge_file, "--merge-file", kMaxTokenizerFileBytes), vocab_file, merge_file);
}

BpeTokenizer BpeTokenizer::from_strings(std::string_view vocab_json, std::string_view merges_txt,
                                        const std::string& source) {
  BpeTokenizer t;
  t.load(vocab_json, merges_txt, source + " (vocab)", source + " (merges)");
  return t;
}

void BpeTokenizer::load(std::string_view vocab_json, std::string_view merges_txt, const std::string& vocab_name,
                        const std::string& merges_name) {
  nlohmann::json v;
  try {
    v = nlohmann::json::parse(vocab_json);
  } catch (const nlohmann::json::exception& e) {
    input_error(vocab_name + ": not valid JSON: " + e.what());
  }
  if (!v.is_object() || v.empty()) input_error(vocab_name + ": expected a JSON object {token: id, ...}");
  int64_t max_id = -1;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= std::numeric_limits<int32_t>::max())
      input_error(vocab_name + ": token " + json_quoted(it.key()) + " has id " + it.value().dump() +
                  ", not a non-negative integer");
    max_id = std::max(max_id, it.value().get<int64_t>());
  }
  id_to_token_.assign(size_t(max_id + 1), std::string());
  std::vector<bool> seen(size_t(max_id + 1), false);
  for (auto it = v.begin(); it != v.end(); ++it) {
    const auto id = it.value().get<int32_t>();
    if (seen[size_t(id)])
      input_error(vocab_name + ": id " + std::to_string(id) + " is given to two tokens (" +
                  json_quoted(id_to_token_[size_t(id)]) + " and " + json_quoted(it.key()) + ")");
    seen[size_t(id)] = true;
    id_to_token_[size_t(id)] = it.key();
    token_to_id_[it.key()] = id;
    std::string bytes;
    if (symbols_to_bytes(it.key(), bytes)) bytes_to_id_.emplace(std::move(bytes), id);
  }
  auto eod = token_to_id_.find("<|endoftext|>");
  eod_ = eod == token_to_id_.end() ? -1 : eod->second;

  // merges.txt: an optional "#version: ..." line, then "left right" per line, best first.
  size_t line_no = 0, pos = 0;
  int32_t rank = 0;
  while (pos < merges_txt.size()) {
    size_t nl = merges_txt.find('\n', pos);
    if (nl == std::string_view::npos) nl = merges_txt.size();
    std::string_view line = merges_txt.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == 0 || sp == std::string_view::npos || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string_view::npos)
      input_error(merges_name + ":" + std::to_string(line_no) + ": expected \"left right\", got \"" + std::string(line) +
                  "\"");
    // A pair whose symbols stand for no bytes never occurs in a text: it keeps its line but is not stored.
    std::string left, right, key;
    if (symbols_to_bytes(line.substr(0, sp), left) && symbols_to_bytes(line.substr(sp + 1), right)) {
      bpe::pair_key(key, left, right);
      merge_rank_.emplace(key, rank);  // the first of duplicates wins
    }
    ++rank;
  }
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const bool cacheable = piece.size() <= bpe::PieceCache::kMaxPieceBytes;
  bpe::PieceCache::Map* cache = nullptr;
  if (cacheable) {
    cache = &cache_.get();
    auto hit = cache->find(piece);
    if (hit != cache->end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  thread_local std::vector<uint32_t> starts;
  thread_local std::string key;
  bpe::merge_parts(piece, [&](std::string_view l, std::string_view r) {
    bpe::pair_key(key, l, r);
    auto it = merge_rank_.find(std::string_view(key));
    return it == merge_rank_.end() ? bpe::kNoRank : it->second;
  }, starts);
  const size_t first = out.size();
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t end = i + 1 < starts.size() ? starts[i + 1] : piece.size();
    const std::string_view part = piece.substr(starts[i], end - starts[i]);
    auto it = bytes_to_id_.find(part);
    if (it == bytes_to_id_.end()) {
      out.resize(first);
      input_error("BPE: the vocabulary has no token " + json_quoted(bytes_to_symbols(part)) + " (in the text piece " +
                  json_quoted(std::string(piece)) + "); GPT-2's vocab.json has every byte");
    }
    out.push_back(it->second);
  }
  if (cacheable) cache->emplace(std::string(piece), std::vector<int32_t>(out.begin() + std::ptrdiff_t(first), out.end()));
}

void BpeTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  for (std::string_view piece : pretokenize(text)) encode_piece(piece, out);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode(text, out);
  return out;
}

std::string BpeTokenizer::decode(std::span<const int32_t> tokens) const {
  const ByteMap& m = byte_map();
  std::string out;
  for (int32_t id : tokens) {
    if (id < 0 || size_t(id) >= id_to_token_.size() || (id_to_token_[size_t(id)].empty() && id != eod_)) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      continue;
    }
    const std::string& tok = id_to_token_[size_t(id)];
    // Each character of a token stands for one byte; characters outside the map (an added special
    // token's) are kept as they are.
    for (const CodePoint& c : decode_utf8(tok)) {
      auto b = m.byte_of.find(c.cp);
      if (c.cp != 0xFFFFFFFFu && b != m.byte_of.end()) {
        out.push_back(static_cast<char>(b->second));
      } else if (c.cp == 0xFFFFFFFFu) {
        out.push_back(tok[c.pos]);
      } else {
        append_utf8(out, c.cp);
      }
    }
  }
  return out;
}

}  // namespace tpt
