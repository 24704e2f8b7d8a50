// logging.tensorboard_dir: a TensorBoard event file written by hand, no dependency.
// The file is a sequence of TFRecords (uint64 length, masked CRC-32C of the length, the bytes,
// masked CRC-32C of the bytes; little-endian), each holding one tensorflow.Event protobuf: first
// {wall_time, file_version: "brain.Event:2"}, then {wall_time, step, summary {value {tag,
// simple_value}}...} per logged iteration. Each record is one write() (train/aux_output.h), so a run
// killed at any moment, or a full disk, leaves a file of whole records that TensorBoard reads.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "train/aux_output.h"

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

  // One Event with all the values at `step` (wall time: now), one whole TFRecord in one write (no
  // buffer to flush). False once a write has failed: one warning, then the file stops growing.
  bool add_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values);
  const std::string& path() const { return out_->path(); }

 private:
  std::unique_ptr<AuxOutput> out_;
};

}  // namespace tpt
