// Pieces of tptrain's command line (CLI11) that several subcommands share.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tpt {

// CLI11's help with the descriptions and footers wrapped to fit 110 columns.
std::shared_ptr<CLI::Formatter> help_formatter();

// Validators: a base-10 integer >= min (written back in plain decimal: CLI11 alone would read 010 as
// octal) ...
CLI::Validator integer_at_least(int64_t min);
// ... an integer in [min, max] (an option that sizes threads, memory or work has an upper bound) ...
CLI::Validator integer_in(int64_t min, int64_t max);
// ... and a finite number in [lo, hi], or (lo, hi] when open_lo (never NaN or inf). The help states the range.
CLI::Validator number_in(double lo, double hi, bool open_lo);

// --config FILE (required) and --set section.key=value (repeatable): train, plan, data.
void add_config_options(CLI::App& cmd, std::string& config, std::vector<std::string>& overrides);
// --vocab-file F --merge-file F: GPT-2 BPE instead of the byte-level tokenizer, the two together.
void add_bpe_options(CLI::App& cmd, std::string& vocab_file, std::string& merge_file);

// "5GB", "500MB", "2GiB", "1000000" (bytes) -> bytes (HF's max_shard_size: kB/MB/GB powers of 1000,
// KiB/MiB/GiB of 1024): export's --max-shard-size. InputError naming the text.
int64_t parse_byte_size(const std::string& text);

}  // namespace tpt
