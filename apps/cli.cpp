#include "apps/cli.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace tpt {

namespace {

constexpr size_t kHelpWidth = 110;

// text with each line longer than width broken at spaces
std::string wrap(const std::string& text, size_t width) {
  std::string out;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    size_t col = 0;
    for (size_t pos = begin; pos < end;) {
      const size_t word = std::min(text.find_first_not_of(' ', pos), end);
      const size_t next = std::min(text.find(' ', word), end);
      if (word == end) break;  // trailing spaces
      if (col > 0 && col + next - pos > width) out += '\n', col = 0, pos = word;
      out.append(text, pos, next - pos);
      col += next - pos;
      pos = next;
    }
    if (end < text.size()) out += '\n';
    begin = end + 1;
  }
  return out;
}

class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_desc(const CLI::Option* opt) const override {
    return wrap(opt->get_description(), kHelpWidth - column_width_);
  }
  std::string make_description(const CLI::App* app) const override {
    return wrap(CLI::Formatter::make_description(app), kHelpWidth);
  }
  std::string make_footer(const CLI::App* app) const override { return wrap(CLI::Formatter::make_footer(app), kHelpWidth); }
};

}  // namespace

std::shared_ptr<CLI::Formatter> help_formatter() { return std::make_shared<HelpFormatter>(); }

CLI::Validator integer_at_least(int64_t min) { return integer_in(min, std::numeric_limits<int64_t>::max()); }

CLI::Validator integer_in(int64_t min, int64_t max) {
  std::string want = "an integer >= " + std::to_string(min);
  if (max < std::numeric_limits<int64_t>::max()) want += " and <= " + std::to_string(max);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        size_t used = 0;
        int64_t x = 0;
        try {
          x = std::stoll(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size() || x < min || x > max) return "expected " + want + ", got '" + s + "'";
        s = std::to_string(x);
        return "";
      },
      "");
}

CLI::Validator number_in(double lo, double hi, bool open_lo) {
  std::string want = "a finite number " + std::string(open_lo ? "> " : ">= ") + CLI::detail::to_string(lo);
  if (hi < std::numeric_limits<double>::infinity()) want += " and <= " + CLI::detail::to_string(hi);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        size_t used = 0;
        double x = NAN;
        try {
          x = std::stod(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool above = open_lo ? x > lo : x >= lo;  // false for NaN
        if (used == 0 || used != s.size() || !above || !(x <= hi) || !std::isfinite(x)) return "expected " + want + ", got '" + s + "'";
        return "";
      },
      "");
}

void add_config_options(CLI::App& cmd, std::string& config, std::vector<std::string>& overrides) {
  cmd.add_option("--config", config, "the YAML config, - for standard input (sections model, parallel, training, optimizer, data, "
                                     "checkpoint, logging; see README.md and configs/)")
      ->required()
      ->type_name("FILE");
  cmd.add_option("--set", overrides, "override one key of the config (repeatable; the value is YAML)")
      ->allow_extra_args(false)
      ->type_name("SECTION.KEY=VALUE");
}

void add_bpe_options(CLI::App& cmd, std::string& vocab_file, std::string& merge_file) {
  CLI::Option* vocab = cmd.add_option("--vocab-file", vocab_file,
                                      "GPT-2 byte-level BPE (Hugging Face's vocab.json, with --merge-file) instead of "
                                      "the byte-level tokenizer (bytes 0..255, end of document 256: vocab_size 257)");
  CLI::Option* merges = cmd.add_option("--merge-file", merge_file, "GPT-2 BPE merges (Hugging Face's merges.txt)");
  vocab->type_name("vocab.json")->needs(merges);
  merges->type_name("merges.txt")->needs(vocab);
}

int64_t parse_byte_size(const std::string& text) {
  auto bad = [&]() -> int64_t {
    input_error("--max-shard-size: '" + text + "' is not a size (bytes, or a number with kB/MB/GB/TB or KiB/MiB/GiB/TiB, "
                "e.g. 5GB)");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return bad();
  double value;
  try {
    size_t used = 0;
    value = std::stod(text.substr(0, i), &used);
    if (used != i) return bad();
  } catch (const std::exception&) {
    return bad();
  }
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  std::string lower;
  for (char c : unit) lower += char(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, double> units[] = {
      {"", 1},          {"b", 1},           {"kb", 1e3},        {"mb", 1e6},        {"gb", 1e9},
      {"tb", 1e12},     {"kib", 1024.0},    {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& [u, mult] : units)
    if (lower == u) {
      const double bytes = std::floor(value * mult);
      if (!(bytes >= 1) || bytes > 9.0e18) return bad();
      return int64_t(bytes);
    }
  return bad();
}

}  // namespace tpt
