// Documents of a `tptrain preprocess` input file.
//   *.json / *.jsonl: JSON lines, one document per line, its text under `json_key`; blank lines are
//     skipped; a line that is not a JSON object with a string under json_key is an InputError
//     naming the file and the line number.
//   anything else: plain text. If some line is exactly "%" (trailing whitespace ignored; the
//     fortune format), those lines separate documents; otherwise blank (whitespace-only) lines do.
//     A document is its lines joined with "\n" (no final newline); documents that are only
//     whitespace are dropped.
// Documents with empty text are never passed on.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace tpt {

// Calls on_document(text) for each document of `path` in order; returns the number of documents.
int64_t read_documents(const std::string& path, const std::string& json_key,
                       const std::function<void(std::string_view)>& on_document);

}  // namespace tpt
