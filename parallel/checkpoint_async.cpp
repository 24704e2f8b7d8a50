// The background writer of parallel/checkpoint_async.h.
#include "parallel/checkpoint_async.h"

#include <chrono>
#include <exception>

namespace tpt {

BackgroundSave::BackgroundSave(std::unique_ptr<CheckpointWriter> writer, std::vector<CheckpointFile> files,
                               nlohmann::json meta)
    : writer_(std::move(writer)), files_(std::move(files)), meta_(std::move(meta)) {
  writer_->set_cancel_flag(&cancel_);
  thread_ = std::thread([this] { run(); });
}

BackgroundSave::~BackgroundSave() {
  cancel();
  if (thread_.joinable()) thread_.join();
}

void BackgroundSave::run() {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (const CheckpointFile& f : files_) writer_->write_file(f.name, f.tensors);
    writer_->sync_files();
    checkpoint_detail::test_kill_point("written", writer_->iteration(), writer_->rank());
  } catch (const std::exception& e) {
    error_ = e.what();
  } catch (...) {
    error_ = "unknown error";
  }
  if (error_.empty() && cancel_.load()) error_ = writer_->path() + ".partial: save abandoned";
  write_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done_.store(true, std::memory_order_release);
}

double BackgroundSave::wait() {
  const auto t0 = std::chrono::steady_clock::now();
  if (thread_.joinable()) thread_.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace tpt
