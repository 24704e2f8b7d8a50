// Communicators on device buffers (docs/ARCHITECTURE.md "Backends and communicators"): NcclComm runs the Comm interface's
// collectives with NCCL on the compute stream of the CUDA backend, so they are ordered with the
// kernels around them. A collective returns once it is enqueued: the device sees its result in
// stream order; the host sees it after the next synchronizing call (Ops::to_host and the like).
// Built with CUDA; NcclComm itself also needs NCCL (TPTRAIN_HAVE_NCCL; without MPI: one rank).
#pragma once
#include <memory>

#include "parallel/comm.h"

namespace tpt {

// Whether this build has NcclComm.
bool nccl_built();

// The failure path (runtime_abort): ncclCommAbort of every NcclComm of this process, so none is
// destroyed (a destroy would wait for collectives that a dead peer never completes). Never throws.
void nccl_abort_all();

// An NCCL communicator over the ranks of `host_group` (a host communicator of the same group, in
// the same rank order): rank 0 makes the unique id, host_group broadcasts it, every member joins.
// Collective over host_group. The current CUDA device must be this rank's GPU; host_group must
// outlive the result (barrier uses it).
std::unique_ptr<Comm> make_nccl_comm(Comm& host_group);

// The group of one rank on device buffers: collectives are no-ops, all_gather / reduce_scatter a
// device copy (CUDA builds only).
std::unique_ptr<Comm> make_device_self_comm();

}  // namespace tpt
