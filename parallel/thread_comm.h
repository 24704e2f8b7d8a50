// Threads of one process as the ranks of a TP x PP x DP grid (docs/ARCHITECTURE.md "Backends and communicators"): the whole 3D
// path -- the trainer, its hooks, TP sums in their wire formats, pipeline messages, DP buckets and
// the embedding group -- run in one process, on CPU ranks or on one GPU (each thread its own CUDA
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

// Runs body(grid) on tp * pp * dp threads, one per world rank, each with its grid (coordinates and
// groups as make_grid: rank = tp + TP * (dp + DP * pp); host groups always, and the device groups
// tp/pp/dp/embedding_device when device_groups, which needs a CUDA build; cuda_device is left -1
// for the body to choose). Returns when every thread has ended; rethrows the first failure as an
// InternalError naming its rank.
void run_thread_ranks(int tp, int pp, int dp, bool device_groups, const std::function<void(Grid&)>& body);

}  // namespace tpt
