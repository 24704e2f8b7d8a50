// The process runtime: MPI start-up and shutdown (or a single process when built without MPI),
// abort on failure, and the process grid built from the world.
#pragma once
#include <string>

#include "parallel/grid.h"

namespace tpt {

// MPI_Init where an MPI launcher started the process (grid.cpp's launched_by_mpi; TPTRAIN_MPI_INIT=1
// for another launcher); a process started on its own is one rank without MPI. No-op without MPI. Safe to call once.
void runtime_init(int* argc, char*** argv);
void runtime_finalize();
int runtime_world_size();
int runtime_world_rank();
// Ends every rank of the job with `code` (MPI_Abort), so a failure on one rank never hangs others.
[[noreturn]] void runtime_abort(int code);
// Rank 0's `s` on every rank (MPI_Bcast over the world; `s` itself alone or without MPI). Collective.
std::string runtime_broadcast_string(const std::string& s);

// Builds the TP x CP x PP x DP grid over the world. tp * cp * pp * dp must equal the world size
// (checked by resolve_parallel beforehand).
Grid make_grid(int tp, int pp, int dp, int cp = 1);
// The same with the expert grid of shape.ep, shape.etp (ETP * EP divides TP * CP * DP).
Grid make_grid(const GridShape& shape);

}  // namespace tpt
