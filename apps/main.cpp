// tptrain entry point: the command line (CLI11 subcommands, apps/commands.h) and the contract's exit
// codes (0 done, 2 bad input, 1 internal failure).
#include <fcntl.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "apps/commands.h"
#include "apps/help.h"
#include "core/config.h"
#include "core/cpu/blas_select.h"
#include "core/error.h"

namespace {

using namespace tpt;

// argv[1..] as CLI11 parses it (last first): no command, or an option first, means train
// (tptrain --config FILE); `help` means --help.
std::vector<std::string> command_line(int argc, char** argv, CLI::App& app) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool top_flag = !args.empty() && (args[0] == "-h" || args[0] == "--help" || args[0] == "--version");
  if (args.empty() || (args[0].starts_with("-") && !top_flag)) args.insert(args.begin(), "train");
  else if (args[0] == "help") args[0] = "--help";
  else if (!top_flag && app.get_subcommands([&](CLI::App* c) { return c->check_name(args[0]); }).empty())
    input_error("unknown command '" + args[0] + "' (try: tptrain --help)");
  std::reverse(args.begin(), args.end());
  return args;
}

// A command-line error in one line: the command, what is wrong, where its help is.
std::string parse_error(const CLI::App& app, const CLI::ParseError& e) {
  const std::vector<CLI::App*> parsed = app.get_subcommands();
  const std::string cmd = parsed.empty() ? "" : parsed[0]->get_name();
  const std::vector<std::string> extra = app.remaining(true);
  // an unknown argument first: CLI11 checks the required options before it
  const std::string what = extra.empty() ? std::string(e.what()) : "unknown argument '" + extra[0] + "'";
  return (cmd.empty() ? what : cmd + ": " + what) + " (try: tptrain " + (cmd.empty() ? "" : cmd + " ") + "--help)";
}

int run(int argc, char** argv) {
  CLI::App app("tptrain - Megatron-style GPT training (TP x PP x DP) on CPU ranks and CUDA GPUs", "tptrain");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a repeated option: the last
  app.formatter(help_formatter());
  app.get_formatter()->column_width(36);
  app.set_version_flag("--version", [] { return version_text(); }, "Print the version and the backends built in, and exit");
  const std::vector<Command> commands = {add_train_command(app, &argc, &argv), add_preprocess_command(app),
                                         add_plan_command(app),   add_export_command(app),
                                         add_generate_command(app), add_data_command(app)};
  app.require_subcommand(1);
  app.footer(help_footer());
  try {
    app.parse(command_line(argc, argv, app));
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) input_error(parse_error(app, e));
    std::fputs(dynamic_cast<const CLI::CallForVersion*>(&e) ? e.what() : app.help().c_str(), stdout);
    return 0;
  }
  const std::vector<CLI::App*> all = app.get_subcommands([](CLI::App*) { return true; });
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i]->parsed()) return commands[i]();
  internal_error("no command parsed");
}

}  // namespace

int main(int argc, char** argv) {
  const bool stdin_closed = ::fcntl(0, F_GETFD) == -1;  // before any open() could take fd 0
  configure_cpu_environment(argv);                       // may re-execute: fd 0 is still closed there
  if (stdin_closed) tpt::note_stdin_closed();
  try {
    return run(argc, argv);
  } catch (const tpt::InputError& e) {
    std::fprintf(stderr, "tptrain: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tptrain: internal error: %s\n", e.what());
    return 1;
  }
}
