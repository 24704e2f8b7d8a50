// Llama 3's tokenizer (data/byte_pair_tokenizer.h) on a small hand-made vocabulary: Llama 3's
// pre-tokenization pattern (expected pieces from Python's `regex` module on the same pattern), the
// rank-based merges worked out by hand, the same vocabulary as a Hugging Face tokenizer.json (built
// here the way Hugging Face converts tiktoken files) giving the same ids, malformed files, the
// shared merge loop's two paths, threads; the same vocabulary as a Qwen2 / Qwen3 tokenizer.json (NFC,
// single digits, added tokens found in the text). The real Llama 3 files are checked against tiktoken
// in tests/cli/tokenizer_llama3.sh, Qwen3's against Hugging Face's tokenizers in tokenizer_qwen.sh.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/bpe_merge.h"
#include "data/bpe_tokenizer.h"
#include "data/byte_pair_tokenizer.h"
#include "data/regex_split.h"
#include "data/tokenizer.h"
#include "data/unicode_nfc.h"

namespace tpt {
namespace {

using Pieces = std::vector<std::string>;
using Ids = std::vector<int32_t>;

std::string base64(const std::string& in) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += {a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], a[v & 63]};
  }
  if (in.size() - i == 1) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += {a[v >> 18], a[(v >> 12) & 63], '=', '='};
  } else if (in.size() - i == 2) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += {a[v >> 18], a[(v >> 12) & 63], a[(v >> 6) & 63], '='};
  }
  return out;
}

// The hand-made vocabulary: every byte at its own rank, then these merged tokens (ranks 256..269).
const std::vector<std::string> kMerged = {"he", "ll", "hell", "hello", " w", "or", " wor", "ld", " world",
                                          "xyz", "12", "123", "\r\n", "  "};
std::vector<std::string> ranked_tokens() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(1, char(b));
  t.insert(t.end(), kMerged.begin(), kMerged.end());
  return t;
}

std::string tiktoken_file(const std::vector<std::string>& tokens) {
  std::string s;
  for (size_t r = 0; r < tokens.size(); ++r) s += base64(tokens[r]) + " " + std::to_string(r) + "\n";
  return s;
}

std::string symbols(const std::string& bytes) {
  std::string s;
  for (char c : bytes) s += BpeTokenizer::byte_symbol(uint8_t(c));
  return s;
}

// Hugging Face's conversion of a tiktoken vocabulary (transformers' TikTokenConverter): vocab =
// byte symbols of each rank's bytes; merges = every split of a token into two tokens, by the
// token's rank, then the left and right ranks; the Llama 3 Split; <|begin_of_text|> first.
nlohmann::json hf_json(const std::vector<std::string>& tokens, bool ignore_merges = true) {
  using nlohmann::json;
  std::map<std::string, int> rank;
  for (size_t r = 0; r < tokens.size(); ++r) rank[tokens[r]] = int(r);
  json vocab = json::object(), merges = json::array();
  for (size_t r = 0; r < tokens.size(); ++r) {
    vocab[symbols(tokens[r])] = r;
    std::vector<std::tuple<int, int, std::string, std::string>> local;
    for (size_t k = 1; k < tokens[r].size(); ++k) {
      const std::string l = tokens[r].substr(0, k), rr = tokens[r].substr(k);
      if (rank.count(l) && rank.count(rr)) local.emplace_back(rank[l], rank[rr], l, rr);
    }
    std::sort(local.begin(), local.end());
    for (const auto& [a, b, l, rr] : local) merges.push_back(json::array({symbols(l), symbols(rr)}));
  }
  json added = json::array();
  const auto& names = BytePairTokenizer::llama3_special_tokens();
  for (size_t i = 0; i < names.size(); ++i)
    added.push_back({{"id", tokens.size() + i}, {"content", names[i]}, {"special", true}});
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         json::array({{{"type", "Split"},
                                       {"pattern", {{"Regex", BytePairTokenizer::kLlama3Pattern}}},
                                       {"behavior", "Isolated"},
                                       {"invert", false}},
                                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                       {"use_regex", false}}})}};
  const int bos = int(tokens.size());
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       json::array({{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
                    {{"type", "TemplateProcessing"},
                     {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                     {"special_tokens",
                      {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", json::array({bos})},
                                              {"tokens", json::array({"<|begin_of_text|>"})}}}}}}})}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr}, {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},      {"byte_fallback", false}, {"ignore_merges", ignore_merges},
                {"vocab", vocab},         {"merges", merges}};
  return j;
}

Pieces pieces(const BytePairTokenizer& t, const std::string& s) {
  Pieces out;
  for (std::string_view p : t.pretokenize(s)) out.emplace_back(p);
  return out;
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InputError (expected one mentioning " << needle << ")";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Expected pieces: Python's `regex` module, regex.findall(pattern, text), with Llama 3's pattern.
TEST(BytePairTokenizer, PretokenizeLikeTheLlama3Regex) {
  const BytePairTokenizer t = BytePairTokenizer::from_tiktoken(tiktoken_file(ranked_tokens()), "test");
  EXPECT_EQ(pieces(t, "Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces(t, "I'M we'LL don't you'Re"), (Pieces{"I", "'M", " we", "'LL", " don", "'t", " you", "'Re"}));
  EXPECT_EQ(pieces(t, "12345 67"), (Pieces{"123", "45", " ", "67"}));
  EXPECT_EQ(pieces(t, "a\r\n\r\nb"), (Pieces{"a", "\r\n\r\n", "b"}));
  EXPECT_EQ(pieces(t, "!!!\n\nx"), (Pieces{"!!!\n\n", "x"}));
  EXPECT_EQ(pieces(t, "x   y"), (Pieces{"x", "  ", " y"}));
  EXPECT_EQ(pieces(t, "end   "), (Pieces{"end", "   "}));
  EXPECT_EQ(pieces(t, "\U0001F642\U0001F642 ok"), (Pieces{"\U0001F642\U0001F642", " ok"}));
  EXPECT_EQ(pieces(t, "$100"), (Pieces{"$", "100"}));
  EXPECT_EQ(pieces(t, "caf\u00e9 \u65e5\u672c\u8a9e\u306e"), (Pieces{"caf\u00e9", " \u65e5\u672c\u8a9e\u306e"}));
  EXPECT_EQ(pieces(t, "(hello)"), (Pieces{"(hello", ")"}));
  EXPECT_EQ(pieces(t, "  \t\n  x"), (Pieces{"  \t\n", " ", " x"}));
  EXPECT_EQ(pieces(t, "a\u00a0b\u3000 c"), (Pieces{"a", "\u00a0b", "\u3000", " c"}));
  EXPECT_EQ(pieces(t, "3.14159"), (Pieces{"3", ".", "141", "59"}));
  EXPECT_EQ(pieces(t, "x\u180ey"), (Pieces{"x", "\u180ey"}));  // U+180E is no White_Space (PCRE2's \s has it)
  EXPECT_EQ(pieces(t, "'s's"), (Pieces{"'s", "'s"}));
  EXPECT_EQ(pieces(t, " 'tis"), (Pieces{" '", "tis"}));
  EXPECT_EQ(pieces(t, "\u0663\u0664\u0665\u0666"), (Pieces{"\u0663\u0664\u0665", "\u0666"}));
  EXPECT_EQ(pieces(t, ""), Pieces{});
  // bytes that are not UTF-8 are pieces of their own between the matches
  EXPECT_EQ(pieces(t, "ab\xff\xfe" "cd"), (Pieces{"ab", "\xff\xfe", "cd"}));
}

TEST(BytePairTokenizer, WhiteSpaceRewrite) {
  const std::string ws = RegexSplitter::rewrite_white_space("\\s");
  EXPECT_EQ(ws.front(), '[');
  EXPECT_NE(ws.find("\\x{3000}"), std::string::npos);
  EXPECT_EQ(RegexSplitter::rewrite_white_space("[^\\s\\p{L}]"), "[^" + ws.substr(1, ws.size() - 2) + "\\p{L}]");
  EXPECT_EQ(RegexSplitter::rewrite_white_space("\\S"), "[^" + ws.substr(1));
  EXPECT_EQ(RegexSplitter::rewrite_white_space("\\\\s"), "\\\\s");       // an escaped backslash, then "s"
  EXPECT_EQ(RegexSplitter::rewrite_white_space("\\Q\\s\\E"), "\\Q\\s\\E");  // quoted
  EXPECT_EQ(RegexSplitter::rewrite_white_space("[]\\s]"), "[]" + ws.substr(1));
  EXPECT_THROW(RegexSplitter("(unclosed", "f.json"), InputError);
}

// Merges by the ranks of the merged bytes, worked out by hand (pieces as above).
TEST(BytePairTokenizer, TiktokenEncodings) {
  const BytePairTokenizer t = BytePairTokenizer::from_tiktoken(tiktoken_file(ranked_tokens()), "test");
  EXPECT_EQ(t.vocab_size(), 270 + 256);
  EXPECT_EQ(t.prefix(), Ids{270});  // <|begin_of_text|>
  EXPECT_EQ(t.eod(), 271);          // <|end_of_text|>
  EXPECT_TRUE(t.is_stop(271) && t.is_stop(279) && t.is_stop(278) && !t.is_stop(270));  // eot_id, eom_id
  EXPECT_EQ(t.id_of("<|eot_id|>"), 279);
  EXPECT_EQ(t.id_of("hello"), 259);
  // whole pieces that are tokens
  EXPECT_EQ(t.encode("hello world"), (Ids{259, 264}));
  // "hellohe": h e l l o h e -> he(256) at 0, then he at 5 (256 < ll 257) -> ll -> hell -> hello: hello he
  // " worlds": " w" or ld -> " wor" -> " world" s
  EXPECT_EQ(t.encode("hellohe worlds"), (Ids{259, 256, 264, 's'}));
  // "xyz" is a token reached by no merge: a piece equal to it is it; inside a longer piece it is bytes
  EXPECT_EQ(t.encode("xyz"), (Ids{265}));
  EXPECT_EQ(t.encode("axyz"), (Ids{'a', 'x', 'y', 'z'}));
  // digits in threes: "123" "45"; "451" "2"
  EXPECT_EQ(t.encode("12345"), (Ids{267, '4', '5'}));
  EXPECT_EQ(t.encode("4512"), (Ids{'4', '5', '1', '2'}));
  // "\r\n\r\n" -> \r\n \r\n; "  " one token, " y" bytes
  EXPECT_EQ(t.encode("a\r\n\r\nb"), (Ids{'a', 268, 268, 'b'}));
  EXPECT_EQ(t.encode("x   y"), (Ids{'x', 269, ' ', 'y'}));
  // special-token strings are text
  const Ids special_text = t.encode("<|begin_of_text|>");
  EXPECT_TRUE(std::all_of(special_text.begin(), special_text.end(), [](int32_t id) { return id < 270; }));
  EXPECT_EQ(t.decode(special_text), "<|begin_of_text|>");
  EXPECT_EQ(t.decode(Ids{270, 259, 264, 271}), "<|begin_of_text|>hello world<|end_of_text|>");
  EXPECT_EQ(t.decode(Ids{9999, -1}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(BytePairTokenizer, TokenizerJsonGivesTheSameIds) {
  const std::vector<std::string> tokens = ranked_tokens();
  const BytePairTokenizer tk = BytePairTokenizer::from_tiktoken(tiktoken_file(tokens), "model");
  const BytePairTokenizer hf = BytePairTokenizer::from_hf_json(hf_json(tokens).dump(), "tokenizer.json");
  EXPECT_EQ(hf.vocab_size(), tk.vocab_size());
  EXPECT_EQ(hf.prefix(), tk.prefix());
  EXPECT_EQ(hf.eod(), tk.eod());
  EXPECT_EQ(hf.pattern(), tk.pattern());
  std::vector<std::string> texts = {"hello world", "hellohe worlds", "xyz axyz", "12345 4512", "a\r\n\r\nb  x   y",
                                    "<|end_of_text|> it's HELLO'LL", "caf\u00e9 \u65e5\u672c \U0001F642",
                                    std::string("\x00\xff\xc3(", 4)};
  std::mt19937 rng(3);
  const std::string alphabet = "helowrdxyz123 \r\n'!.";
  for (int n = 0; n < 200; ++n) {
    std::string s;
    for (int i = 0, len = int(rng() % 40); i < len; ++i) s += alphabet[rng() % alphabet.size()];
    texts.push_back(s);
  }
  for (const std::string& s : texts) {
    EXPECT_EQ(hf.encode(s), tk.encode(s)) << s;
    EXPECT_EQ(tk.decode(tk.encode(s)), s);
  }
  // without ignore_merges a piece is always merged from its bytes: "xyz" has no merges
  const BytePairTokenizer hf_merge_all = BytePairTokenizer::from_hf_json(hf_json(tokens, false).dump(), "t.json");
  EXPECT_EQ(hf_merge_all.encode("xyz hello"), (Ids{'x', 'y', 'z', ' ', 259}));

  // GPT-2's form: ByteLevel with its own regex, "a b" merges, no post-processor
  nlohmann::json g = hf_json(tokens);
  g["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  g.erase("post_processor");
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : g["model"]["merges"]) merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  g["model"]["merges"] = merges;
  const BytePairTokenizer gpt2 = BytePairTokenizer::from_hf_json(g.dump(), "gpt2.json");
  EXPECT_TRUE(gpt2.prefix().empty());
  EXPECT_EQ(gpt2.encode("hello 12345"), (Ids{259, ' ', 267, '4', '5'}));  // GPT-2: " ?\p{N}+", so " 12345"
}

TEST(BytePairTokenizer, BadTiktokenFiles) {
  const std::string good = tiktoken_file(ranked_tokens());
  auto load = [](const std::string& s) { return [s] { BytePairTokenizer::from_tiktoken(s, "tok.model"); }; };
  expect_error(load(good + "@@@@ 270\n"), "tok.model:271: bad base64");
  expect_error(load(good + "aGk 270\n"), "bad base64");     // unpadded
  expect_error(load(good + "aG=k 270\n"), "bad base64");    // padding inside
  expect_error(load(good + "aGk= 269\n"), "duplicate rank 269 (also on line 270)");
  expect_error(load(good + "aGVsbG8= 270\n"), "duplicate token \"hello\"");
  expect_error(load(good + "aGk= 270 9\n"), "expected 2 fields");
  expect_error(load(good + "aGk= -1\n"), "is not a non-negative integer");
  expect_error(load(good + "aGk= 271\n"), "rank 270 is missing");
  expect_error(load(""), "no tokens");
  std::vector<std::string> no_a = ranked_tokens();
  no_a['a'] = "aa";
  expect_error(load(tiktoken_file(no_a)), "no token for the single byte 0x61");
  expect_error([] { BytePairTokenizer::from_tiktoken_file("/nonexistent/tokenizer.model"); },
               "--tokenizer-model: cannot open /nonexistent/tokenizer.model: No such file");
  // blank lines are skipped, CRLF line ends accepted
  std::string crlf;
  for (char c : good) crlf += c == '\n' ? std::string("\r\n\r\n") : std::string(1, c);
  EXPECT_EQ(BytePairTokenizer::from_tiktoken(crlf, "crlf").encode("hello"), (Ids{259}));
}

TEST(BytePairTokenizer, BadTokenizerJson) {
  const std::vector<std::string> tokens = ranked_tokens();
  auto load = [](const nlohmann::json& j) { return [s = j.dump()] { BytePairTokenizer::from_hf_json(s, "t.json"); }; };
  nlohmann::json j = hf_json(tokens);
  expect_error([] { BytePairTokenizer::from_hf_json("{\"model\": ", "t.json"); }, "t.json: not valid JSON");
  { auto k = j; k["model"].erase("vocab"); expect_error(load(k), "no model.vocab"); }
  { auto k = j; k["model"].erase("merges"); expect_error(load(k), "no model.merges"); }
  { auto k = j; k.erase("model"); expect_error(load(k), "no \"model\""); }
  { auto k = j; k["model"]["type"] = "WordPiece"; expect_error(load(k), "model.type \"WordPiece\""); }
  { auto k = j; k["pre_tokenizer"]["pretokenizers"][0]["type"] = "Whitespace"; expect_error(load(k), "unknown pre-tokenizer Whitespace"); }
  { auto k = j; k["pre_tokenizer"] = {{"type", "Metaspace"}}; expect_error(load(k), "unknown pre-tokenizer Metaspace"); }
  { auto k = j; k["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; expect_error(load(k), "behavior \"Removed\""); }
  { auto k = j; k["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(oops"}};
    expect_error(load(k), "unknown tokenizer family: pre-tokenizer regex \"(oops\", normalizer none; not Llama 3: "
                          "the regex differs at character 1 (\"oops\" where Llama 3's has \"?i:'s|'t|'re|'ve\")"); }
  { auto k = j; k["pre_tokenizer"] = nullptr; expect_error(load(k), "no pre_tokenizer"); }
  { auto k = j; k["normalizer"] = {{"type", "NFC"}}; expect_error(load(k), "not Llama 3: the normalizer is NFC, Llama 3's none"); }
  { auto k = j; k["normalizer"] = {{"type", "Lowercase"}}; expect_error(load(k), "normalizer Lowercase is not supported"); }
  { auto k = j; k["model"]["merges"].push_back({"x", "q"}); expect_error(load(k), "not in model.vocab"); }
  { auto k = j; k["model"]["merges"].push_back("xq"); expect_error(load(k), "expected \"left right\""); }
  { auto k = j; k["model"]["vocab"]["\u4e00"] = 5; expect_error(load(k), "not made of byte-level symbols"); }
  { auto k = j; k["model"]["vocab"]["zz"] = 5; expect_error(load(k), "id 5 is given to two tokens"); }
  { auto k = j; k["model"]["vocab"].erase("a"); expect_error(load(k), "single byte 0x61"); }
  // an added token reusing a vocab id: named as such (it used to surface as a merge missing from model.vocab)
  { auto k = j; k["added_tokens"][0]["id"] = int(k["model"]["vocab"]["a"]);
    expect_error(load(k), "model.vocab: id " + std::to_string(int(k["model"]["vocab"]["a"])) +
                              " of token \"a\" is also the id of the added token \"<|begin_of_text|>\""); }
  { auto k = j; k["model"]["vocab"]["<|begin_of_text|>"] = k["added_tokens"][0]["id"];  // the same token: fine
    EXPECT_NO_THROW(BytePairTokenizer::from_hf_json(k.dump(), "t.json")); }
  { auto k = j; k["post_processor"] = {{"type", "RobertaProcessing"}}; expect_error(load(k), "post_processor RobertaProcessing"); }
  { auto k = j; k["model"]["byte_fallback"] = true; expect_error(load(k), "byte_fallback"); }
}

// A rank or id is bounded by how many entries the file holds, before it sizes a table: a rank of
// 2^31 (or 2^30, under int32's bound) in a tokenizer.model, an id of 2^30 - 1 in tokenizer.json.
TEST(BytePairTokenizer, RanksAndIdsBoundedByTheFile) {
  const std::string good = tiktoken_file(ranked_tokens());  // 270 lines and a line end: 271 "lines"
  auto tiktoken = [](const std::string& s) { return [s] { BytePairTokenizer::from_tiktoken(s, "tok.model"); }; };
  expect_error(tiktoken(good + "aGk= 2147483648\n"), "tok.model:271: rank 2147483648 is past the file's 272 lines");
  expect_error(tiktoken(good + "aGk= 1073741824\n"), "tok.model:271: rank 1073741824 is past the file's 272 lines");
  expect_error(tiktoken("aGk= 2\n"), "tok.model:1: rank 2 is past the file's 2 lines");
  expect_error(tiktoken(good + "aGk= 272\n"), "rank 272 is past the file's 272 lines");
  // the first rank past the bound is "missing", not "past the file"
  expect_error(tiktoken(good + "aGk= 271\n"), "rank 270 is missing");

  const nlohmann::json j = hf_json(ranked_tokens());  // 270 vocab entries, 256 added tokens: 526
  auto hf = [](const nlohmann::json& k) { return [s = k.dump()] { BytePairTokenizer::from_hf_json(s, "t.json"); }; };
  { auto k = j; k["added_tokens"][3]["id"] = (1 << 30) - 1;
    expect_error(hf(k), "t.json: added_tokens entry {");
    expect_error(hf(k), ": id 1073741823 is out of range for the file's 526 tokens (ids must be below 1052"); }
  { auto k = j; k["added_tokens"][0]["id"] = 1052; expect_error(hf(k), "id 1052 is out of range for the file's 526 tokens"); }
  { auto k = j; k["model"]["vocab"]["zz"] = 600000;
    expect_error(hf(k), "model.vocab: token \"zz\": id 600000 is out of range for the file's 527 tokens"); }
  { auto k = j; k["added_tokens"][255]["id"] = 1051;  // a hole below the bound is an unused id
    EXPECT_EQ(BytePairTokenizer::from_hf_json(k.dump(), "t.json").vocab_size(), 1052); }
}

// Tokenizer files are read through the regular-file rule: a device, a FIFO or a folder is refused at
// once, naming the path and its kind (a FIFO would block the run, /dev/zero would grow until bad_alloc).
TEST(BytePairTokenizer, FileKindsChecked) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("tpt_tok_kinds_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  expect_error([] { BytePairTokenizer::from_tiktoken_file("/dev/zero"); },
               "--tokenizer-model: /dev/zero: not a regular file (a character device)");
  expect_error([&] { BytePairTokenizer::from_tiktoken_file(dir + "/fifo"); },
               "--tokenizer-model: " + dir + "/fifo: not a regular file (a FIFO)");
  expect_error([&] { BytePairTokenizer::from_hf_file(dir + "/fifo"); }, "--tokenizer-file: " + dir + "/fifo: not a regular file (a FIFO)");
  expect_error([&] { BytePairTokenizer::from_hf_file(dir); }, "--tokenizer-file: " + dir + ": not a regular file (a directory)");
  {
    std::ofstream(dir + "/vocab.json") << "{}";
  }
  expect_error([&] { BpeTokenizer(dir + "/fifo", dir + "/vocab.json"); }, "--vocab-file: " + dir + "/fifo: not a regular file (a FIFO)");
  expect_error([&] { BpeTokenizer(dir + "/vocab.json", "/dev/zero"); },
               "--merge-file: /dev/zero: not a regular file (a character device)");
  std::filesystem::remove_all(dir);
}

// The merge loop's scan and heap paths agree, with ties between different splits of one token.
TEST(BytePairTokenizer, MergePathsAgree) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::map<std::string, int32_t> ranks;  // tiktoken-like: rank of the merged bytes
    for (int k = 0; k < 60; ++k) {
      std::string s;
      for (int i = 0, len = 2 + int(rng() % 4); i < len; ++i) s += char('a' + rng() % 3);
      ranks.emplace(s, int32_t(rng() % 40));
    }
    auto rank = [&](std::string_view l, std::string_view r) {
      auto it = ranks.find(std::string(l) + std::string(r));
      return it == ranks.end() ? bpe::kNoRank : it->second;
    };
    std::string piece;
    for (int i = 0, len = 1 + int(rng() % 250); i < len; ++i) piece += char('a' + rng() % 3);  // < kHeapMergeFrom
    std::vector<uint32_t> scan, heap;
    bpe::merge_parts(piece, rank, scan);
    bpe::merge_parts(piece, rank, heap, /*force_heap=*/true);
    EXPECT_EQ(scan, heap) << piece;
    ASSERT_FALSE(heap.empty());
    EXPECT_EQ(heap[0], 0u);
  }
  // a long piece (a page of CJK letters) takes the heap path and round-trips
  const BytePairTokenizer t = BytePairTokenizer::from_tiktoken(tiktoken_file(ranked_tokens()), "test");
  std::string cjk;
  for (int i = 0; i < 20000; ++i) cjk += "\u65e5\u672c";
  EXPECT_EQ(t.pretokenize(cjk).size(), 1u);
  EXPECT_EQ(t.decode(t.encode(cjk)), cjk);
  // long runs of one class
  for (const std::string& run : {std::string(1 << 21, ' ') + "x", std::string(1 << 20, 'a'), std::string(1 << 20, '\n'),
                                 std::string(1 << 20, '!') + "\n"}) {
    const auto p = t.pretokenize(run);
    size_t total = 0;
    for (auto v : p) total += v.size();
    EXPECT_EQ(total, run.size());
    EXPECT_LE(p.size(), 3u);
  }
}

TEST(BytePairTokenizer, ThreadsGiveTheSameIds) {
  const BytePairTokenizer t = BytePairTokenizer::from_tiktoken(tiktoken_file(ranked_tokens()), "test");
  std::vector<std::string> texts;
  std::mt19937 rng(5);
  const std::string alphabet = "helowrdxyz123 \r\n'!.";
  for (int n = 0; n < 400; ++n) {
    std::string s;
    for (int i = 0, len = int(rng() % 200); i < len; ++i) s += alphabet[rng() % alphabet.size()];
    texts.push_back(s);
  }
  std::vector<Ids> one(texts.size()), many(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) one[i] = t.encode(texts[i]);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (size_t i = size_t(k); i < texts.size(); i += 4) many[i] = t.encode(texts[i]);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(one, many);
}

TEST(BytePairTokenizer, TokenizerFace) {
  const std::string dir = ::testing::TempDir() + "/llama3_tokenizer_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.model") << tiktoken_file(ranked_tokens());
  std::ofstream(dir + "/tokenizer.json") << hf_json(ranked_tokens()).dump();
  TokenizerFiles f;
  f.tokenizer_model = dir + "/tokenizer.model";
  const Tokenizer tm(f);
  EXPECT_FALSE(tm.is_byte_level());
  EXPECT_FALSE(tm.is_bpe());
  EXPECT_EQ(tm.vocab_size(), 526);
  EXPECT_EQ(tm.eod(), 271);
  Ids doc;
  tm.encode_document("hello world", true, doc);
  EXPECT_EQ(doc, (Ids{270, 259, 264, 271}));
  doc.clear();
  tm.encode_document("hello world", false, doc);
  EXPECT_EQ(doc, (Ids{270, 259, 264}));
  TokenizerFiles h;
  h.tokenizer_file = dir + "/tokenizer.json";
  const Tokenizer th(h);
  doc.clear();
  th.encode_document("hello world", true, doc);
  EXPECT_EQ(doc, (Ids{270, 259, 264, 271}));
  EXPECT_NE(th.name(), tm.name());
  f.tokenizer_file = h.tokenizer_file;
  expect_error([&] { Tokenizer both(f); }, "give one tokenizer");
  // the byte-level tokenizer has no prefix
  const Tokenizer bytes(TokenizerFiles{});
  doc.clear();
  bytes.encode_document("hi", true, doc);
  EXPECT_EQ(doc, (Ids{'h', 'i', 256}));
}

// The hand-made vocabulary as Qwen's tokenizer.json: Qwen's regex (single digits) and NFC; Qwen3's
// added tokens, special (text in a text) or not (found in it, leftmost-longest; a special token
// found keeps an overlapping one from being found, as in Hugging Face's encode_special_tokens).
nlohmann::json qwen_json(const std::vector<std::string>& tokens) {
  nlohmann::json j = hf_json(tokens, false);
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = BytePairTokenizer::kQwen2Pattern;
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  const int n = int(tokens.size());
  j["added_tokens"] = nlohmann::json::array();
  int i = 0;
  for (const auto& [text, special] : std::vector<std::pair<std::string, bool>>{
           {"<|endoftext|>", true}, {"<|im_start|>", true}, {"<|im_end|>", true}, {"<ab>", true}, {"<think>", false},
           {"<th", false}, {"<a", false}, {"\xC3\xA9!", false}})
    j["added_tokens"].push_back({{"id", n + i++}, {"content", text}, {"special", special}, {"normalized", false},
                                 {"lstrip", false}, {"rstrip", false}, {"single_word", false}});
  j["added_tokens"].back()["normalized"] = true;  // "é!": found after NFC
  return j;
}

TEST(BytePairTokenizer, QwenTokenizerJson) {
  const std::vector<std::string> tokens = ranked_tokens();
  const int n = int(tokens.size()), eot = n, im_end = n + 2, think = n + 4, th = n + 5, a = n + 6, e_bang = n + 7;
  const BytePairTokenizer q = BytePairTokenizer::from_hf_json(qwen_json(tokens).dump(), "qwen.json");
  EXPECT_EQ(q.family(), "Qwen2 / Qwen3");
  EXPECT_EQ(q.name(), "Qwen2 / Qwen3 tokenizer.json (byte-level BPE)");
  EXPECT_TRUE(q.prefix().empty());
  EXPECT_TRUE(q.suffix().empty());
  EXPECT_EQ(q.eod(), eot);
  EXPECT_TRUE(q.is_stop(eot) && q.is_stop(im_end) && !q.is_stop(n + 1));
  EXPECT_EQ(pieces(q, "x 12345"), (Pieces{"x", " ", "1", "2", "3", "4", "5"}));  // Llama 3: "123", "45"
  EXPECT_EQ(q.encode("hello 123"), (Ids{259, ' ', '1', '2', '3'}));
  // added tokens: not special -> the id; special -> text; leftmost-longest; a special one shadows
  EXPECT_EQ(q.encode("x<think>y"), (Ids{'x', think, 'y'}));
  EXPECT_EQ(q.encode("<thin"), (Ids{th, 'i', 'n'}));
  EXPECT_EQ(q.encode("<|im_end|>"), (Ids{'<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>'}));  // no merge applies
  EXPECT_EQ(q.encode("<ab>"), (Ids{'<', 'a', 'b', '>'}));  // the special <ab> hides <a
  EXPECT_EQ(q.encode("<ac"), (Ids{a, 'c'}));
  EXPECT_EQ(q.decode(q.encode("x<think>y<|im_end|>")), "x<think>y<|im_end|>");
  // NFC before the pieces: "e" + U+0301 is U+00E9; "é!" (normalized) is found after NFC
  EXPECT_EQ(q.encode("cafe\xCC\x81"), q.encode("caf\xC3\xA9"));
  EXPECT_EQ(q.encode("cafe\xCC\x81"), (Ids{'c', 'a', 'f', 0xC3, 0xA9}));
  EXPECT_EQ(q.encode("e\xCC\x81!"), (Ids{e_bang}));
  // an unknown family names how it differs from each
  auto load = [](const nlohmann::json& j) { return [s = j.dump()] { BytePairTokenizer::from_hf_json(s, "q.json"); }; };
  const nlohmann::json j = qwen_json(tokens);
  { auto k = j; k["normalizer"] = nullptr;
    expect_error(load(k), "not Qwen2 / Qwen3: the normalizer is none, Qwen2 / Qwen3's NFC; not GPT-2: the regex differs at character 0"); }
  { auto k = j; k["added_tokens"][4]["single_word"] = true; expect_error(load(k), "added token \"<think>\": single_word true is not supported"); }
  { auto k = j; k["added_tokens"][0]["content"] = ""; expect_error(load(k), "has an empty \"content\""); }
}

// Expected: Python's unicodedata.normalize("NFC", ...); bytes that are not UTF-8 are kept.
TEST(BytePairTokenizer, Nfc) {
  auto nfc = [](const std::string& s) {
    std::string out = "<";
    nfc_append(s, out);
    return out.substr(1);
  };
  EXPECT_EQ(nfc("plain ASCII, Latin-1 \xC3\xA9"), "plain ASCII, Latin-1 \xC3\xA9");
  EXPECT_EQ(nfc("cafe\xCC\x81"), "caf\xC3\xA9");
  EXPECT_EQ(nfc("a\xCC\x82\xCC\xA3"), "\xE1\xBA\xAD");          // reordered marks: U+1EAD
  EXPECT_EQ(nfc("o\xCC\x82\xCC\x81"), "\xE1\xBB\x91");          // U+1ED1
  EXPECT_EQ(nfc("\xE2\x84\xAB\xE2\x84\xA6"), "\xC3\x85\xCE\xA9");  // Angstrom and Ohm signs: singletons
  EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // Hangul jamo: U+AC01
  EXPECT_EQ(nfc("\xEF\xA4\x80"), "\xE8\xB1\x88");               // U+F900 -> U+8C48
  EXPECT_EQ(nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");   // U+0958: a composition exclusion
  EXPECT_EQ(nfc(std::string("e\xFF\xCC\x81x\0y", 7)), std::string("e\xFF\xCC\x81x\0y", 7));  // an invalid byte ends a run
  EXPECT_EQ(nfc("e\xCC\x81\xFF" "e\xCC\x81"), "\xC3\xA9\xFF\xC3\xA9");
}

}  // namespace
}  // namespace tpt
