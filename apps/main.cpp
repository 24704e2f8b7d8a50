// tptrain entry point: dispatches subcommands and maps exceptions to the contract's exit codes
// (0 done, 2 bad input, 1 internal failure).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "apps/commands.h"
#include "apps/help.h"
#include "core/cpu/blas_select.h"
#include "core/error.h"

int main(int argc, char** argv) {
  using namespace tpt;
  configure_cpu_environment(argv);
  try {
    if (argc >= 2) {
      std::string cmd = argv[1];
      if (cmd == "--help" || cmd == "-h" || cmd == "help") {
        std::fputs(help_text().c_str(), stdout);
        return 0;
      }
      if (cmd == "--version") {
        std::fputs(version_text().c_str(), stdout);
        return 0;
      }
      if (cmd == "train") return train_main(argc - 1, argv + 1);
      if (cmd == "preprocess") return preprocess_main(argc - 1, argv + 1);
      if (cmd == "export") return export_main(argc - 1, argv + 1);
      if (cmd == "plan") return plan_main(argc - 1, argv + 1);
      if (cmd == "generate") return generate_main(argc - 1, argv + 1);
      if (cmd == "data") return data_main(argc - 1, argv + 1);
      if (cmd.rfind("-", 0) != 0)
        input_error("unknown command '" + cmd + "' (try: tptrain --help)");
    }
    return train_main(argc, argv);
  } catch (const InputError& e) {
    std::fprintf(stderr, "tptrain: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tptrain: internal error: %s\n", e.what());
    return 1;
  }
}
