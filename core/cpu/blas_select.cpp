#include "core/cpu/blas_select.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" char* openblas_get_corename(void);

namespace tpt {

namespace {
const char* better_openblas_core() {
  const char* core = openblas_get_corename();
  if (!core || (std::strcmp(core, "Prescott") != 0 && std::strcmp(core, "Core2") != 0 &&
                std::strcmp(core, "Nehalem") != 0))
    return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}
}  // namespace

void configure_cpu_environment(char** argv) {
  if (std::getenv("TPTRAIN_NO_REEXEC") || std::getenv("TPTRAIN_REEXECUTED")) return;
  bool changed = false;
  if (!std::getenv("OPENBLAS_CORETYPE"))
    if (const char* core = better_openblas_core()) setenv("OPENBLAS_CORETYPE", core, 1), changed = true;
  if (!std::getenv("OMP_WAIT_POLICY")) setenv("OMP_WAIT_POLICY", "PASSIVE", 1), changed = true;
  if (!changed) return;
  setenv("TPTRAIN_REEXECUTED", "1", 1);
  // the binary's real path, not /proc/self/exe: the kernel names the process (top, ps, /proc/PID/comm)
  // after the file exec'd, and "exe" would hide tptrain's ranks
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
    execv(self, argv);  // fails if the file was replaced since (a rebuild): then /proc/self/exe
  }
  execv("/proc/self/exe", argv);  // on failure, carry on as we are
}

}  // namespace tpt
