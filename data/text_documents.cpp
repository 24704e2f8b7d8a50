#include "data/text_documents.h"

#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mmap_file.h"

namespace tpt {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

std::string_view rstrip(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The lines of a text ("\n"-separated; a final newline does not start another line).
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

int64_t read_json_lines(const std::string& path, std::string_view text, const std::string& json_key,
                        const std::function<void(std::string_view)>& on_document) {
  int64_t docs = 0, line_no = 0;
  for (std::string_view line : split_lines(text)) {
    ++line_no;
    if (rstrip(line).empty()) continue;
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      input_error(where + "not valid JSON: " + e.what());
    }
    if (!j.is_object()) input_error(where + "not a JSON object");
    auto it = j.find(json_key);
    if (it == j.end()) input_error(where + "no key \"" + json_key + "\" (see --json-key)");
    if (!it->is_string()) input_error(where + "the value of \"" + json_key + "\" is not a string");
    const std::string& doc = it->get_ref<const std::string&>();
    if (doc.empty()) continue;
    on_document(doc);
    ++docs;
  }
  return docs;
}

int64_t read_plain_text(std::string_view text, const std::function<void(std::string_view)>& on_document) {
  const std::vector<std::string_view> lines = split_lines(text);
  bool fortune = false;
  for (std::string_view line : lines) fortune = fortune || rstrip(line) == "%";
  int64_t docs = 0;
  std::string doc;
  bool has_content = false;  // doc holds something other than whitespace
  auto flush = [&] {
    if (has_content) {
      on_document(doc);
      ++docs;
    }
    doc.clear();
    has_content = false;
  };
  bool first_line = true;
  for (std::string_view line : lines) {
    const bool separator = fortune ? rstrip(line) == "%" : rstrip(line).empty();
    if (separator) {
      flush();
      first_line = true;
      continue;
    }
    if (!first_line) doc.push_back('\n');
    doc.append(line);
    has_content = has_content || !rstrip(line).empty();
    first_line = false;
  }
  flush();
  return docs;
}

}  // namespace

int64_t read_documents(const std::string& path, const std::string& json_key,
                       const std::function<void(std::string_view)>& on_document) {
  const MappedFile file(path);
  const std::string_view text(reinterpret_cast<const char*>(file.data()), file.size());
  if (ends_with(path, ".json") || ends_with(path, ".jsonl")) return read_json_lines(path, text, json_key, on_document);
  return read_plain_text(text, on_document);
}

}  // namespace tpt
