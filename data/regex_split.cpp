#include "data/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <new>

#include "core/error.h"

namespace tpt {
namespace {

// Unicode's White_Space property (Rust regex's and Oniguruma's \s), as members of a character class.
constexpr const char* kWhiteSpace =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

// What each thread needs to match: match data (one pair), a match context without PCRE2's
// default match limit (a long run of white space backtracks once per character), a JIT stack.
struct ThreadMatcher {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatcher() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    if (data == nullptr || context == nullptr) throw std::bad_alloc();
    pcre2_set_match_limit(context, UINT32_MAX);
    pcre2_set_depth_limit(context, UINT32_MAX);
    if (stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatcher() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  ThreadMatcher(const ThreadMatcher&) = delete;
  ThreadMatcher& operator=(const ThreadMatcher&) = delete;
};

ThreadMatcher& thread_matcher() {
  thread_local ThreadMatcher m;
  return m;
}

}  // namespace

struct RegexSplitter::Code {
  pcre2_code* re = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(re); }
};

std::string RegexSplitter::rewrite_white_space(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  const size_t n = p.size();
  for (size_t i = 0; i < n;) {
    const char c = p[i];
    if (c == '\\' && i + 1 < n) {
      const char d = p[i + 1];
      if (d == 'Q') {  // \Q...\E: literal text
        const size_t e = p.find("\\E", i + 2);
        const size_t stop = e == std::string::npos ? n : e + 2;
        out.append(p, i, stop - i);
        i = stop;
        continue;
      }
      if (d == 's') out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      else if (d == 'S' && !in_class) out += "[^" + std::string(kWhiteSpace) + "]";
      else out.append(p, i, 2);
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < n && p[i] == '^') out += p[i++];
      if (i < n && p[i] == ']') out += p[i++];  // a leading ']' is a member
      continue;
    }
    if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {  // [:alpha:]
      const size_t e = p.find(":]", i + 2);
      const size_t stop = e == std::string::npos ? n : e + 2;
      out.append(p, i, stop - i);
      i = stop;
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

RegexSplitter::RegexSplitter(const std::string& pattern, const std::string& source)
    : pattern_(pattern), code_(std::make_unique<Code>()) {
  const std::string compiled = rewrite_white_space(pattern);
  int err = 0;
  PCRE2_SIZE at = 0;
  code_->re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
  if (code_->re == nullptr)
    input_error(source + ": the pre-tokenizer's regular expression does not compile (PCRE2: " + pcre2_message(err) +
                " at offset " + std::to_string(at) + " of " + compiled + ")");
  code_->jit = pcre2_jit_compile(code_->re, PCRE2_JIT_COMPLETE) == 0;  // else the interpreter
}

RegexSplitter::~RegexSplitter() = default;

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  ThreadMatcher& m = thread_matcher();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0, gap = 0;  // where the next search starts; the start of the text no match covered
  while (pos < n) {
    const int rc = code_->jit ? pcre2_jit_match(code_->re, subject, n, pos, 0, m.data, m.context)
                              : pcre2_match(code_->re, subject, n, pos, 0, m.data, m.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      input_error("pre-tokenization: the regular expression failed on a text of " + std::to_string(n) +
                  " bytes at byte " + std::to_string(pos) + " (PCRE2: " + pcre2_message(rc) + ")");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
    const size_t s = ov[0], e = ov[1];
    if (e <= s) {  // an empty match: search again one character further
      pos = s + 1;
      while (pos < n && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (s > gap) out.push_back(text.substr(gap, s - gap));
    out.push_back(text.substr(s, e - s));
    gap = pos = e;
  }
  if (gap < n) out.push_back(text.substr(gap));
}

}  // namespace tpt
