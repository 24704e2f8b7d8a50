// Pre-tokenization by a regular expression (the split patterns of tiktoken and of Hugging Face's
// `Split` pre-tokenizer, e.g. Llama 3's), with PCRE2 (Debian's libpcre2-8, JIT-compiled where the
// platform has a JIT): the text is cut into the pattern's successive leftmost matches.
//   - Unicode: the pattern sees code points (PCRE2_UTF) with Unicode properties (PCRE2_UCP: \p{L},
//     \p{N}, case-insensitive groups); `\s` / `\S` outside a character class and `\s` inside one
//     are rewritten to Unicode's White_Space (what Rust's regex, tiktoken's engine, and Oniguruma,
//     Hugging Face's, mean by \s; PCRE2's own \s adds U+180E).
//   - Text between matches (bytes that are not valid UTF-8, which no pattern item matches, or what
//     a pattern leaves unmatched) becomes a piece of its own, so the pieces always concatenate to
//     the text ("Isolated" in Hugging Face's terms).
// One compiled pattern serves any number of threads (each keeps its own match data).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tpt {

class RegexSplitter {
 public:
  // InputError naming `source` (the file the pattern comes from) if the pattern does not compile.
  RegexSplitter(const std::string& pattern, const std::string& source);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // The pieces of `text` (views into it), appended to `out`, in order.
  void split(std::string_view text, std::vector<std::string_view>& out) const;
  const std::string& pattern() const { return pattern_; }

  // The pattern PCRE2 compiles: `pattern` with \s and \S rewritten (see above).
  static std::string rewrite_white_space(const std::string& pattern);

 private:
  struct Code;
  std::string pattern_;
  std::unique_ptr<Code> code_;
};

}  // namespace tpt
