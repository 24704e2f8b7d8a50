// A checkpoint written in the background (checkpoint.async_save, Megatron's --async-save): the main
// thread has copied a rank's shards into host memory that stays untouched until the writer is done
// (the trainer's staging buffers) and hands them, with its CheckpointWriter, to a writer thread that
// writes and fsyncs the files. The writer touches no communicator (MPI runs MPI_THREAD_FUNNELED:
// only the main thread communicates); the main thread decides collectively, at a later iteration
// boundary, to commit the checkpoint (every rank's writer done, none failed: meta.json, rename,
// latest file, keep_last) or to abandon it (its iter_N.partial is removed, the latest file is left).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/checkpoint.h"

namespace tpt {

// One shard file: its name and the boxes it holds (data pointers into host memory).
struct CheckpointFile {
  std::string name;
  std::vector<CkptTensor> tensors;
};

class BackgroundSave {
 public:
  // Starts the writer thread on `files` (their tensors' memory must outlive it: wait() or the
  // destructor). `meta` is the commit's meta.json.
  BackgroundSave(std::unique_ptr<CheckpointWriter> writer, std::vector<CheckpointFile> files, nlohmann::json meta);
  // Stops a writer still running at its next write and joins it; an uncommitted checkpoint's
  // iter_N.partial is removed (CheckpointWriter's destructor). Never throws.
  ~BackgroundSave();
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;

  int64_t iteration() const { return writer_->iteration(); }
  // This rank's writer has finished (successfully or not); no lock, for the per-iteration check.
  bool done() const { return done_.load(std::memory_order_acquire); }
  // After done(): the failure's message, empty if the files are written and fsynced.
  const std::string& error() const { return error_; }
  // Joins the writer thread; returns the seconds this waited.
  double wait();
  // Asks a running writer to stop (its write fails with "save abandoned"); wait() then.
  void cancel() { cancel_.store(true); }
  double write_seconds() const { return write_s_; }  // after done(): the writer's time, start to fsync
  uint64_t bytes() const { return writer_->bytes_written(); }  // after done(): this rank's
  // Collective, after wait() on every rank and no error anywhere: CheckpointWriter::commit.
  uint64_t commit(int keep_last) { return writer_->commit(std::move(meta_), keep_last); }
  const std::string& path() const { return writer_->path(); }

 private:
  void run();
  std::unique_ptr<CheckpointWriter> writer_;
  std::vector<CheckpointFile> files_;
  nlohmann::json meta_;
  std::atomic<bool> done_{false}, cancel_{false};
  std::string error_;
  double write_s_ = 0;
  std::thread thread_;
};

}  // namespace tpt
