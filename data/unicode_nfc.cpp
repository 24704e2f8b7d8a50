#include "data/unicode_nfc.h"

#include <utf8proc.h>

#include <cstdlib>

namespace tpt {
namespace {

// A valid UTF-8 run: NFC by utf8proc unless every code point is below U+0300 (no lead byte from
// 0xCC on), which no composition or decomposition touches.
void normalize_run(std::string_view run, std::string& out) {
  bool plain = true;
  for (char c : run)
    if (static_cast<unsigned char>(c) >= 0xCC) {
      plain = false;
      break;
    }
  if (plain) {
    out.append(run);
    return;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                          utf8proc_ssize_t(run.size()), &dst, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) out.append(run);  // (not reached: the run is valid UTF-8)
  else out.append(reinterpret_cast<const char*>(dst), size_t(n));
  std::free(dst);
}

}  // namespace

void nfc_append(std::string_view text, std::string& out) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  const size_t n = text.size();
  size_t run = 0;  // start of the current valid run
  for (size_t i = 0; i < n;) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t len = utf8proc_iterate(p + i, utf8proc_ssize_t(n - i), &cp);
    if (len > 0) {
      i += size_t(len);
      continue;
    }
    normalize_run(text.substr(run, i - run), out);  // an invalid byte: kept, the run ends
    out.push_back(text[i]);
    run = ++i;
  }
  normalize_run(text.substr(run), out);
}

}  // namespace tpt
