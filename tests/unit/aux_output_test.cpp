// Auxiliary outputs (train/aux_output.h): a write error is one warning naming the file, then the
// output stops; a record is whole or absent. A full disk is /dev/full and a 64 KiB tmpfs (mounted
// here when the test may mount, as root in CI; skipped with a message otherwise).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "train/aux_output.h"
#include "train/tensorboard.h"

namespace tpt {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// spdlog's default logger into a string while it lives.
class CapturedLog {
 public:
  CapturedLog() : old_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(ss_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(old_); }
  std::string text() const { return ss_.str(); }
  int count(const std::string& s) const {
    int n = 0;
    for (size_t p = text().find(s); p != std::string::npos; p = text().find(s, p + 1)) ++n;
    return n;
  }

 private:
  std::ostringstream ss_;
  std::shared_ptr<spdlog::logger> old_;
};

// A tmpfs of `kib` KiB at a fresh folder, unmounted at the end; empty() when mounting is not allowed.
class SmallDisk {
 public:
  explicit SmallDisk(int kib) {
    dir_ = ::testing::TempDir() + "tpt_aux_disk_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    const std::string opts = "size=" + std::to_string(kib) + "k";
    mounted_ = ::mount("tmpfs", dir_.c_str(), "tmpfs", 0, opts.c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) ::umount(dir_.c_str());
    std::filesystem::remove_all(dir_);
  }
  bool mounted() const { return mounted_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

TEST(AuxOutput, WritesWholeRecords) {
  const std::string path = ::testing::TempDir() + "tpt_aux_" + std::to_string(::getpid()) + ".jsonl";
  {
    AuxOutput out(path, "logging.metrics_file");
    EXPECT_TRUE(out.append("{\"iteration\": 1}\n"));
    EXPECT_TRUE(out.append("{\"iteration\": 2}\n"));
    EXPECT_TRUE(out.ok());
  }
  EXPECT_EQ(slurp(path), "{\"iteration\": 1}\n{\"iteration\": 2}\n");
  std::filesystem::remove(path);
  try {
    AuxOutput bad("/nonexistent_dir/m.jsonl", "logging.metrics_file");
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("logging.metrics_file: cannot write '/nonexistent_dir/m.jsonl': No such file"),
              std::string::npos) << e.what();
  }
}

TEST(AuxOutput, DevFullIsOneWarningThenStops) {
  CapturedLog log;
  AuxOutput out("/dev/full", "logging.metrics_file");
  EXPECT_FALSE(out.append("{\"iteration\": 1}\n"));
  EXPECT_FALSE(out.ok());
  EXPECT_FALSE(out.append("{\"iteration\": 2}\n"));
  EXPECT_EQ(log.count("logging.metrics_file: writing '/dev/full' failed: No space left on device; this output stops"), 1)
      << log.text();
  EXPECT_EQ(log.count("warning"), 1) << log.text();
  EXPECT_FALSE(write_aux_file("/dev/full", "{}\n", "logging.trace_file"));
}

// On a disk that fills mid-record, the file holds the records before it, each whole.
TEST(AuxOutput, FullDiskCutsBackToTheLastWholeRecord) {
  SmallDisk disk(64);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): the full-disk case is not run";
  CapturedLog log;
  const std::string path = disk.dir() + "/metrics.jsonl";
  const std::string record = std::string(999, 'x') + "\n";  // 1000 bytes: 64 KiB is not a multiple
  AuxOutput out(path, "logging.metrics_file");
  int written = 0;
  while (out.append(record)) ++written;
  EXPECT_GT(written, 30);
  EXPECT_LT(written, 70);
  const std::string text = slurp(path);
  EXPECT_EQ(text.size(), size_t(written) * record.size());
  for (int i = 0; i < written; ++i) EXPECT_EQ(text.substr(size_t(i) * record.size(), record.size()), record);
  EXPECT_EQ(log.count("failed: No space left on device"), 1) << log.text();
  EXPECT_FALSE(out.append(record));

  // a whole file that does not fit is not left behind cut short
  EXPECT_FALSE(write_aux_file(disk.dir() + "/trace.json", std::string(200000, 't'), "logging.trace_file"));
  EXPECT_FALSE(std::filesystem::exists(disk.dir() + "/trace.json"));
}

// TensorBoard on a full disk: add_scalars turns false, the event file is whole TFRecords.
TEST(AuxOutput, TensorBoardOnAFullDisk) {
  SmallDisk disk(16);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): the full-disk case is not run";
  CapturedLog log;
  std::string path;
  int steps = 0;
  {
    TensorBoardWriter w(disk.dir() + "/tb");
    path = w.path();
    const std::vector<std::pair<std::string, float>> v(40, {"a-fairly-long-scalar-name", 1.5f});
    while (steps < 100000 && w.add_scalars(steps + 1, v)) ++steps;
    EXPECT_FALSE(w.add_scalars(steps + 2, v));
  }
  ASSERT_GT(steps, 0);
  EXPECT_LT(steps, 100000);
  EXPECT_EQ(log.count("logging.tensorboard_dir: writing '" + path + "' failed"), 1) << log.text();
  const std::string bytes = slurp(path);
  const size_t first = tfrecord(event_file_version(0)).size();
  const size_t each = tfrecord(event_scalars(0, 1, std::vector<std::pair<std::string, float>>(
                                                       40, {"a-fairly-long-scalar-name", 1.5f}))).size();
  EXPECT_EQ(bytes.size(), first + size_t(steps) * each);
}

}  // namespace
}  // namespace tpt
