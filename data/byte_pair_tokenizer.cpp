#include "data/byte_pair_tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_rules.h"
#include "data/bpe_merge.h"
#include "data/bpe_tokenizer.h"
#include "data/regex_split.h"
#include "data/unicode_nfc.h"

namespace tpt {

struct BytePairTokenizer::Impl {
  enum class Ranks { OfBytes, OfMerges };  // tiktoken: rank of the merged bytes; tokenizer.json: merge's line
  // Added tokens as Hugging Face finds them in a text (leftmost-longest); a special one found is
  // left as text (encode_special_tokens), so it only keeps an overlapping one from being found.
  struct Added {
    int32_t id;
    bool special;
  };
  struct AddedSet {
    bpe::StringMap<Added> tokens;   // text -> token
    std::vector<size_t> lengths;    // of the tokens, longest first
    std::array<bool, 256> first{};  // a token starts with this byte
    bool cuts = false;              // holds a token that is not special (else it changes nothing)
  };
  std::string source, kind, family = "Llama 3";
  bool nfc = false;                    // the NFC normalizer
  AddedSet raw_added, normalized_added;  // found before / after the normalizer
  Ranks ranks = Ranks::OfBytes;
  bool ignore_merges = true;                  // a piece that is a token is that token
  std::vector<std::string> token;             // id -> bytes (a special token: its string)
  std::vector<char> has_token, special;       // id has a token; it is an added token
  bpe::StringMap<int32_t> base_id;            // bytes -> id of the base (mergeable) tokens
  bpe::StringMap<int32_t> special_id;         // added token string -> id
  bpe::StringMap<int32_t> merge_rank;         // bpe::pair_key(left, right) -> rank (tokenizer.json)
  std::unique_ptr<RegexSplitter> splitter;
  std::vector<int32_t> prefix, suffix, stops;
  int32_t eod = -1;
  bpe::PieceCache cache;
};

namespace {

using json = nlohmann::json;

std::string json_literal(std::string_view s) {  // a JSON literal, invalid UTF-8 replaced (for messages)
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

// Strict base64 (standard alphabet, padded to a multiple of 4); false if `in` is not.
bool base64_decode(std::string_view in, std::string& out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = (in[i + 3] == '=') + (in[i + 2] == '=' && in[i + 3] == '=');
    if (pad > 0 && !last) return false;
    int v[4];
    for (int k = 0; k < 4 - pad; ++k)
      if ((v[k] = value(in[i + k])) < 0) return false;
    if (pad == 0 && in[i + 2] == '=') return false;  // "ab=c"
    const uint32_t bits = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (pad < 2 ? uint32_t(v[2]) << 6 : 0) |
                          (pad < 1 ? uint32_t(v[3]) : 0);
    if ((pad == 2 && (bits & 0xFFFF)) || (pad == 1 && (bits & 0xFF))) return false;  // non-zero unused bits
    out.push_back(char(bits >> 16));
    if (pad < 2) out.push_back(char((bits >> 8) & 0xFF));
    if (pad < 1) out.push_back(char(bits & 0xFF));
  }
  return true;
}

// GPT-2's byte symbols (BpeTokenizer::byte_symbol) back to bytes.
const bpe::StringMap<uint8_t>& symbol_bytes() {
  static const bpe::StringMap<uint8_t> m = [] {
    bpe::StringMap<uint8_t> r;
    for (int b = 0; b < 256; ++b) r.emplace(BpeTokenizer::byte_symbol(uint8_t(b)), uint8_t(b));
    return r;
  }();
  return m;
}

// A byte-level symbol string ("Ġthe") as bytes (" the"); false if a character stands for no byte.
bool symbols_to_bytes(std::string_view sym, std::string& out) {
  out.clear();
  const auto& m = symbol_bytes();
  for (size_t i = 0; i < sym.size();) {
    const unsigned c = static_cast<unsigned char>(sym[i]);
    const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    auto it = m.find(sym.substr(i, len));
    if (it == m.end()) return false;
    out.push_back(char(it->second));
    i += len;
  }
  return true;
}

void set_token(BytePairTokenizer::Impl& t, int32_t id, std::string bytes, bool special) {
  if (size_t(id) >= t.token.size()) {
    t.token.resize(size_t(id) + 1);
    t.has_token.resize(size_t(id) + 1, 0);
    t.special.resize(size_t(id) + 1, 0);
  }
  t.token[size_t(id)] = std::move(bytes);
  t.has_token[size_t(id)] = 1;
  t.special[size_t(id)] = special;
}

// The stop and end-of-document ids, once the special tokens are known.
void find_stops(BytePairTokenizer::Impl& t) {
  auto id = [&](const char* s) {
    auto it = t.special_id.find(std::string_view(s));
    return it == t.special_id.end() ? -1 : it->second;
  };
  t.eod = id("<|end_of_text|>");
  if (t.eod < 0) t.eod = id("<|endoftext|>");
  for (const char* s : {"<|end_of_text|>", "<|endoftext|>", "<|eom_id|>", "<|eot_id|>", "<|im_end|>"})
    if (id(s) >= 0) t.stops.push_back(id(s));
}

// Every byte must be a base token: the merge loop starts from single bytes.
void check_bytes(const BytePairTokenizer::Impl& t) {
  for (int b = 0; b < 256; ++b)
    if (t.base_id.find(std::string_view(std::string(1, char(b)))) == t.base_id.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      input_error(t.source + ": no token for the single byte " + hex +
                  " (a byte-level BPE needs all 256 bytes as tokens)");
    }
}

// The tokenizer.json families: a Split regex (or ByteLevel's own) and a normalizer that PCRE2 and
// data/unicode_nfc.h are known to apply as Hugging Face does (tests/cli/tokenizer_*.sh).
struct Family {
  const char* name;
  const char* pattern;
  const char* normalizer;
};
constexpr Family kFamilies[] = {{"Llama 3", BytePairTokenizer::kLlama3Pattern, "none"},
                                {"Qwen2 / Qwen3", BytePairTokenizer::kQwen2Pattern, "NFC"},
                                {"GPT-2", BytePairTokenizer::kGpt2Pattern, "none"}};

// The family of a pattern and normalizer, or an InputError saying how they differ from each family's.
const Family& find_family(const std::string& pattern, const std::string& normalizer, const std::string& source) {
  std::string why;
  for (const Family& f : kFamilies) {
    const std::string_view want = f.pattern;
    if (pattern == want && normalizer == f.normalizer) return f;
    why += std::string("; not ") + f.name + ": ";
    if (pattern != want) {
      size_t k = 0;
      while (k < pattern.size() && k < want.size() && pattern[k] == want[k]) ++k;
      why += "the regex differs at character " + std::to_string(k) + " (" + json_literal(pattern.substr(k, 16)) +
             " where " + f.name + "'s has " + json_literal(want.substr(k, 16)) + ")";
    }
    if (normalizer != f.normalizer)
      why += std::string(pattern != want ? " and " : "") + "the normalizer is " + normalizer + ", " + f.name + "'s " +
             f.normalizer;
  }
  input_error(source + ": unknown tokenizer family: pre-tokenizer regex " + json_literal(pattern) + ", normalizer " +
              normalizer + why);
}

void add_to_set(BytePairTokenizer::Impl::AddedSet& set, const std::string& text, int32_t id, bool special) {
  set.first[static_cast<unsigned char>(text[0])] = true;
  set.cuts = set.cuts || !special;
  set.tokens.emplace(text, BytePairTokenizer::Impl::Added{id, special});
  auto at = std::lower_bound(set.lengths.begin(), set.lengths.end(), text.size(), std::greater<>());
  if (at == set.lengths.end() || *at != text.size()) set.lengths.insert(at, text.size());
}

// Hugging Face's added-token split: the leftmost-longest matches of the set's tokens; a token that
// is not special becomes its id, the text between (special tokens' included) goes to `text`.
template <class Text>
void split_added(std::string_view s, const BytePairTokenizer::Impl::AddedSet& set, std::vector<int32_t>& out, Text&& text) {
  if (!set.cuts) return text(s);
  size_t gap = 0;
  for (size_t i = 0; i < s.size();) {
    const BytePairTokenizer::Impl::Added* found = nullptr;
    size_t len = 0;
    if (set.first[static_cast<unsigned char>(s[i])])
      for (size_t l : set.lengths) {
        if (l > s.size() - i) continue;
        auto it = set.tokens.find(s.substr(i, l));
        if (it != set.tokens.end()) {
          found = &it->second, len = l;
          break;
        }
      }
    if (found == nullptr) {
      ++i;
      continue;
    }
    if (!found->special) {  // a special token found stays text
      if (i > gap) text(s.substr(gap, i - gap));
      out.push_back(found->id);
      gap = i + len;
    }
    i += len;
  }
  if (gap < s.size()) text(s.substr(gap));
}

}  // namespace

const std::vector<std::string>& BytePairTokenizer::llama3_special_tokens() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = {"<|begin_of_text|>",  "<|end_of_text|>",          "<|reserved_special_token_0|>",
                                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                                  "<|start_header_id|>", "<|end_header_id|>",         "<|eom_id|>",
                                  "<|eot_id|>",          "<|python_tag|>",            "<|image|>"};
    for (int i = 2; v.size() < 256; ++i) v.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
    return v;
  }();
  return names;
}

BytePairTokenizer BytePairTokenizer::from_tiktoken_file(const std::string& path) {
  return from_tiktoken(read_regular_file(path, "--tokenizer-model", kMaxTokenizerFileBytes), path);
}

BytePairTokenizer BytePairTokenizer::from_hf_file(const std::string& path) {
  return from_hf_json(read_regular_file(path, "--tokenizer-file", kMaxTokenizerFileBytes), path);
}

BytePairTokenizer BytePairTokenizer::from_tiktoken(std::string_view text, const std::string& source) {
  auto t = std::make_shared<Impl>();
  t->source = source;
  t->kind = "Llama 3 tiktoken (tokenizer.model)";
  t->ranks = Impl::Ranks::OfBytes;
  t->ignore_merges = true;
  std::vector<int64_t> line_of_rank;  // rank -> line (1-based), 0: not seen
  size_t pos = 0, line_no = 0;
  std::string bytes;
  auto bad = [&](const std::string& what) {
    input_error(source + ":" + std::to_string(line_no) + ": " + what + " (a tiktoken tokenizer.model has one " +
                "\"<base64 bytes> <rank>\" per line)");
  };
  constexpr int64_t kMaxRank = std::numeric_limits<int32_t>::max() - 1024;
  // The ranks are 0..n-1 for n tokens, one a line: a rank past the file's line count is refused
  // before it sizes a table (a rank of 2^31 would allocate 16 GiB).
  const int64_t lines = int64_t(std::count(text.begin(), text.end(), '\n')) + 1;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    // fields separated by white space
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      size_t j = i;
      while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
      if (j > i) fields.push_back(line.substr(i, j - i));
      i = j;
    }
    if (fields.empty()) continue;  // blank line
    if (fields.size() != 2) bad("expected 2 fields, got " + std::to_string(fields.size()) + ": " + json_literal(line.substr(0, 80)));
    if (!base64_decode(fields[0], bytes)) bad("bad base64 " + json_literal(fields[0].substr(0, 80)));
    const std::string_view r = fields[1];
    if (r.size() > 10 || r.find_first_not_of("0123456789") != std::string_view::npos)
      bad("rank " + json_literal(r.substr(0, 20)) + " is not a non-negative integer");
    const int64_t rank = std::stoll(std::string(r));
    if (rank >= lines)
      bad("rank " + std::string(r) + " is past the file's " + std::to_string(lines) +
          " lines (the ranks of n tokens are 0..n-1)");
    if (rank > kMaxRank) bad("rank " + std::string(r) + " is too large");
    if (size_t(rank) >= line_of_rank.size()) line_of_rank.resize(size_t(rank) + 1, 0);
    if (line_of_rank[size_t(rank)] != 0)
      bad("duplicate rank " + std::string(r) + " (also on line " + std::to_string(line_of_rank[size_t(rank)]) + ")");
    line_of_rank[size_t(rank)] = int64_t(line_no);
    auto [it, fresh] = t->base_id.emplace(bytes, int32_t(rank));
    if (!fresh)
      bad("duplicate token " + json_literal(bytes) + " (bytes of rank " + std::to_string(it->second) + " too)");
    set_token(*t, int32_t(rank), bytes, false);
  }
  const int64_t n = int64_t(t->base_id.size());
  if (n == 0) input_error(source + ": no tokens (not a tiktoken tokenizer.model?)");
  if (int64_t(line_of_rank.size()) != n) {
    const auto missing = std::find(line_of_rank.begin(), line_of_rank.end(), 0) - line_of_rank.begin();
    input_error(source + ": the ranks are not 0.." + std::to_string(n - 1) + " (rank " + std::to_string(missing) +
                " is missing, the largest is " + std::to_string(line_of_rank.size() - 1) + ")");
  }
  check_bytes(*t);
  const auto& names = llama3_special_tokens();
  for (size_t i = 0; i < names.size(); ++i) {
    set_token(*t, int32_t(n + int64_t(i)), names[i], true);
    t->special_id.emplace(names[i], int32_t(n + int64_t(i)));
  }
  t->prefix = {int32_t(n)};  // <|begin_of_text|>
  find_stops(*t);
  t->splitter = std::make_unique<RegexSplitter>(kLlama3Pattern, source);
  return BytePairTokenizer(std::move(t));
}

BytePairTokenizer BytePairTokenizer::from_hf_json(std::string_view text, const std::string& source) {
  auto t = std::make_shared<Impl>();
  t->source = source;
  t->kind = "tokenizer.json byte-level BPE";
  t->ranks = Impl::Ranks::OfMerges;
  auto bad = [&](const std::string& what) { input_error(source + ": " + what); };
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad("not a Hugging Face tokenizer.json (expected a JSON object)");
  try {
    // model: byte-level BPE
    if (!j.contains("model") || !j["model"].is_object()) bad("no \"model\" object (not a Hugging Face tokenizer.json?)");
    const json& model = j["model"];
    if (model.contains("type") && model["type"] != "BPE")
      bad("model.type " + model["type"].dump() + " is not supported (only BPE)");
    if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty())
      bad("no model.vocab object {token: id} (not a BPE tokenizer.json?)");
    if (!model.contains("merges") || !model["merges"].is_array()) bad("no model.merges list (not a BPE tokenizer.json?)");
    for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && !model[key].is_null() && !(model[key].is_string() && model[key].get<std::string>().empty()))
        bad(std::string("model.") + key + " " + model[key].dump() + " is not supported");
    if (model.value("byte_fallback", false)) bad("model.byte_fallback true is not supported (byte-level BPE only)");
    t->ignore_merges = model.value("ignore_merges", false);
    std::string normalizer = "none";
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const json& n = j["normalizer"];
      const std::string type = n.is_object() ? n.value("type", std::string()) : std::string();
      if (type != "NFC") bad("normalizer " + (type.empty() ? n.dump().substr(0, 80) : type) + " is not supported (none, or NFC)");
      normalizer = type;
    }
    t->nfc = normalizer == "NFC";

    // added tokens: special ones are plain text in a text, the others are found in it (Impl::Added)
    const bool has_added = j.contains("added_tokens") && !j["added_tokens"].is_null();
    if (has_added && !j["added_tokens"].is_array()) bad("added_tokens is not a list");
    // The ids are bounded by how many tokens the file lists (vocab + added tokens), checked before an
    // id sizes the id -> token tables (an id of 2^30 would allocate ~34 GiB): below twice that
    // count, so that unused ids (holes) stay possible but never outnumber the tokens.
    const int64_t entries = int64_t(model["vocab"].size()) + (has_added ? int64_t(j["added_tokens"].size()) : 0);
    auto check_bound = [&](int64_t id, const std::string& entry) {
      if (id >= 2 * entries)
        bad(entry + ": id " + std::to_string(id) + " is out of range for the file's " + std::to_string(entries) +
            " tokens (ids must be below " + std::to_string(2 * entries) +
            ", twice the tokens listed in model.vocab and added_tokens)");
    };
    if (has_added) {
      for (const json& a : j["added_tokens"]) {
        if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
            !a["content"].is_string() || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() >= (int64_t(1) << 30))
          bad("added_tokens entry " + a.dump().substr(0, 120) + " needs an integer \"id\" >= 0 and a \"content\" string");
        check_bound(a["id"].get<int64_t>(), "added_tokens entry " + a.dump().substr(0, 120));
        const auto id = a["id"].get<int32_t>();
        const std::string& content = a["content"].get_ref<const std::string&>();
        if (t->special_id.count(content)) bad("added token " + json_literal(content) + " is listed twice");
        if (content.empty()) bad("added_tokens entry " + a.dump().substr(0, 120) + " has an empty \"content\"");
        const bool special = a.value("special", true);
        for (const char* flag : {"single_word", "lstrip", "rstrip"})
          if (!special && a.value(flag, false))
            bad("added token " + json_literal(content) + ": " + flag + " true is not supported (only for special tokens)");
        add_to_set(a.value("normalized", !special) ? t->normalized_added : t->raw_added, content, id, special);
        set_token(*t, id, content, true);
        t->special_id.emplace(content, id);
      }
    }
    // vocab: byte-level symbols -> ids
    std::string bytes;
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= (int64_t(1) << 30))
        bad("model.vocab: token " + json_literal(it.key()) + " has id " + it.value().dump() + ", not an integer >= 0");
      check_bound(it.value().get<int64_t>(), "model.vocab: token " + json_literal(it.key()));
      const auto id = it.value().get<int32_t>();
      const bool as_bytes = symbols_to_bytes(it.key(), bytes);
      if (size_t(id) < t->special.size() && t->special[size_t(id)]) {  // also an added token: the same one
        const std::string& added = t->token[size_t(id)];
        if (it.key() != added && !(as_bytes && bytes == added))
          bad("model.vocab: id " + std::to_string(id) + " of token " + json_literal(it.key()) +
              " is also the id of the added token " + json_literal(added) + " (an id names one token)");
        continue;
      }
      if (!as_bytes)
        bad("model.vocab: token " + json_literal(it.key()) + " (id " + std::to_string(id) +
            ") is not made of byte-level symbols (only byte-level BPE is supported)");
      if (size_t(id) < t->has_token.size() && t->has_token[size_t(id)])
        bad("model.vocab: id " + std::to_string(id) + " is given to two tokens (" + json_literal(t->token[size_t(id)]) +
            " and " + json_literal(bytes) + " as bytes)");
      if (!t->base_id.emplace(bytes, id).second)
        bad("model.vocab: token " + json_literal(it.key()) + " is listed twice");
      set_token(*t, id, bytes, false);
    }
    check_bytes(*t);
    // merges: "a b" or ["a", "b"]; rank = position; the first of duplicates counts
    std::string left, right, key;
    int32_t rank = 0;
    for (const json& m : model["merges"]) {
      std::string a, b;
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == 0 || sp == std::string::npos || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
          bad("model.merges[" + std::to_string(rank) + "]: expected \"left right\", got " + json_literal(s));
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>(), b = m[1].get<std::string>();
      } else {
        bad("model.merges[" + std::to_string(rank) + "]: expected \"left right\" or [\"left\", \"right\"], got " +
            m.dump().substr(0, 80));
      }
      if (!symbols_to_bytes(a, left) || !symbols_to_bytes(b, right))
        bad("model.merges[" + std::to_string(rank) + "]: " + json_literal(a) + " " + json_literal(b) + " is not made of byte-level symbols");
      if (t->base_id.find(std::string_view(left + right)) == t->base_id.end())
        bad("model.merges[" + std::to_string(rank) + "]: " + json_literal(a) + " + " + json_literal(b) +
            " makes a token that is not in model.vocab");
      bpe::pair_key(key, left, right);
      t->merge_rank.emplace(key, rank);
      ++rank;
    }

    // pre-tokenizer: [Split(Regex, Isolated)] + ByteLevel(use_regex false), or ByteLevel(use_regex true)
    if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
      bad("no pre_tokenizer (a byte-level BPE needs ByteLevel, with a Split before it or its own regex)");
    std::vector<json> steps;
    const json& pt = j["pre_tokenizer"];
    if (pt.value("type", std::string()) == "Sequence") {
      if (!pt.contains("pretokenizers") || !pt["pretokenizers"].is_array()) bad("pre_tokenizer Sequence without pretokenizers");
      for (const json& p : pt["pretokenizers"]) steps.push_back(p);
    } else {
      steps.push_back(pt);
    }
    std::string pattern;
    bool byte_level = false;
    for (const json& p : steps) {
      const std::string type = p.is_object() ? p.value("type", std::string()) : std::string();
      if (type == "Split" && pattern.empty() && !byte_level) {
        if (!p.contains("pattern") || !p["pattern"].is_object() || !p["pattern"].contains("Regex") ||
            !p["pattern"]["Regex"].is_string())
          bad("pre_tokenizer Split: only a {\"Regex\": ...} pattern is supported, got " + p.value("pattern", json()).dump());
        if (p.value("behavior", std::string()) != "Isolated")
          bad("pre_tokenizer Split: behavior " + p.value("behavior", json()).dump() + " is not supported (only Isolated)");
        if (p.value("invert", false)) bad("pre_tokenizer Split: invert true is not supported");
        pattern = p["pattern"]["Regex"].get<std::string>();
        if (pattern.empty()) bad("pre_tokenizer Split: empty Regex");
      } else if (type == "ByteLevel" && !byte_level) {
        if (p.value("add_prefix_space", true)) bad("pre_tokenizer ByteLevel: add_prefix_space true is not supported");
        if (p.value("use_regex", true)) {
          if (!pattern.empty()) bad("pre_tokenizer: a Split and ByteLevel's own regex (use_regex true) together");
          pattern = kGpt2Pattern;
        }
        byte_level = true;
      } else {
        bad("unknown pre-tokenizer " + (type.empty() ? p.dump().substr(0, 80) : type) +
            " (supported: Split with a Regex and Isolated behavior, then ByteLevel; or ByteLevel alone)");
      }
    }
    if (!byte_level) bad("the pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)");
    if (pattern.empty()) bad("the pre_tokenizer splits nothing (ByteLevel with use_regex false and no Split)");
    const Family& family = find_family(pattern, normalizer, source);
    t->family = family.name;
    t->kind = t->family + " tokenizer.json (byte-level BPE)";
    t->splitter = std::make_unique<RegexSplitter>(pattern, source);

    // post-processor: the special tokens around a text
    if (j.contains("post_processor") && !j["post_processor"].is_null()) {
      const json& pp = j["post_processor"];
      std::vector<json> procs;
      if (pp.value("type", std::string()) == "Sequence" && pp.contains("processors") && pp["processors"].is_array())
        for (const json& p : pp["processors"]) procs.push_back(p);
      else procs.push_back(pp);
      for (const json& p : procs) {
        const std::string type = p.is_object() ? p.value("type", std::string()) : std::string();
        if (type == "ByteLevel") continue;  // offsets only
        if (type != "TemplateProcessing")
          bad("post_processor " + (type.empty() ? p.dump().substr(0, 80) : type) +
              " is not supported (TemplateProcessing, ByteLevel)");
        if (!p.contains("single") || !p["single"].is_array()) bad("post_processor TemplateProcessing without \"single\"");
        bool after = false;
        for (const json& item : p["single"]) {
          if (item.contains("Sequence")) {
            after = true;
            continue;
          }
          if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id"))
            bad("post_processor TemplateProcessing: item " + item.dump().substr(0, 80) + " is neither Sequence nor SpecialToken");
          const std::string name = item["SpecialToken"]["id"].get<std::string>();
          const json* ids = nullptr;
          if (p.contains("special_tokens") && p["special_tokens"].contains(name) && p["special_tokens"][name].contains("ids"))
            ids = &p["special_tokens"][name]["ids"];
          if (ids == nullptr || !ids->is_array())
            bad("post_processor TemplateProcessing: special token " + json_literal(name) + " has no ids in special_tokens");
          for (const json& id : *ids) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= int64_t(t->token.size()) ||
                !t->has_token[size_t(id.get<int64_t>())])
              bad("post_processor TemplateProcessing: special token " + json_literal(name) + " has id " + id.dump() +
                  ", which is no token");
            (after ? t->suffix : t->prefix).push_back(id.get<int32_t>());
          }
        }
      }
    }
  } catch (const json::exception& e) {
    bad(std::string("unexpected structure: ") + e.what());
  }
  find_stops(*t);
  return BytePairTokenizer(std::move(t));
}

std::vector<std::string_view> BytePairTokenizer::pretokenize(std::string_view text) const {
  std::vector<std::string_view> pieces;
  impl_->splitter->split(text, pieces);
  return pieces;
}

void BytePairTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const Impl& t = *impl_;
  if (t.ignore_merges) {  // most pieces of a text are tokens
    auto whole = t.base_id.find(piece);
    if (whole != t.base_id.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= bpe::PieceCache::kMaxPieceBytes;
  bpe::PieceCache::Map* cache = nullptr;
  if (cacheable) {
    cache = &t.cache.get();
    auto hit = cache->find(piece);
    if (hit != cache->end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  const size_t first = out.size();
  {
    thread_local std::vector<uint32_t> starts;
    thread_local std::string key;
    if (t.ranks == Impl::Ranks::OfBytes) {
      // tiktoken: the rank of the merged bytes (left and right are adjacent in the piece)
      bpe::merge_parts(piece, [&](std::string_view l, std::string_view r) {
        auto it = t.base_id.find(std::string_view(l.data(), l.size() + r.size()));
        return it == t.base_id.end() ? bpe::kNoRank : it->second;
      }, starts);
    } else {
      bpe::merge_parts(piece, [&](std::string_view l, std::string_view r) {
        bpe::pair_key(key, l, r);
        auto it = t.merge_rank.find(std::string_view(key));
        return it == t.merge_rank.end() ? bpe::kNoRank : it->second;
      }, starts);
    }
    for (size_t i = 0; i < starts.size(); ++i) {
      const size_t end = i + 1 < starts.size() ? starts[i + 1] : piece.size();
      auto it = t.base_id.find(piece.substr(starts[i], end - starts[i]));
      TPT_CHECK(it != t.base_id.end() && "merges only make tokens of the vocabulary; every byte is one");
      out.push_back(it->second);
    }
  }
  if (cacheable) cache->emplace(std::string(piece), std::vector<int32_t>(out.begin() + std::ptrdiff_t(first), out.end()));
}

void BytePairTokenizer::encode_pieces(std::string_view text, std::vector<int32_t>& out) const {
  thread_local std::vector<std::string_view> pieces;
  pieces.clear();
  impl_->splitter->split(text, pieces);
  for (std::string_view p : pieces) encode_piece(p, out);
}

void BytePairTokenizer::encode_normalized(std::string_view text, std::vector<int32_t>& out) const {
  thread_local std::string normalized;
  if (impl_->nfc) {
    normalized.clear();
    nfc_append(text, normalized);
    text = normalized;
  }
  split_added(text, impl_->normalized_added, out, [&](std::string_view s) { encode_pieces(s, out); });
}

void BytePairTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  split_added(text, impl_->raw_added, out, [&](std::string_view s) { encode_normalized(s, out); });
}

std::vector<int32_t> BytePairTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode(text, out);
  return out;
}

std::string BytePairTokenizer::decode(std::span<const int32_t> tokens) const {
  const Impl& t = *impl_;
  std::string out;
  for (int32_t id : tokens) {
    if (id >= 0 && size_t(id) < t.token.size() && t.has_token[size_t(id)]) out += t.token[size_t(id)];
    else out += "\xEF\xBF\xBD";  // U+FFFD
  }
  return out;
}

int32_t BytePairTokenizer::vocab_size() const { return int32_t(impl_->token.size()); }
const std::vector<int32_t>& BytePairTokenizer::prefix() const { return impl_->prefix; }
const std::vector<int32_t>& BytePairTokenizer::suffix() const { return impl_->suffix; }
int32_t BytePairTokenizer::eod() const { return impl_->eod; }
bool BytePairTokenizer::is_stop(int32_t id) const {
  return std::find(impl_->stops.begin(), impl_->stops.end(), id) != impl_->stops.end();
}
int32_t BytePairTokenizer::id_of(std::string_view s) const {
  auto sp = impl_->special_id.find(s);
  if (sp != impl_->special_id.end()) return sp->second;
  auto b = impl_->base_id.find(s);
  return b == impl_->base_id.end() ? -1 : b->second;
}
const std::string& BytePairTokenizer::pattern() const { return impl_->splitter->pattern(); }
std::string BytePairTokenizer::name() const { return impl_->kind; }
const std::string& BytePairTokenizer::family() const { return impl_->family; }

}  // namespace tpt
