// The format and save half of parallel/checkpoint.h (the load half: checkpoint_load.cpp).
#include "parallel/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include "core/error.h"

namespace tpt {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Helpers shared with checkpoint_load.cpp

namespace checkpoint_detail {

std::string read_text(const std::string& path) {
  // only regular files: opening a FIFO (or a device) would block or never end
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!ec && fs::exists(st) && !fs::is_regular_file(st)) throw InputError(path + ": not a regular file");
  if (!ec && fs::is_regular_file(st) && fs::file_size(path, ec) > (uintmax_t(1) << 30))
    throw InputError(path + ": larger than 1 GiB, not a checkpoint's text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

DirScan scan_save_dir(const std::string& dir) {
  DirScan s;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string digits = name.starts_with("iter_") ? name.substr(5) : "";  // iter_[0-9]{1,18}
    const bool iter = !digits.empty() && digits.size() <= 18 &&
                      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (name.size() > 8 && name.ends_with(".partial")) s.partial.push_back(name);
    else if (iter && it->is_directory(ec)) s.complete.push_back(std::stoll(digits));
  }
  std::sort(s.complete.begin(), s.complete.end());
  std::sort(s.partial.begin(), s.partial.end());
  return s;
}

}  // namespace checkpoint_detail

using namespace checkpoint_detail;

// ---------------------------------------------------------------------------------------------
// Names, shapes, CRC-32C

std::string checkpoint_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

std::string model_shard_name(int tp_rank, int pp_rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model_tp%02d_pp%03d.safetensors", tp_rank, pp_rank);
  return buf;
}

std::string model_shard_name(int tp_rank, int pp_rank, int dp_rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model_tp%02d_pp%03d_dp%03d.safetensors", tp_rank, pp_rank, dp_rank);
  return buf;
}

std::vector<CkptTensor> flat_range_parts(const CkptTensor& t, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  const size_t nd = t.local_shape.size();
  std::vector<int64_t> stride(nd, 1);
  for (size_t d = nd; d-- > 1;) stride[d - 1] = stride[d] * t.local_shape[d];
  std::vector<CkptTensor> parts;
  for (const auto& [a, b] : ranges)
    for (auto& [off, size] : flat_range_boxes(t.local_shape, a, b)) {
      bool empty = false;  // clipped to the box (the local tensor's padding is not saved)
      for (size_t d = 0; d < nd; ++d) {
        size[d] = std::min(off[d] + size[d], t.box_size[d]) - off[d];
        empty = empty || size[d] <= 0;
      }
      if (empty) continue;
      CkptTensor p = t;
      int64_t at = 0;
      for (size_t d = 0; d < nd; ++d) {
        at += off[d] * stride[d];
        p.box_offset[d] = t.box_offset[d] + off[d];
      }
      p.box_size = size;
      p.data = t.data + at;
      parts.push_back(std::move(p));
    }
  if (parts.size() > 1)
    for (size_t i = 0; i < parts.size(); ++i) parts[i].key = t.name + "#" + std::to_string(i + 1);
  return parts;
}

std::string optim_shard_name(int tp_rank, int pp_rank, int dp_rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "optim_tp%02d_pp%03d_dp%03d.safetensors", tp_rank, pp_rank, dp_rank);
  return buf;
}

std::string describe_saved_grid(const nlohmann::json& grid) {
  if (!grid.is_object() || grid.empty()) return "an unrecorded grid";
  auto size = [&](const char* key) {
    const auto it = grid.find(key);
    return it != grid.end() && it->is_number_integer() ? it->get<int64_t>() : int64_t(1);
  };
  std::string s = "TP " + std::to_string(size("tensor_model_parallel_size"));
  if (size("context_parallel_size") > 1) s += " x CP " + std::to_string(size("context_parallel_size"));
  s += " x PP " + std::to_string(size("pipeline_model_parallel_size")) + " x DP " + std::to_string(size("data_parallel_size"));
  if (size("expert_model_parallel_size") > 1) s += ", EP " + std::to_string(size("expert_model_parallel_size"));
  return s;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

#if !defined(__SSE4_2__)
struct Crc32cTable {
  uint32_t t[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};
#endif

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__SSE4_2__)
  uint64_t c = ~crc & 0xFFFFFFFFu;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
#else
  static const Crc32cTable table;
  uint32_t c = ~crc;
  for (; n > 0; --n) c = table.t[(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
#endif
}

// ---------------------------------------------------------------------------------------------
// Files: a buffered writer that checksums what it writes, fsync of files and directories.

namespace {

class FileSink {
 public:
  explicit FileSink(std::string path, CheckpointWriter::WriteControl* control = nullptr)
      : path_(std::move(path)), control_(control) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) input_error(path_ + ": cannot create: " + std::strerror(errno));
    buf_.resize(size_t{4} << 20);
  }
  ~FileSink() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  void append(const void* data, size_t n) {
    if (control_ && control_->kill_after_bytes >= 0) {  // the test hook: die with part of the file on disk
      const int64_t left = std::exchange(control_->kill_after_bytes, -1);
      if (int64_t(n) >= left) {
        append(data, size_t(left));
        flush();
        ::raise(SIGKILL);
      }
      control_->kill_after_bytes = left - int64_t(n);
    }
    crc_ = crc32c(crc_, data, n);
    part_crc_ = crc32c(part_crc_, data, n);
    bytes_ += n;
    if (used_ + n > buf_.size()) flush();
    if (n >= buf_.size()) {
      raw_write(static_cast<const char*>(data), n);
      return;
    }
    std::memcpy(buf_.data() + used_, data, n);
    used_ += n;
  }
  // Flushes, fsyncs and closes. Returns the bytes written.
  uint64_t finish() {
    flush();
    if (::fsync(fd_) != 0) fail("fsync failed");
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("close failed");
    return bytes_;
  }
  uint32_t crc() const { return crc_; }
  // CRC-32C of what was appended since the last start_part() (one tensor's bytes).
  void start_part() { part_crc_ = 0; }
  uint32_t part_crc() const { return part_crc_; }

 private:
  [[noreturn]] void fail(const std::string& what) {
    input_error(path_ + ": " + what + ": " + std::strerror(errno));
  }
  void flush() {
    raw_write(buf_.data(), used_);
    used_ = 0;
  }
  void raw_write(const char* p, size_t n) {
    if (control_ && control_->cancel && control_->cancel->load()) input_error(path_ + ": save abandoned");
    while (n > 0) {
      ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("write failed");
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  std::string path_;
  CheckpointWriter::WriteControl* control_;
  int fd_ = -1;
  std::vector<char> buf_;
  size_t used_ = 0;
  uint32_t crc_ = 0, part_crc_ = 0;
  uint64_t bytes_ = 0;
};

// fsync of a directory makes the names created, renamed or removed in it durable.
void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) input_error(dir + ": cannot open directory: " + std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) input_error(dir + ": fsync failed: " + std::strerror(err));
}

void write_text(const std::string& path, const std::string& text) {
  FileSink f(path);
  f.append(text.data(), text.size());
  f.finish();
}

// Writes `path` via a temporary file and a rename: readers see the old or the new text, never a mix.
void write_text_atomic(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string tmp = dir + "/." + name + ".tmp", path = dir + "/" + name;
  write_text(tmp, text);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    input_error(path + ": cannot replace: " + std::strerror(errno));
  fsync_dir(dir);
}

void rename_or_fail(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    input_error("cannot rename " + from + " to " + to + ": " + std::strerror(errno));
}

// meta.json, readable and compact: one line per config section and per tensor of the index.
std::string format_meta(const nlohmann::json& meta) {
  std::string s = "{";
  const char* sep = "\n";
  for (auto it = meta.begin(); it != meta.end(); ++it, sep = ",\n") {
    s += sep + std::string(" ") + nlohmann::json(it.key()).dump() + ": ";
    if (it.key() == "files") {
      s += "{";
      const char* fsep = "\n";
      for (auto f = it->begin(); f != it->end(); ++f, fsep = ",\n") {
        nlohmann::json head = f.value();
        head.erase("tensors");
        std::string h = head.dump();
        s += fsep + std::string("  ") + nlohmann::json(f.key()).dump() + ": " + h.substr(0, h.size() - 1) +
             ", \"tensors\": [";
        const char* tsep = "\n";
        for (const auto& t : f.value()["tensors"]) s += tsep + std::string("   ") + t.dump(), tsep = ",\n";
        s += "]}";
      }
      s += "}";
    } else if (it->is_object() && !it->empty()) {
      s += "{";
      const char* osep = "\n";
      for (auto o = it->begin(); o != it->end(); ++o, osep = ",\n")
        s += osep + std::string("  ") + nlohmann::json(o.key()).dump() + ": " + o.value().dump();
      s += "}";
    } else {
      s += it->dump();
    }
  }
  return s + "\n}\n";
}

nlohmann::json tensor_index_entry(const CkptTensor& t) {
  nlohmann::json j = {{"name", t.name}, {"global_shape", t.global_shape}, {"box_offset", t.box_offset},
                      {"box_size", t.box_size}};
  if (!t.key.empty()) j["key"] = t.key;
  return j;
}

// One shard: safetensors with each tensor's box (shape = box_size); its CRC-32C and tensor index
// (with each tensor's own CRC-32C, so that a rank reading a few tensors of a file need not read it all).
struct ShardSummary {
  uint64_t bytes = 0;
  uint32_t crc = 0;
  nlohmann::json tensors = nlohmann::json::array();
};

// Appends the box of t, row-major (the leading part of its local tensor).
void write_box(FileSink& f, const CkptTensor& t) {
  for_each_box_row(t.box_size, t.local_shape, {}, t.box_size, {},
                   [&](int64_t local, int64_t, int64_t n) { f.append(t.data + local, 4 * size_t(n)); });
}

ShardSummary write_shard(const std::string& path, const std::vector<CkptTensor>& tensors,
                         CheckpointWriter::WriteControl& control) {
  ShardSummary s;
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  std::vector<const CkptTensor*> kept;
  for (const CkptTensor& t : tensors) {
    const size_t nd = t.global_shape.size();
    TPT_CHECK(t.box_offset.size() == nd && t.box_size.size() == nd && t.local_shape.size() == nd);
    for (size_t d = 0; d < nd; ++d)
      TPT_CHECK(t.box_size[d] >= 0 && t.box_size[d] <= t.local_shape[d] && t.box_offset[d] >= 0 &&
                t.box_offset[d] + t.box_size[d] <= t.global_shape[d]);
    if (volume(t.box_size) == 0) continue;
    TPT_CHECK(!header.contains(t.file_key()) && t.data != nullptr);
    const uint64_t n = 4 * static_cast<uint64_t>(volume(t.box_size));
    header[t.file_key()] = {{"dtype", "F32"}, {"shape", t.box_size}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    kept.push_back(&t);
  }
  header["__metadata__"] = {{"format", kCheckpointFormat}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();

  FileSink f(path, &control);
  f.append(&header_len, 8);
  f.append(text.data(), text.size());
  for (const CkptTensor* t : kept) {
    f.start_part();
    write_box(f, *t);
    s.tensors.push_back(tensor_index_entry(*t));
    s.tensors.back()["crc32c"] = hex32(f.part_crc());
  }
  s.bytes = f.finish();
  s.crc = f.crc();
  return s;
}

// Test hooks (tests/cli/checkpoint_faults.sh, checkpoint_async.sh), each [R/]WHAT@N: on world rank R
// (all ranks without R/) in the save of iteration N.
//   TPTRAIN_TEST_KILL=<point>@N       SIGKILL at that point: shards, meta, rename, latest (commit),
//                                     written (a background writer done), bytes:B (after B bytes of
//                                     this rank's shard files, part of them flushed)
//   TPTRAIN_TEST_WRITE_ERROR=@N       every shard file's write fails (an injected I/O error)
//   TPTRAIN_TEST_WRITE_DELAY_MS=D     (no R/, no @N) every shard file's write starts D ms late: a slow disk
// The value of hook `env` for this rank and iteration ("" when it does not apply).
std::string test_hook(const char* env, int rank, int64_t iteration) {
  const char* v = std::getenv(env);
  if (!v) return "";
  std::string spec = v;
  const size_t at = spec.rfind('@'), slash = spec.find('/');
  if (at == std::string::npos || spec.substr(at + 1) != std::to_string(iteration)) return "";
  if (slash != std::string::npos && slash < at) {
    if (spec.substr(0, slash) != std::to_string(rank)) return "";
    spec = spec.substr(slash + 1, at - slash - 1);
  } else {
    spec = spec.substr(0, at);
  }
  return spec.empty() ? "1" : spec;
}

}  // namespace

void checkpoint_detail::test_kill_point(const char* point, int64_t iteration, int rank) {
  if (test_hook("TPTRAIN_TEST_KILL", rank, iteration) == point) ::raise(SIGKILL);
}

namespace {

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) spdlog::warn("WARNING: checkpoint: could not delete {}: {}", path, ec.message());
}

}  // namespace

void check_save_dir(const std::string& save_dir) {
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  if (ec || !fs::is_directory(save_dir))
    input_error("checkpoint.save: cannot create directory '" + save_dir + "': " +
                (ec ? ec.message() : std::string("not a directory")));
  const std::string probe = save_dir + "/.tptrain_write_test";
  try {
    write_text(probe, "ok\n");
  } catch (const InputError& e) {
    ::unlink(probe.c_str());  // a failed write (full disk) may have left it, empty
    input_error(std::string("checkpoint.save: directory is not writable: ") + e.what());
  }
  ::unlink(probe.c_str());
}

// ---------------------------------------------------------------------------------------------
// Save

CheckpointWriter::CheckpointWriter(Comm& world, std::string save_dir, int64_t iteration)
    : world_(world), save_dir_(std::move(save_dir)), iteration_(iteration) {
  final_dir_ = save_dir_ + "/" + checkpoint_dir_name(iteration_);
  partial_dir_ = final_dir_ + ".partial";
  if (world_.rank() == 0) {
    check_save_dir(save_dir_);
    for (const std::string& p : scan_save_dir(save_dir_).partial) remove_tree(save_dir_ + "/" + p);
    if (::mkdir(partial_dir_.c_str(), 0755) != 0)
      input_error("checkpoint.save: cannot create " + partial_dir_ + ": " + std::strerror(errno));
  }
  world_.barrier();  // the directory exists before anyone writes into it
  const std::string kill = test_hook("TPTRAIN_TEST_KILL", world_.rank(), iteration_);
  if (kill.starts_with("bytes:")) control_.kill_after_bytes = std::stoll(kill.substr(6));
}

CheckpointWriter::~CheckpointWriter() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(partial_dir_, ec);
}

void CheckpointWriter::write_file(const std::string& file_name, const std::vector<CkptTensor>& tensors) {
  TPT_CHECK(file_name.find('/') == std::string::npos && file_name.ends_with(".safetensors"));
  if (const char* delay = std::getenv("TPTRAIN_TEST_WRITE_DELAY_MS"))
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(delay)));
  if (!test_hook("TPTRAIN_TEST_WRITE_ERROR", world_.rank(), iteration_).empty())
    input_error(partial_dir_ + "/" + file_name + ": write failed: injected error (TPTRAIN_TEST_WRITE_ERROR)");
  ShardSummary s = write_shard(partial_dir_ + "/" + file_name, tensors, control_);
  nlohmann::json side = {{"file", file_name}, {"bytes", s.bytes}, {"crc32c", hex32(s.crc)}, {"tensors", s.tensors}};
  write_text(partial_dir_ + "/" + file_name + ".index.json", side.dump());
  ++files_written_;
  bytes_written_ += s.bytes;
}

void CheckpointWriter::sync_files() {
  if (files_written_ > files_synced_) fsync_dir(partial_dir_);
  files_synced_ = files_written_;
}

uint64_t CheckpointWriter::commit(nlohmann::json meta, int keep_last) {
  sync_files();
  test_kill_point("shards", iteration_, world_.rank());
  // Every rank's files are written and fsynced once this returns anywhere.
  double totals[2] = {double(files_written_), double(bytes_written_)};
  world_.all_reduce(totals, 2, ReduceOp::Sum);
  if (world_.rank() == 0) {
    nlohmann::json files = nlohmann::json::object();
    std::vector<std::string> sidecars;
    for (const auto& e : fs::directory_iterator(partial_dir_)) {
      const std::string name = e.path().filename().string();
      if (!name.ends_with(".index.json")) continue;
      nlohmann::json side = nlohmann::json::parse(read_text(e.path().string()));
      std::string file = side["file"].get<std::string>();
      side.erase("file");
      files[file] = side;
      sidecars.push_back(e.path().string());
    }
    if (double(files.size()) != totals[0])
      internal_error("checkpoint: " + std::to_string(int64_t(totals[0])) + " shard files were written but " +
                     std::to_string(files.size()) + " sidecars found in " + partial_dir_);
    meta["format"] = kCheckpointFormat;
    meta["format_version"] = kCheckpointFormatVersion;
    meta["iteration"] = iteration_;
    meta["checksum"] = "crc32c";
    meta["files"] = files;
    write_text(partial_dir_ + "/meta.json", format_meta(meta));
    for (const std::string& s : sidecars) ::unlink(s.c_str());
    fsync_dir(partial_dir_);
    test_kill_point("meta", iteration_, 0);
    // A complete checkpoint of the same iteration (from an earlier run) is replaced: moved aside
    // under a .partial name first, so that at no moment does a half-deleted iter_N exist.
    std::error_code ec;
    const std::string replaced = final_dir_ + ".replaced.partial";
    const bool existed = fs::exists(final_dir_, ec);
    if (existed) rename_or_fail(final_dir_, replaced);
    rename_or_fail(partial_dir_, final_dir_);
    fsync_dir(save_dir_);
    test_kill_point("rename", iteration_, 0);
    write_text_atomic(save_dir_, kLatestFile, std::to_string(iteration_) + "\n");
    test_kill_point("latest", iteration_, 0);
    if (existed) remove_tree(replaced);
    if (keep_last > 0) {
      std::vector<int64_t> done = scan_save_dir(save_dir_).complete;
      std::erase(done, iteration_);
      std::sort(done.rbegin(), done.rend());
      for (size_t i = size_t(keep_last) - 1; i < done.size(); ++i) {
        const std::string old = save_dir_ + "/" + checkpoint_dir_name(done[i]);
        // renamed first: an interrupted delete leaves a .partial directory, not a broken iter_N
        if (::rename(old.c_str(), (old + ".deleting.partial").c_str()) == 0) remove_tree(old + ".deleting.partial");
      }
    }
  }
  world_.barrier();
  committed_ = true;
  return uint64_t(totals[1]);
}

}  // namespace tpt
