// GPT-2 byte-level BPE (data/bpe_tokenizer.h): pre-tokenisation as GPT-2's regex splits text, a
// small hand-made vocab.json / merges.txt whose encodings are worked out by hand below, and round
// trips of arbitrary UTF-8 (and non-UTF-8) text.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/bpe_tokenizer.h"

namespace tpt {
namespace {

using Pieces = std::vector<std::string>;

Pieces pieces(const std::string& s) {
  Pieces out;
  for (std::string_view p : BpeTokenizer::pretokenize(s)) out.emplace_back(p);
  return out;
}

// Expected splits are what Python's `regex` module gives for GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
TEST(BpeTokenizer, PretokenizeLikeGpt2Regex) {
  EXPECT_EQ(pieces("hello world"), (Pieces{"hello", " world"}));
  EXPECT_EQ(pieces("it's 12!"), (Pieces{"it", "'s", " 12", "!"}));
  // a whitespace run before a word keeps its last space for the word ("\s+(?!\S)"); a lone "\n"
  // before a word is its own piece ("\s+")
  EXPECT_EQ(pieces("he  \nhe"), (Pieces{"he", "  ", "\n", "he"}));
  EXPECT_EQ(pieces(" \t end  "), (Pieces{" \t", " end", "  "}));
  // contractions are lower-case only; an apostrophe that starts no contraction is "other"
  EXPECT_EQ(pieces("I'M we'll 'll''s"), (Pieces{"I", "'", "M", " we", "'ll", " '", "ll", "''", "s"}));
  EXPECT_EQ(pieces("you're I've I'd don't"), (Pieces{"you", "'re", " I", "'ve", " I", "'d", " don", "'t"}));
  // Unicode letters, numbers (Arabic-Indic digits), punctuation and white space
  EXPECT_EQ(pieces("h\u00e9llo w\u00f6rld \u65e5\u672c\u8a9e 123 \u0663\u0664 \u2014 ok?!\n\n  x"),
            (Pieces{"h\u00e9llo", " w\u00f6rld", " \u65e5\u672c\u8a9e", " 123", " \u0663\u0664", " \u2014", " ok", "?!",
                    "\n\n ", " x"}));
  EXPECT_EQ(pieces("a\u00a0b\u3000 c"), (Pieces{"a", "\u00a0", "b", "\u3000", " c"}));
  EXPECT_EQ(pieces(""), Pieces{});
  EXPECT_EQ(pieces("   "), (Pieces{"   "}));
  // invalid UTF-8 bytes are "other" characters of one byte
  EXPECT_EQ(pieces("ab\xff\xfe cd"), (Pieces{"ab", "\xff\xfe", " cd"}));
}

TEST(BpeTokenizer, BytesToUnicode) {
  EXPECT_EQ(BpeTokenizer::byte_symbol('a'), "a");
  EXPECT_EQ(BpeTokenizer::byte_symbol('!'), "!");
  EXPECT_EQ(BpeTokenizer::byte_symbol(' '), "\u0120");   // byte 32 -> U+0100 + 32 = "Ġ"
  EXPECT_EQ(BpeTokenizer::byte_symbol('\n'), "\u010a");  // byte 10 -> U+010A "Ċ"
  EXPECT_EQ(BpeTokenizer::byte_symbol(0), "\u0100");
  // the non-printable bytes in order: 0x00..0x20 -> U+0100..U+0120, 0x7F..0xA0 -> U+0121..U+0142, 0xAD
  EXPECT_EQ(BpeTokenizer::byte_symbol(0xA0), "\u0142");
  EXPECT_EQ(BpeTokenizer::byte_symbol(0xAD), "\u0143");
  EXPECT_EQ(BpeTokenizer::byte_symbol(0xE9), "\u00e9");  // printable Latin-1 stands for itself
}

// The hand-made vocabulary: single symbols, merged symbols and the end-of-document token.
// Space is "Ġ" (U+0120), newline "Ċ" (U+010A).
const char* kVocab = R"({
  "h": 0, "e": 1, "l": 2, "o": 3, "\u0120": 4, "w": 5, "r": 6, "d": 7, "'": 8, "s": 9, "t": 10, "i": 11,
  "1": 12, "2": 13, "!": 14, "\u010a": 15,
  "he": 16, "ll": 17, "hell": 18, "hello": 19, "\u0120w": 20, "or": 21, "\u0120wor": 22, "ld": 23,
  "\u0120world": 24, "'s": 25, "it": 26, "12": 27, "lo": 28, "<|endoftext|>": 29
})";
// Merge ranks are line numbers after the version line: 0 "h e", 1 "l l", ..., 12 "l o".
const char* kMerges =
    "#version: 0.2\n"
    "h e\n"           // 0
    "l l\n"           // 1
    "he ll\n"         // 2
    "hell o\n"        // 3
    "\u0120 w\n"      // 4
    "o r\n"           // 5
    "\u0120w or\n"    // 6
    "l d\n"           // 7
    "\u0120wor ld\n"  // 8
    "' s\n"           // 9
    "i t\n"           // 10
    "1 2\n"           // 11
    "l o\n";          // 12

TEST(BpeTokenizer, HandWorkedEncodings) {
  const BpeTokenizer t = BpeTokenizer::from_strings(kVocab, kMerges);
  EXPECT_EQ(t.vocab_size(), 30);
  EXPECT_EQ(t.eod(), 29);

  // "hello world" -> pieces "hello", " world".
  //   hello:  h e l l o     pairs (h,e)=0 (l,l)=1 (l,o)=12 -> merge "h e":  he l l o
  //           (l,l)=1 (l,o)=12 -> "l l": he ll o;  (he,ll)=2: hell o;  (hell,o)=3: hello = 19
  //   " world": Ġ w o r l d  (Ġ,w)=4 (o,r)=5 (l,d)=7 -> Ġw o r l d -> Ġw or l d -> (Ġw,or)=6: Ġwor l d
  //           -> (l,d)=7: Ġwor ld -> (Ġwor,ld)=8: Ġworld = 24
  EXPECT_EQ(t.encode("hello world"), (std::vector<int32_t>{19, 24}));

  // "it's 12!" -> "it", "'s", " 12", "!":  (i,t)=10: it = 26;  (',s)=9: 's = 25;
  //   Ġ 1 2: (Ġ,1) has no rank, (1,2)=11 -> Ġ 12 = 4, 27;  ! = 14
  EXPECT_EQ(t.encode("it's 12!"), (std::vector<int32_t>{26, 25, 4, 27, 14}));

  // "lllo": l l l o -> the best pair "l l" (1) merges left to right without overlap: ll l o;
  //   then (ll,l) has no rank, (l,o)=12: ll lo = 17, 28
  EXPECT_EQ(t.encode("lllo"), (std::vector<int32_t>{17, 28}));

  // "he  \nhe" -> "he", "  ", "\n", "he":  he = 16;  Ġ Ġ = 4, 4 (no merge);  Ċ = 15;  he = 16
  EXPECT_EQ(t.encode("he  \nhe"), (std::vector<int32_t>{16, 4, 4, 15, 16}));

  // "<|endoftext|>" in text is text, not the special token: its bytes are not all in this vocabulary
  EXPECT_THROW(t.encode("<|endoftext|>"), InputError);
  EXPECT_THROW(t.encode("x"), InputError);  // no symbol "x"

  EXPECT_EQ(t.decode(std::vector<int32_t>{19, 24}), "hello world");
  EXPECT_EQ(t.decode(std::vector<int32_t>{26, 25, 4, 27, 14, 15}), "it's 12!\n");
  EXPECT_EQ(t.decode(std::vector<int32_t>{29}), "<|endoftext|>");
  EXPECT_EQ(t.decode(std::vector<int32_t>{99, -1}), "\xEF\xBF\xBD\xEF\xBF\xBD");  // not in the vocabulary
}

TEST(BpeTokenizer, FilesAndErrors) {
  const std::string dir = ::testing::TempDir() + "/bpe_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/vocab.json") << kVocab;
  std::ofstream(dir + "/merges.txt") << kMerges;
  const BpeTokenizer t(dir + "/vocab.json", dir + "/merges.txt");
  EXPECT_EQ(t.encode("hello world"), (std::vector<int32_t>{19, 24}));

  EXPECT_THROW(BpeTokenizer(dir + "/missing.json", dir + "/merges.txt"), InputError);
  EXPECT_THROW(BpeTokenizer::from_strings("[1, 2]", kMerges), InputError);
  EXPECT_THROW(BpeTokenizer::from_strings(R"({"a": 0, "b": 0})", ""), InputError);  // two tokens, one id
  EXPECT_THROW(BpeTokenizer::from_strings(R"({"a": "x"})", ""), InputError);
  try {
    BpeTokenizer::from_strings(kVocab, "#version: 0.2\nh e\nbad\n", "m");
    FAIL() << "a merges line without two symbols was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("m (merges):3"), std::string::npos) << e.what();
  }
}

// A vocabulary with every byte (ids 0..255 in byte order), a few merges and <|endoftext|>:
// whatever the text, encoding then decoding gives it back byte for byte.
TEST(BpeTokenizer, RoundTripArbitraryText) {
  std::string vocab = "{";
  std::vector<std::string> symbols;
  for (int b = 0; b < 256; ++b) symbols.push_back(BpeTokenizer::byte_symbol(uint8_t(b)));
  // ids 256.. in rank order: Ġt, th, Ġth, er, in, é (the symbols of its bytes 0xC3 0xA9: "Ã©"), ĠĠ
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"\u0120", "t"}, {"t", "h"}, {"\u0120t", "h"}, {"e", "r"}, {"i", "n"},
      {BpeTokenizer::byte_symbol(0xC3), BpeTokenizer::byte_symbol(0xA9)}, {"\u0120", "\u0120"}};
  std::string merges_txt = "#version: 0.2\n";
  for (const auto& [a, b] : merges) {
    symbols.push_back(a + b);
    merges_txt += a + " " + b + "\n";
  }
  symbols.push_back("<|endoftext|>");
  for (size_t i = 0; i < symbols.size(); ++i) {
    std::string key;
    for (char c : symbols[i]) {  // JSON-escape '"' and '\\'
      if (c == '"' || c == '\\') key += '\\';
      key += c;
    }
    vocab += (i ? ", \"" : "\"") + key + "\": " + std::to_string(i);
  }
  vocab += "}";
  const BpeTokenizer t = BpeTokenizer::from_strings(vocab, merges_txt);
  EXPECT_EQ(t.vocab_size(), 256 + 7 + 1);
  EXPECT_EQ(t.eod(), 263);

  std::vector<std::string> texts = {
      "",
      "the other thing in there",
      "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e \u2014 na\u00efve r\u00e9sum\u00e9",
      "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \U0001F600\U0001F680!",
      "  leading, trailing  \n\n\t tabs\r\nand CRLF  ",
      "it's we'll they're I'd you've 'quoted' ''",
      "numbers 3.14159 1,000,000 \u0663\u0664\u0665",
      std::string("\x00\x01\x7f\x80\xff\xc3(\xe2\x82", 10),  // control and invalid UTF-8 bytes
  };
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  texts.push_back(all);
  std::mt19937 rng(7);
  for (int n = 0; n < 20; ++n) {  // random bytes biased towards text-like ones
    std::string s;
    for (int i = 0; i < 200; ++i) {
      const unsigned r = rng() % 100;
      s.push_back(r < 60 ? char('a' + rng() % 26) : r < 75 ? ' ' : r < 80 ? '\n' : char(rng() % 256));
    }
    texts.push_back(s);
  }
  for (const std::string& s : texts) {
    std::string joined;
    for (std::string_view p : BpeTokenizer::pretokenize(s)) joined += p;
    EXPECT_EQ(joined, s);
    const std::vector<int32_t> ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), s);
  }
  // the merges are used: " the": Ġ t h e -> (Ġ,t) rank 0: Ġt h e -> (Ġt,h) rank 2: Ġth e = 258, 'e';
  // "café": c a f Ã © -> (Ã,©) rank 5 = 261
  EXPECT_EQ(t.encode(" the"), (std::vector<int32_t>{258, int32_t('e')}));
  EXPECT_EQ(t.encode("caf\u00e9"), (std::vector<int32_t>{'c', 'a', 'f', 261}));
}

}  // namespace
}  // namespace tpt
