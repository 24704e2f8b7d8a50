// logging.tensorboard_dir: a TensorBoard event file written by hand, no dependency.
// The file is a sequence of TFRecords (uint64 length, masked CRC-32C of the length, the bytes,
// masked CRC-32C of the bytes; little-endian), each holding one tensorflow.Event protobuf: first
// {wall_time, file_version: "brain.Event:2"}, then {wall_time, step, summary {value {tag,
// simple_value}}...} per logged iteration. The writer flushes after each logged iteration, so a run
// killed at any moment leaves a file TensorBoard reads up to the last flush.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace tpt {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8 of crc32c(data).
uint32_t masked_crc32c(const void* data, size_t n);
// One TFRecord around `payload` (length, its masked CRC, payload, its masked CRC).
std::string tfrecord(const std::string& payload);
// The Event protobufs: the first one of a file, and one of scalar values at a step.
std::string event_file_version(double wall_time);
std::string event_scalars(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values);

class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) and a new events.out.tfevents.<seconds>.<host>.<pid> in it (a
  // resumed run appends a second file next to the first); writes the file_version event.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  // One Event with all the values at `step` (wall time: now).
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& record);
  std::string path_;
  FILE* f_ = nullptr;
};

}  // namespace tpt
