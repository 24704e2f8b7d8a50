#pragma once
#ifdef TPTRAIN_HAVE_MPI
#include <mpi.h>

#include <cstdint>
#include <memory>

#include "parallel/comm.h"

namespace tpt {
// Takes ownership of c (freed on destruction unless it is MPI_COMM_WORLD). max_count: the elements
// of one MPI call where a count can exceed an int (all_reduce, broadcast, start_all_reduce go in
// chunks of it; all_to_all_v beyond it in point-to-point messages of it); tests lower it to run
// those paths on small buffers.
std::unique_ptr<Comm> make_mpi_comm(MPI_Comm c, int64_t max_count = int64_t(1) << 30);
}  // namespace tpt
#endif
