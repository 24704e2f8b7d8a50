#include "parallel/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include "core/error.h"
#include "core/mmap_file.h"
#include "core/safetensors.h"

namespace tpt {

namespace fs = std::filesystem;

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

std::string optim_shard_name(int tp_rank, int pp_rank, int dp_rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "optim_tp%02d_pp%03d_dp%03d.safetensors", tp_rank, pp_rank, dp_rank);
  return buf;
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

int64_t volume(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
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
  explicit FileSink(std::string path) : path_(std::move(path)) {
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
    crc_ = crc32c(crc_, data, n);
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

 private:
  [[noreturn]] void fail(const std::string& what) {
    input_error(path_ + ": " + what + ": " + std::strerror(errno));
  }
  void flush() {
    raw_write(buf_.data(), used_);
    used_ = 0;
  }
  void raw_write(const char* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("write failed");
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  std::string path_;
  int fd_ = -1;
  std::vector<char> buf_;
  size_t used_ = 0;
  uint32_t crc_ = 0;
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

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
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
  return {{"name", t.name}, {"global_shape", t.global_shape}, {"box_offset", t.box_offset}, {"box_size", t.box_size}};
}

// One shard: safetensors with each tensor's box (shape = box_size), its CRC-32C and tensor index.
struct ShardSummary {
  uint64_t bytes = 0;
  uint32_t crc = 0;
  nlohmann::json tensors = nlohmann::json::array();
};

ShardSummary write_shard(const std::string& path, const std::vector<CkptTensor>& tensors) {
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
    TPT_CHECK(!header.contains(t.name) && t.data != nullptr);
    const uint64_t n = 4 * static_cast<uint64_t>(volume(t.box_size));
    header[t.name] = {{"dtype", "F32"}, {"shape", t.box_size}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    kept.push_back(&t);
    s.tensors.push_back(tensor_index_entry(t));
  }
  header["__metadata__"] = {{"format", kCheckpointFormat}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();

  FileSink f(path);
  f.append(&header_len, 8);
  f.append(text.data(), text.size());
  for (const CkptTensor* t : kept) {
    // The box is the leading part of the local tensor: copy it row by row (last dimension).
    const size_t nd = t->box_size.size();
    if (nd == 0) {
      f.append(t->data, 4);
      continue;
    }
    const int64_t row = t->box_size[nd - 1];
    std::vector<int64_t> stride(nd, 1), idx(nd, 0);
    for (size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * t->local_shape[d];
    if (t->box_size == t->local_shape) {
      f.append(t->data, 4 * size_t(volume(t->box_size)));
      continue;
    }
    for (;;) {
      int64_t at = 0;
      for (size_t d = 0; d + 1 < nd; ++d) at += idx[d] * stride[d];
      f.append(t->data + at, 4 * size_t(row));
      int d = int(nd) - 2;
      while (d >= 0 && ++idx[size_t(d)] == t->box_size[size_t(d)]) idx[size_t(d--)] = 0;
      if (d < 0) break;
    }
  }
  s.bytes = f.finish();
  s.crc = f.crc();
  return s;
}

// The iter_* directories of a save directory.
struct DirScan {
  std::vector<int64_t> complete;      // iterations of iter_N directories, ascending
  std::vector<std::string> partial;   // names ending in .partial
};

DirScan scan_save_dir(const std::string& dir) {
  static const std::regex kIter("iter_([0-9]{1,18})");
  DirScan s;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::smatch m;
    if (name.size() > 8 && name.ends_with(".partial")) s.partial.push_back(name);
    else if (std::regex_match(name, m, kIter) && it->is_directory(ec)) s.complete.push_back(std::stoll(m[1]));
  }
  std::sort(s.complete.begin(), s.complete.end());
  std::sort(s.partial.begin(), s.partial.end());
  return s;
}

// Test hook for tests/cli/checkpoint_faults.sh: TPTRAIN_TEST_KILL=<point>@<iteration> ends the
// process with SIGKILL at that point of that iteration's save (a crash at a chosen moment).
void kill_point(const char* point, int64_t iteration) {
  static const char* spec = std::getenv("TPTRAIN_TEST_KILL");
  if (spec && std::string(spec) == std::string(point) + "@" + std::to_string(iteration)) ::raise(SIGKILL);
}

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
}

void CheckpointWriter::write_file(const std::string& file_name, const std::vector<CkptTensor>& tensors) {
  TPT_CHECK(file_name.find('/') == std::string::npos && file_name.ends_with(".safetensors"));
  ShardSummary s = write_shard(partial_dir_ + "/" + file_name, tensors);
  nlohmann::json side = {{"file", file_name}, {"bytes", s.bytes}, {"crc32c", hex32(s.crc)}, {"tensors", s.tensors}};
  write_text(partial_dir_ + "/" + file_name + ".index.json", side.dump());
  ++files_written_;
  bytes_written_ += s.bytes;
}

uint64_t CheckpointWriter::commit(nlohmann::json meta, int keep_last) {
  if (files_written_ > 0) fsync_dir(partial_dir_);
  kill_point("shards", iteration_);
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
    kill_point("meta", iteration_);
    // A complete checkpoint of the same iteration (from an earlier run) is replaced: moved aside
    // under a .partial name first, so that at no moment does a half-deleted iter_N exist.
    std::error_code ec;
    const std::string replaced = final_dir_ + ".replaced.partial";
    const bool existed = fs::exists(final_dir_, ec);
    if (existed) rename_or_fail(final_dir_, replaced);
    rename_or_fail(partial_dir_, final_dir_);
    fsync_dir(save_dir_);
    kill_point("rename", iteration_);
    write_text_atomic(save_dir_, kLatestFile, std::to_string(iteration_) + "\n");
    kill_point("latest", iteration_);
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
  return uint64_t(totals[1]);
}

// ---------------------------------------------------------------------------------------------
// Load

namespace {

struct IndexedFile {
  std::string name;
  uint64_t bytes = 0;
  uint32_t crc = 0;
  std::vector<CkptTensor> tensors;  // data unused
};

struct ParsedMeta {
  nlohmann::json meta;
  int64_t iteration = 0;
  std::vector<IndexedFile> files;  // sorted by name
};

std::vector<int64_t> int_list(const nlohmann::json& j, const char* what) {
  if (!j.is_array()) throw InputError(std::string(what) + " is not a list");
  std::vector<int64_t> v;
  for (const auto& x : j) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      throw InputError(std::string(what) + " holds " + x.dump() + ", not a non-negative integer");
    v.push_back(x.get<int64_t>());
  }
  return v;
}

// Parses and checks meta.json of the checkpoint directory `dir`: format, iteration (when
// expected_iteration >= 0), files, and that the saved boxes of every tensor tile its global shape.
// Throws InputError describing the problem (without the path).
ParsedMeta parse_meta(const std::string& dir, int64_t expected_iteration) {
  ParsedMeta p;
  std::string text;
  try {
    text = read_text(dir + "/meta.json");
  } catch (const InputError&) {
    throw InputError("meta.json is missing or unreadable");
  }
  try {
    p.meta = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("meta.json is not valid JSON: ") + e.what());
  }
  const nlohmann::json& m = p.meta;
  auto bad = [](const std::string& what) { throw InputError("meta.json: " + what); };
  if (!m.is_object() || m.value("format", "") != kCheckpointFormat)
    bad(std::string("not a tptrain checkpoint (\"format\" is not \"") + kCheckpointFormat + "\")");
  if (!m["format_version"].is_number_integer() || m["format_version"].get<int>() < 1)
    bad("missing or invalid format_version");
  if (m["format_version"].get<int>() > kCheckpointFormatVersion)
    bad("format_version " + m["format_version"].dump() + " is newer than this tptrain reads (" +
        std::to_string(kCheckpointFormatVersion) + ")");
  if (!m["iteration"].is_number_integer()) bad("missing iteration");
  p.iteration = m["iteration"].get<int64_t>();
  if (expected_iteration >= 0 && p.iteration != expected_iteration)
    bad("iteration " + std::to_string(p.iteration) + " does not match the directory name");
  if (m.value("checksum", "") != "crc32c") bad("checksum is not \"crc32c\"");
  if (!m["files"].is_object() || m["files"].empty()) bad("no files listed");
  std::map<std::string, std::vector<const CkptTensor*>> by_name;
  for (auto it = m["files"].begin(); it != m["files"].end(); ++it) {
    IndexedFile f;
    f.name = it.key();
    if (f.name.find('/') != std::string::npos || f.name.empty() || f.name[0] == '.') bad("bad file name '" + f.name + "'");
    try {
      const nlohmann::json& v = it.value();
      if (!v["bytes"].is_number_unsigned()) bad("bytes");
      f.bytes = v["bytes"].get<uint64_t>();
      f.crc = uint32_t(std::stoul(v.at("crc32c").get<std::string>(), nullptr, 16));
      for (const auto& t : v.at("tensors")) {
        CkptTensor c;
        c.name = t.at("name").get<std::string>();
        c.global_shape = int_list(t.at("global_shape"), "global_shape");
        c.box_offset = int_list(t.at("box_offset"), "box_offset");
        c.box_size = int_list(t.at("box_size"), "box_size");
        c.local_shape = c.box_size;
        const size_t nd = c.global_shape.size();
        if (c.box_offset.size() != nd || c.box_size.size() != nd) bad("tensor " + c.name + ": box rank");
        for (size_t d = 0; d < nd; ++d)
          if (c.box_offset[d] + c.box_size[d] > c.global_shape[d])
            bad("tensor " + c.name + ": box outside its global shape");
        f.tensors.push_back(std::move(c));
      }
    } catch (const InputError&) {
      throw;
    } catch (const std::exception& e) {
      bad("file " + f.name + ": malformed entry (" + e.what() + ")");
    }
    p.files.push_back(std::move(f));
  }
  std::sort(p.files.begin(), p.files.end(), [](const IndexedFile& a, const IndexedFile& b) { return a.name < b.name; });
  for (const IndexedFile& f : p.files)
    for (const CkptTensor& t : f.tensors) by_name[t.name].push_back(&t);
  // The saved boxes of a tensor are disjoint and cover it exactly.
  for (const auto& [name, boxes] : by_name) {
    int64_t covered = 0;
    for (size_t i = 0; i < boxes.size(); ++i) {
      if (boxes[i]->global_shape != boxes[0]->global_shape)
        bad("tensor " + name + " has different global shapes in different files");
      covered += volume(boxes[i]->box_size);
      for (size_t j = 0; j < i; ++j) {
        bool overlap = true;
        for (size_t d = 0; d < boxes[i]->box_size.size(); ++d)
          overlap = overlap && boxes[i]->box_offset[d] < boxes[j]->box_offset[d] + boxes[j]->box_size[d] &&
                    boxes[j]->box_offset[d] < boxes[i]->box_offset[d] + boxes[i]->box_size[d];
        if (overlap) bad("tensor " + name + ": two saved boxes overlap");
      }
    }
    if (covered != volume(boxes[0]->global_shape))
      bad("tensor " + name + ": the saved boxes cover " + std::to_string(covered) + " of its " +
          std::to_string(volume(boxes[0]->global_shape)) + " elements");
  }
  return p;
}

// Problems found while verifying a file, in the order reported when several ranks disagree.
enum Reason { kMetaUnreadable = 1, kMissing, kSize, kChecksum, kHeader };

std::string reason_text(int reason) {
  switch (reason) {
    case kMetaUnreadable: return "meta.json could not be read on every rank";
    case kMissing: return "missing or unreadable";
    case kSize: return "has a different size than meta.json records (truncated?)";
    case kChecksum: return "checksum mismatch (CRC-32C differs from meta.json)";
    case kHeader: return "safetensors header does not match the tensor index in meta.json";
  }
  return "unknown problem";
}

// The agreed verdict of one candidate: max over ranks of -(slot * 8 + reason), slot 0 = meta.json,
// slot i + 1 = file i; kOk when every rank is content.
constexpr double kOk = -1e15;
double verdict(size_t slot, int reason) { return -double(slot * 8 + size_t(reason)); }

bool boxes_intersect(const CkptTensor& t, const CheckpointReader::SavedBox& b) {
  for (size_t d = 0; d < b.size.size(); ++d)
    if (std::max(t.box_offset[d], b.offset[d]) >= std::min(t.box_offset[d] + t.box_size[d], b.offset[d] + b.size[d]))
      return false;
  return true;
}

// Verifies one file against its index entry; returns 0 or a Reason. On success `out` holds it open.
int verify_file(const std::string& dir, const IndexedFile& f, std::unique_ptr<SafetensorsReader>& out,
                uint64_t& verified) {
  const std::string path = dir + "/" + f.name;
  try {
    MappedFile mf(path);
    if (mf.size() != f.bytes) return kSize;
    if (crc32c(0, mf.data(), mf.size()) != f.crc) return kChecksum;
    verified += mf.size();
  } catch (const InputError&) {
    return kMissing;
  }
  try {
    auto r = std::make_unique<SafetensorsReader>(path);
    for (const CkptTensor& t : f.tensors)
      if (!r->contains(t.name) || r->info(t.name).dtype != "F32" || r->info(t.name).shape != t.box_size)
        return kHeader;
    out = std::move(r);
  } catch (const InputError&) {
    return kHeader;
  }
  return 0;
}

// Rank 0's view of a directory given to open(): the candidates to try, newest first.
struct Candidates {
  bool single = false;                 // `dir` is one checkpoint directory
  bool any = false;                    // anything that looks like a checkpoint was found
  std::vector<int64_t> iterations;     // save-dir mode, newest first
  std::vector<std::string> problems;   // for the final error
};

Candidates find_candidates(const std::string& dir) {
  Candidates c;
  std::error_code ec;
  if (fs::exists(dir + "/meta.json", ec)) {
    c.single = c.any = true;
    return c;
  }
  if (!fs::is_directory(dir, ec)) return c;
  DirScan scan = scan_save_dir(dir);
  for (const std::string& p : scan.partial)
    spdlog::warn("WARNING: checkpoint: ignoring incomplete checkpoint {}/{}", dir, p);
  int64_t newest = std::numeric_limits<int64_t>::max();
  const std::string latest = dir + "/" + kLatestFile;
  if (fs::exists(latest, ec)) {
    c.any = true;
    std::string text;
    try {
      text = read_text(latest);
    } catch (const InputError&) {
    }
    static const std::regex kNumber("\\s*([0-9]{1,18})\\s*");
    std::smatch m;
    if (std::regex_match(text, m, kNumber)) {
      int64_t n = std::stoll(m[1]);
      if (std::find(scan.complete.begin(), scan.complete.end(), n) == scan.complete.end()) {
        std::string p = std::string(kLatestFile) + " names iteration " + std::to_string(n) + " but " +
                        checkpoint_dir_name(n) + " does not exist";
        spdlog::warn("WARNING: checkpoint {}: {}; falling back to an older checkpoint", dir, p);
        c.problems.push_back(p);
      }
      newest = n;
    } else {
      std::string p = std::string(kLatestFile) + " does not hold an iteration number";
      spdlog::warn("WARNING: checkpoint {}: {}; using the newest complete checkpoint", dir, p);
      c.problems.push_back(p);
    }
  } else if (!scan.complete.empty()) {
    spdlog::warn("WARNING: checkpoint {}: no {}; using the newest complete checkpoint", dir, kLatestFile);
  }
  for (auto it = scan.complete.rbegin(); it != scan.complete.rend(); ++it)
    if (*it <= newest) c.iterations.push_back(*it);
  c.any = c.any || !scan.complete.empty();
  return c;
}

// Rank 0: checks the model against the tensor index; throws InputError (fatal, no fallback).
void check_model(const std::string& path, const ParsedMeta& p, const std::vector<GlobalTensor>& model) {
  if (model.empty()) return;
  std::map<std::string, std::vector<int64_t>> saved;
  for (const IndexedFile& f : p.files)
    for (const CkptTensor& t : f.tensors) saved[t.name] = t.global_shape;
  std::map<std::string, std::vector<int64_t>> want;
  for (const GlobalTensor& g : model) want[g.name] = g.shape;
  const std::string pre = "checkpoint " + path + " does not match the model: ";
  for (const GlobalTensor& g : model) {
    auto it = saved.find(g.name);
    if (it == saved.end())
      input_error(pre + "tensor '" + g.name + "' " + shape_string(g.shape) + " of the model is not in the checkpoint");
    if (it->second != g.shape)
      input_error(pre + "tensor '" + g.name + "' has global shape " + shape_string(it->second) +
                  " in the checkpoint and " + shape_string(g.shape) + " in the model");
  }
  for (const auto& [name, shape] : saved)
    if (!want.count(name))
      input_error(pre + "the checkpoint has tensor '" + name + "' " + shape_string(shape) +
                  " that the model does not have");
}

// Ranks other than the one that throws wait here to be ended by its abort (see apps/train.cpp):
// that rank alone prints the reason.
[[noreturn]] void wait_for_abort(Comm& world) {
  world.barrier();
  internal_error("checkpoint: another rank failed but the job was not aborted");
}

}  // namespace

CheckpointReader::~CheckpointReader() = default;

std::unique_ptr<CheckpointReader> CheckpointReader::open(Comm& world, const LoadRequest& req) {
  const bool rank0 = world.rank() == 0;
  Candidates cand;
  if (rank0) cand = find_candidates(req.dir);
  size_t next = 0;
  for (;;) {
    // Rank 0 proposes: >= 0 an iteration, -1 none left, -2 no checkpoint at all; [1]: single mode.
    double proposal[2] = {-3, 0};
    std::unique_ptr<ParsedMeta> parsed;
    if (rank0) {
      proposal[1] = cand.single ? 1 : 0;
      if (!cand.any) proposal[0] = -2;
      else proposal[0] = -1;
      while (proposal[0] == -1 && (cand.single ? next < 1 : next < cand.iterations.size())) {
        const int64_t it = cand.single ? -1 : cand.iterations[next];
        const std::string path = cand.single ? req.dir : req.dir + "/" + checkpoint_dir_name(it);
        const std::string label = cand.single ? path : checkpoint_dir_name(it);
        ++next;
        try {
          auto p = std::make_unique<ParsedMeta>(parse_meta(path, it));
          for (const IndexedFile& f : p->files) {
            struct stat st {};
            if (::stat((path + "/" + f.name).c_str(), &st) != 0)
              throw InputError(f.name + " is missing");
            if (uint64_t(st.st_size) != f.bytes)
              throw InputError(f.name + " has " + std::to_string(st.st_size) + " bytes, meta.json records " +
                               std::to_string(f.bytes) + " (truncated?)");
          }
          parsed = std::move(p);
        } catch (const InputError& e) {
          spdlog::warn("WARNING: checkpoint {}: {}; {}", path, e.what(),
                       cand.single ? "it cannot be loaded" : "falling back to an older checkpoint");
          cand.problems.push_back(label + ": " + e.what());
          continue;
        }
        check_model(path, *parsed, req.model);  // a mismatch is an error, not a reason to fall back
        proposal[0] = double(parsed->iteration);
      }
    }
    world.all_reduce(proposal, 2, ReduceOp::Max);
    if (proposal[0] == -2) return nullptr;
    if (proposal[0] == -1) {
      if (!rank0) wait_for_abort(world);
      std::string msg = "checkpoint.load: no usable checkpoint in " + req.dir;
      for (const std::string& p : cand.problems) msg += "; " + p;
      input_error(msg);
    }
    const bool single = proposal[1] != 0;
    const std::string path = single ? req.dir : req.dir + "/" + checkpoint_dir_name(int64_t(proposal[0]));

    // Every rank: its own view of meta.json, then the files its boxes need.
    std::unique_ptr<CheckpointReader> r(new CheckpointReader());
    r->path_ = path;
    double result = kOk;
    try {
      if (!parsed) parsed = std::make_unique<ParsedMeta>(parse_meta(path, single ? -1 : int64_t(proposal[0])));
    } catch (const InputError&) {
      result = verdict(0, kMetaUnreadable);
    }
    if (parsed) {
      r->meta_ = parsed->meta;
      r->iteration_ = parsed->iteration;
      for (const IndexedFile& f : parsed->files)
        for (const CkptTensor& t : f.tensors) {
          r->shapes_[t.name] = t.global_shape;
          r->boxes_[t.name].push_back({f.name, t.box_offset, t.box_size});
        }
      std::vector<bool> needed(parsed->files.size(), req.verify_all_files);
      for (const CkptTensor& t : req.wanted) {
        auto it = r->boxes_.find(t.name);
        if (it == r->boxes_.end() || r->shapes_[t.name] != t.global_shape)
          internal_error("checkpoint: wanted tensor '" + t.name + "' " + shape_string(t.global_shape) +
                         " is not in " + path + " (the model check should have caught it)");
        for (const SavedBox& b : it->second)
          if (boxes_intersect(t, b))
            for (size_t i = 0; i < parsed->files.size(); ++i)
              if (parsed->files[i].name == b.file) needed[i] = true;
      }
      for (size_t i = 0; i < parsed->files.size() && result == kOk; ++i) {
        if (!needed[i]) continue;
        int reason = verify_file(path, parsed->files[i], r->files_[parsed->files[i].name], r->bytes_verified_);
        if (reason) result = verdict(i + 1, reason);
      }
    }
    world.all_reduce(&result, 1, ReduceOp::Max);
    if (result == kOk) return r;
    if (rank0) {
      const auto code = size_t(-result);
      const size_t slot = code / 8;
      const std::string what = slot == 0 ? std::string("meta.json") : parsed->files[slot - 1].name;
      const std::string problem = what + ": " + reason_text(int(code % 8));
      spdlog::warn("WARNING: checkpoint {}: {}; {}", path, problem,
                   single ? "it cannot be loaded" : "falling back to an older checkpoint");
      cand.problems.push_back((single ? path : checkpoint_dir_name(int64_t(proposal[0]))) + ": " + problem);
    }
  }
}

void CheckpointReader::read(const CkptTensor& t) {
  const size_t nd = t.local_shape.size();
  TPT_CHECK(t.data && t.global_shape.size() == nd && t.box_offset.size() == nd && t.box_size.size() == nd);
  std::fill(t.data, t.data + volume(t.local_shape), 0.0f);
  auto it = boxes_.find(t.name);
  if (it == boxes_.end() || shapes_[t.name] != t.global_shape)
    input_error("checkpoint " + path_ + ": no tensor '" + t.name + "' of global shape " + shape_string(t.global_shape));
  std::vector<int64_t> lstride(nd, 1);
  for (size_t d = nd; d-- > 1;) lstride[d - 1] = lstride[d] * t.local_shape[d];
  for (const SavedBox& b : it->second) {
    if (!boxes_intersect(t, b)) continue;
    auto f = files_.find(b.file);
    if (f == files_.end() || !f->second)
      internal_error("checkpoint: read() of '" + t.name + "', which open() was not asked for");
    SafetensorsReader* file = f->second.get();
    std::vector<int64_t> lo(nd), size(nd), src(nd);
    for (size_t d = 0; d < nd; ++d) {
      lo[d] = std::max(t.box_offset[d], b.offset[d]);
      size[d] = std::min(t.box_offset[d] + t.box_size[d], b.offset[d] + b.size[d]) - lo[d];
      src[d] = lo[d] - b.offset[d];
    }
    const int64_t n = volume(size);
    bytes_read_ += uint64_t(n) * 4;
    int64_t dst0 = 0;  // local offset of the intersection's first element
    for (size_t d = 0; d < nd; ++d) dst0 += (lo[d] - t.box_offset[d]) * lstride[d];
    bool contiguous = true;  // the intersection spans whole local rows in every inner dimension
    for (size_t d = 1; d < nd; ++d) contiguous = contiguous && size[d] == t.local_shape[d];
    if (contiguous) {
      file->read_box(t.name, src, size, t.data + dst0);
      continue;
    }
    std::vector<float> tmp(static_cast<size_t>(n));
    file->read_box(t.name, src, size, tmp.data());
    const int64_t row = size[nd - 1];
    std::vector<int64_t> idx(nd, 0);
    for (int64_t done = 0; done < n; done += row) {
      int64_t at = dst0;
      for (size_t d = 0; d + 1 < nd; ++d) at += idx[d] * lstride[d];
      std::copy(tmp.begin() + done, tmp.begin() + done + row, t.data + at);
      for (int d = int(nd) - 2; d >= 0 && ++idx[size_t(d)] == size[size_t(d)]; --d) idx[size_t(d)] = 0;
    }
  }
}

}  // namespace tpt
