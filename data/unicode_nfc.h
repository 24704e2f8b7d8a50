// Unicode Normalization Form C, as Hugging Face's `NFC` normalizer applies it before pre-tokenization
// (Qwen2's and Qwen3's tokenizer.json), by Debian's utf8proc (libutf8proc-dev: its Unicode tables,
// canonical decomposition then composition). Bytes that are not valid UTF-8 are kept as they are
// and end a run: each valid run between them is normalized on its own. A run whose code points are
// all below U+0300 (ASCII, Latin-1, ...) is already NFC and is copied as is.
#pragma once
#include <string>
#include <string_view>

namespace tpt {

// NFC(text) appended to out.
void nfc_append(std::string_view text, std::string& out);

}  // namespace tpt
