#pragma once
namespace tpt {
// OpenBLAS 0.3.21 (Debian 12) does not know recent Xeons and falls back to its slowest kernels
// ("Prescott", SSE3) -- 2x slower GEMMs on this project's machines. When the user has not chosen a
// core (OPENBLAS_CORETYPE unset) and OpenBLAS fell back although the CPU has AVX-512 / AVX2+FMA,
// re-executes this binary with OPENBLAS_CORETYPE=SkylakeX / Haswell (OpenBLAS reads it only at
// load time). Call first thing in main(); returns if nothing is to be done.
void select_openblas_core(char** argv);
}  // namespace tpt
