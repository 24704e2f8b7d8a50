// Subcommands of the tptrain binary. Each add_*_command adds its subcommand, options and help to the
// CLI11 app (apps/main.cpp) and returns what runs it once the command line has parsed: the process
// exit status, or InputError / InternalError thrown (main turns those into 2 / 1).
#pragma once
#include <functional>

namespace CLI {
class App;
}

namespace tpt {

using Command = std::function<int()>;

// apps/train.cpp: tptrain [train] --config FILE [--set k=v]...; MPI starts with main's argc / argv
Command add_train_command(CLI::App& app, int* argc, char*** argv);
Command add_preprocess_command(CLI::App& app);  // apps/preprocess_cmd.cpp: text -> .bin/.idx
Command add_export_command(CLI::App& app);      // apps/export_cmd.cpp: checkpoint -> HF GPT-2
Command add_plan_command(CLI::App& app);        // apps/plan_cmd.cpp: memory, FLOPs, time of a config
Command add_generate_command(CLI::App& app);    // apps/generate_cmd.cpp: text from a checkpoint
Command add_data_command(CLI::App& app);        // apps/data_cmd.cpp: the samples training reads

}  // namespace tpt
