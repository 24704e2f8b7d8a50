#pragma once
namespace tpt {
// Process environment that the CPU libraries read only when they load, so it is fixed by
// re-executing this binary once (before MPI or anything else starts):
//  - OpenBLAS 0.3.21 (Debian 12) does not know recent Xeons and falls back to its slowest kernels
//    ("Prescott", SSE3): 2x slower GEMMs on this project's machines. When OPENBLAS_CORETYPE is
//    unset and OpenBLAS fell back although the CPU has AVX-512 / AVX2+FMA, set it to SkylakeX /
//    Haswell.
//  - OpenMP worker threads spin-wait between our loops by default, taking the cores from
//    OpenBLAS's own threads during every GEMM: OMP_WAIT_POLICY=PASSIVE unless set.
// Set TPTRAIN_NO_REEXEC=1 to leave the environment alone.
void configure_cpu_environment(char** argv);
}  // namespace tpt
