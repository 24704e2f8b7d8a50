// Auxiliary outputs of a run (logging.metrics_file, logging.tensorboard_dir, logging.trace_file):
// files that help a user watch the run but that the run does not need. A write error in one (a full
// disk, a quota) is one warning naming the file, after which that output stops; training and
// checkpoints go on. Each record is written whole or not at all: a short write is truncated back to
// the record's start, so a reader never sees half a JSON line or half a TFRecord.
#pragma once
#include <cstdint>
#include <string>

namespace tpt {

class AuxOutput {
 public:
  // Creates (truncates) `path`; InputError "<field>: cannot write '<path>': <reason>" when it cannot
  // be opened (a configuration error, found before training starts).
  AuxOutput(std::string path, std::string field);
  ~AuxOutput();
  AuxOutput(const AuxOutput&) = delete;
  AuxOutput& operator=(const AuxOutput&) = delete;

  // Appends `record` (one write() per try, retried on a partial write); false, after the one
  // warning, when the output has stopped (this write or an earlier one failed).
  bool append(const std::string& record);
  bool ok() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  void stop(int err);
  std::string path_, field_;
  int fd_ = -1;
  uint64_t size_ = 0;  // bytes of whole records written
};

// Writes `text` to `path` whole or not at all (a file cut short is removed); on a failure one warning
// naming the file and `field`, and false.
bool write_aux_file(const std::string& path, const std::string& text, const std::string& field);

}  // namespace tpt
