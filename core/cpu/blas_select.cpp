#include "core/cpu/blas_select.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" char* openblas_get_corename(void);

namespace tpt {

void select_openblas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("TPTRAIN_NO_BLAS_SELECT")) return;
  const char* core = openblas_get_corename();
  if (!core || (std::strcmp(core, "Prescott") != 0 && std::strcmp(core, "Core2") != 0 &&
                std::strcmp(core, "Nehalem") != 0))
    return;
  __builtin_cpu_init();
  const char* want = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    want = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    want = "Haswell";
  if (!want) return;
  setenv("OPENBLAS_CORETYPE", want, 1);
  execv("/proc/self/exe", argv);  // on failure, carry on with the slow kernels
}

}  // namespace tpt
