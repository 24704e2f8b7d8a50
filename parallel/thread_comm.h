// Threads of one process as the ranks of a TP x CP x PP x DP grid (docs/ARCHITECTURE.md "Backends
// and communicators"): the whole parallel path -- the trainer, its hooks, TP sums in their wire
// formats, pipeline messages, DP buckets, the embedding group and the CP ring -- run in one process, on CPU ranks or on one GPU (each thread its own CUDA
// stream and Ops; the one-GPU 3D tests), without mpirun or a second GPU. For tests.
//
// Every group is a rendezvous of its member threads: a collective publishes each member's
// buffers, waits for all, computes each member's result from the published buffers (sums in rank
// order, so every member gets the same bits), waits again, then writes its own result. Send/recv
// is buffered per (sender, receiver) pair, first in first out. Device groups (device_groups =
// true, CUDA builds) move their members' device buffers through host copies on the calling
// thread's compute stream, then run the host group's collective. The start_* collectives run at
// their wait (the latest moment an asynchronous one may read its buffer). If any rank's body throws, every
// other rank's current or next wait throws too, so a failure never hangs the others.
#pragma once
#include <functional>
#include <memory>

#include "parallel/grid.h"

namespace tpt {

// Runs body(grid) on shape.world() threads, one per world rank, each with its grid (coordinates and
// groups as make_grid, from the same grid_group_splits: rank = tp + TP * (cp + CP * (dp + DP * pp));
// host groups always, and their device twins (tp/pp/dp/embedding/cp/dp_cp/ep/edp/etp_device) when
// device_groups, which needs a CUDA build; cuda_device is left -1 for the body to choose). Returns
// when every thread has ended; rethrows the first failure as an InternalError naming its rank.
void run_thread_ranks(const GridShape& shape, bool device_groups, const std::function<void(Grid&)>& body);

// The same for a grid without context parallelism (CP = 1).
inline void run_thread_ranks(int tp, int pp, int dp, bool device_groups, const std::function<void(Grid&)>& body) {
  run_thread_ranks(GridShape{tp, 1, pp, dp}, device_groups, body);
}

}  // namespace tpt
