#pragma once
#ifdef TPTRAIN_HAVE_MPI
#include <mpi.h>

#include <memory>

#include "parallel/comm.h"

namespace tpt {
// Takes ownership of c (freed on destruction unless it is MPI_COMM_WORLD).
std::unique_ptr<Comm> make_mpi_comm(MPI_Comm c);
}  // namespace tpt
#endif
