// The subcommands' options (issue 29): the first input byte picks plan, data, generate, export or
// preprocess; the rest, one argument per line, is its command line (CLI11 with the real options and
// validators of apps/*_cmd.cpp). plan and data then run against a tiny config and llm.c shard
// written here (their --set overrides reach every config key); generate, export and preprocess,
// which would read checkpoints or write files wherever an argument says, are parsed only. TOKENS in
// an argument stands for the shard's path (data.path blends of it). A
// CLI::ParseError or an InputError is the expected answer to a bad command line.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "fuzz_common.h"

namespace {

// A valid config over a 4,096-token llm.c shard (byte-level vocabulary), written once.
const std::string& tiny_config() {
  static const std::string path = [] {
    const std::string dir = tpt::fuzz::scratch();
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520, header[1] = 1, header[2] = 4096;
    std::vector<uint16_t> tokens(4096);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t((i * 7919) % 257);
    std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
    bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
    tpt::fuzz::write_file(dir + "/tokens.bin", reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    const std::string yaml = "model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 16, "
                             "vocab_size: 257}\ntraining: {micro_batch_size: 2, global_batch_size: 4, train_iters: 8}\n"
                             "data: {path: " + dir + "/tokens.bin, split: [90, 5, 5]}\n";
    tpt::fuzz::write_file(dir + "/cfg.yaml", reinterpret_cast<const uint8_t*>(yaml.data()), yaml.size());
    std::freopen("/dev/null", "w", stdout);  // plan's report and data's samples
    return dir + "/cfg.yaml";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  if (n < 1 || n > 4096) return 0;
  static const char* kCommands[] = {"plan", "data", "generate", "export", "preprocess"};
  const std::string command = kCommands[data[0] % 5];
  std::vector<std::string> args = {command};
  if (command == "plan" || command == "data") args.insert(args.end(), {"--config", tiny_config()});
  std::string rest(reinterpret_cast<const char*>(data + 1), n - 1);
  for (size_t b = 0; b <= rest.size() && args.size() < 40;) {
    size_t e = rest.find('\n', b);
    if (e == std::string::npos) e = rest.size();
    std::string arg = rest.substr(b, e - b);
    for (size_t at; (at = arg.find("TOKENS")) != std::string::npos;)  // the shard: blends of it
      arg.replace(at, 6, tpt::fuzz::scratch() + "/tokens.bin");
    args.push_back(arg);
    b = e + 1;
  }
  CLI::App app("fuzz", "tptrain");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // as apps/main.cpp
  const std::vector<tpt::Command> commands = {tpt::add_plan_command(app), tpt::add_data_command(app),
                                              tpt::add_generate_command(app), tpt::add_export_command(app),
                                              tpt::add_preprocess_command(app)};
  app.require_subcommand(1);
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError&) {
    return 0;
  }
  tpt::fuzz::expect_input_errors_only([&] {
    if (command == "plan") commands[0]();
    if (command == "data") commands[1]();
  });
  return 0;
}
