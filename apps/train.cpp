#include <string>
#include <vector>

#include "apps/commands.h"
#include "core/config.h"
#include "core/error.h"

namespace tpt {

int train_main(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) config_path = argv[++i];
    else if (a == "--set" && i + 1 < argc) overrides.push_back(argv[++i]);
    else input_error("unknown argument '" + a + "' (try: tptrain --help)");
  }
  if (config_path.empty()) input_error("missing --config FILE (try: tptrain --help)");
  Config cfg = load_config(config_path, overrides);
  (void)cfg;
  return 0;
}

}  // namespace tpt
