// Subcommands of the tptrain binary. Each returns the process exit status or throws
// InputError / InternalError (main turns those into 2 / 1).
#pragma once

namespace tpt {

int train_main(int argc, char** argv);       // apps/train.cpp:   tptrain [train] --config FILE [--set k=v]...
int preprocess_main(int argc, char** argv);  // apps/preprocess_cmd.cpp: tptrain preprocess ...
int export_main(int argc, char** argv);      // apps/export_cmd.cpp: tptrain export --checkpoint DIR --output DIR
int plan_main(int argc, char** argv);        // apps/plan_cmd.cpp: tptrain plan --config FILE [--world-size N] ...
int generate_main(int argc, char** argv);    // apps/generate_cmd.cpp: tptrain generate --checkpoint DIR --prompt TEXT ...
int data_main(int argc, char** argv);        // apps/data_cmd.cpp: tptrain data --config FILE --samples A:B [--json]

}  // namespace tpt
