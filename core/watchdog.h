// parallel.distributed_timeout_minutes (Megatron's name): a rank that makes no progress inside one
// communication for that long logs "rank R: no progress for N s in <operation> (waiting for
// <peers>)" and ends its process with exit 1, which makes the launcher end the whole job -- so a
// hung or stopped peer ends the job instead of leaving every other rank waiting forever.
//
// Every blocking wait of a communicator runs inside a CommWait (parallel/mpi_comm.cpp), and so does
// every host wait for a GPU's compute stream (core/cuda: NCCL collectives run on that stream, so a
// hung GPU peer shows as a stream that never drains); a thread started by watchdog_start() checks
// the current wait's age four times a second. Only time spent inside
// one wait counts: compute, checkpoint saves and evaluation between waits never fire it.
#pragma once
#include <string>

namespace tpt {

// Starts the watchdog thread of this process (once; later calls change the timeout).
void watchdog_start(double timeout_seconds, int world_rank);

// The scope of one blocking wait: `operation` ("all_reduce", ...) and `peers` (e.g. "world ranks
// 0, 2") name it in the message. Waits do not nest (one communication at a time per rank).
class CommWait {
 public:
  CommWait(const char* operation, const std::string& peers);
  ~CommWait();
  CommWait(const CommWait&) = delete;
  CommWait& operator=(const CommWait&) = delete;
};

}  // namespace tpt
