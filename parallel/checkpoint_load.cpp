// The load half of parallel/checkpoint.h: finding, verifying and reading a checkpoint.
#include <sys/stat.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <thread>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/mmap_file.h"
#include "core/safetensors.h"
#include "parallel/checkpoint.h"

namespace tpt {

namespace fs = std::filesystem;
using namespace checkpoint_detail;

namespace {

struct IndexedFile {
  std::string name;
  uint64_t bytes = 0;
  uint32_t crc = 0;
  std::vector<CkptTensor> tensors;  // data unused
  std::vector<int64_t> tensor_crc;  // CRC-32C of each tensor's bytes; -1: not recorded
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
// j[key] of a const JSON value, or null when j is no object or lacks the key (a const operator[]
// on a missing key is undefined behaviour in nlohmann::json: a fuzzer found it reading freed memory).
const nlohmann::json& field(const nlohmann::json& j, const char* key) {
  static const nlohmann::json null;
  if (!j.is_object()) return null;
  auto it = j.find(key);
  return it == j.end() ? null : *it;
}

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
  if (!field(m, "format_version").is_number_integer() || field(m, "format_version").get<int>() < 1)
    bad("missing or invalid format_version");
  if (field(m, "format_version").get<int>() > kCheckpointFormatVersion)
    bad("format_version " + field(m, "format_version").dump() + " is newer than this tptrain reads (" +
        std::to_string(kCheckpointFormatVersion) + ")");
  if (!field(m, "iteration").is_number_integer()) bad("missing iteration");
  p.iteration = field(m, "iteration").get<int64_t>();
  if (expected_iteration >= 0 && p.iteration != expected_iteration)
    bad("iteration " + std::to_string(p.iteration) + " does not match the directory name");
  if (m.value("checksum", "") != "crc32c") bad("checksum is not \"crc32c\"");
  if (!field(m, "files").is_object() || field(m, "files").empty()) bad("no files listed");
  std::map<std::string, std::vector<const CkptTensor*>> by_name;
  for (auto it = field(m, "files").begin(); it != field(m, "files").end(); ++it) {
    IndexedFile f;
    f.name = it.key();
    if (f.name.find('/') != std::string::npos || f.name.empty() || f.name[0] == '.') bad("bad file name '" + f.name + "'");
    try {
      const nlohmann::json& v = it.value();
      if (!field(v, "bytes").is_number_unsigned()) bad("bytes");
      f.bytes = field(v, "bytes").get<uint64_t>();
      f.crc = uint32_t(std::stoul(v.at("crc32c").get<std::string>(), nullptr, 16));
      for (const auto& t : v.at("tensors")) {
        CkptTensor c;
        c.name = t.at("name").get<std::string>();
        c.global_shape = int_list(t.at("global_shape"), "global_shape");
        c.box_offset = int_list(t.at("box_offset"), "box_offset");
        c.box_size = int_list(t.at("box_size"), "box_size");
        c.local_shape = c.box_size;
        if (t.contains("key")) {  // format 2: several boxes of one tensor in a file
          if (!field(t, "key").is_string() || field(t, "key").get<std::string>().empty()) bad("tensor " + c.name + ": bad key");
          c.key = field(t, "key").get<std::string>();
        }
        f.tensor_crc.push_back(t.contains("crc32c") ? int64_t(std::stoul(field(t, "crc32c").get<std::string>(), nullptr, 16)) : -1);
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

// The two agreements of CheckpointReader::open, each one collective over the world (a MAX
// all-reduce of doubles; the encoding stays in these functions).
// Which checkpoint to try: rank 0 proposes, every rank learns its proposal.
struct Proposal {
  enum class Status { Load, NoneUsable, NoCheckpoint };
  Status status = Status::NoCheckpoint;
  int64_t iteration = -1;  // Load: the iteration (-1: a single checkpoint directory)
  bool single = false;     // checkpoint.load names one checkpoint, not a save directory
};
Proposal share_proposal(Comm& world, const Proposal& rank0s) {
  constexpr double kNone = -1e300;  // loses every MAX
  double v[3] = {kNone, kNone, kNone};
  if (world.rank() == 0) v[0] = double(int(rank0s.status)), v[1] = double(rank0s.iteration), v[2] = rank0s.single;
  world.all_reduce(v, 3, ReduceOp::Max);
  return {Proposal::Status(int(v[0])), int64_t(v[1]), v[2] != 0};
}
// What is wrong with the proposed checkpoint on any rank: the problem in the lowest slot (0 =
// meta.json, i + 1 = file i), with the lowest reason there; none when every rank is content.
struct Problem {
  size_t slot = 0;
  int reason = 0;  // 0: none
};
Problem worst_problem(Comm& world, const Problem& mine) {
  double v = mine.reason ? -double(mine.slot * 8 + size_t(mine.reason)) : -1e15;
  world.all_reduce(&v, 1, ReduceOp::Max);
  if (v == -1e15) return {};
  const auto code = size_t(-v);
  return {code / 8, int(code % 8)};
}

bool boxes_intersect(const CkptTensor& t, const CheckpointReader::SavedBox& b) {
  for (size_t d = 0; d < b.size.size(); ++d)
    if (std::max(t.box_offset[d], b.offset[d]) >= std::min(t.box_offset[d] + t.box_size[d], b.offset[d] + b.size[d]))
      return false;
  return true;
}

// Verifies one file against its index entry; returns 0 or a Reason. On success `out` holds it open.
// A rank that reads only some tensors of a file (`touched`; null: all) checks their CRC-32Cs and
// the header (every tensor's name, dtype, shape and place), not the whole file.
int verify_file(const std::string& dir, const IndexedFile& f, const std::set<std::string>* touched,
                std::unique_ptr<SafetensorsReader>& out, uint64_t& verified) {
  const std::string path = dir + "/" + f.name;
  bool per_tensor = touched && touched->size() < f.tensors.size();
  for (size_t i = 0; per_tensor && i < f.tensors.size(); ++i)
    per_tensor = f.tensor_crc[i] >= 0 || !touched->count(f.tensors[i].file_key());
  try {
    MappedFile mf(path);
    if (mf.size() != f.bytes) return kSize;
    if (!per_tensor) {
      if (crc32c(0, mf.data(), mf.size()) != f.crc) return kChecksum;
      verified += mf.size();
    }
  } catch (const InputError&) {
    return kMissing;
  }
  try {
    auto r = std::make_unique<SafetensorsReader>(path);
    uint64_t at = 0;  // tensors are stored in index order, back to back
    for (size_t i = 0; i < f.tensors.size(); ++i) {
      const CkptTensor& t = f.tensors[i];
      if (!r->contains(t.file_key())) return kHeader;
      const SafetensorInfo& info = r->info(t.file_key());
      if (info.dtype != "F32" || info.shape != t.box_size || info.begin != at) return kHeader;
      at = info.end;
      if (per_tensor && touched->count(t.file_key())) {
        if (crc32c(0, r->raw(t.file_key()), info.end - info.begin) != uint32_t(f.tensor_crc[i])) return kChecksum;
        verified += info.end - info.begin;
      }
    }
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
    // an iteration number of 1 to 18 digits between white space (no std::regex on file contents: it
    // matches recursively and overflows the stack on long inputs)
    const size_t b = text.find_first_not_of(" \t\n\v\f\r"), e = text.find_last_not_of(" \t\n\v\f\r");
    const std::string digits = b == std::string::npos ? "" : text.substr(b, e - b + 1);
    if (!digits.empty() && digits.size() <= 18 &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      int64_t n = std::stoll(digits);
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
void check_model(const std::string& path, const ParsedMeta& p, const std::vector<GlobalTensor>& model,
                 const std::function<bool(const std::string&)>& optional) {
  if (model.empty()) return;
  std::map<std::string, std::vector<int64_t>> saved;
  for (const IndexedFile& f : p.files)
    for (const CkptTensor& t : f.tensors) saved[t.name] = t.global_shape;
  std::map<std::string, std::vector<int64_t>> want;
  for (const GlobalTensor& g : model) want[g.name] = g.shape;
  const std::string pre = "checkpoint " + path + " does not match the model: ";
  for (const GlobalTensor& g : model) {
    auto it = saved.find(g.name);
    if (it == saved.end() && optional && optional(g.name)) continue;
    if (it == saved.end())
      input_error(pre + "tensor '" + g.name + "' " + shape_string(g.shape) + " of the model is not in the checkpoint");
    if (it->second != g.shape)
      input_error(pre + "tensor '" + g.name + "' has global shape " + shape_string(it->second) +
                  " in the checkpoint and " + shape_string(g.shape) + " in the model");
  }
  for (const auto& [name, shape] : saved)
    if (!want.count(name) && !(optional && optional(name)))
      input_error(pre + "the checkpoint has tensor '" + name + "' " + shape_string(shape) +
                  " that the model does not have");
}

// Ranks other than the one that throws wait here to be ended by its abort (see apps/train.cpp):
// that rank alone prints the reason.
[[noreturn]] void wait_for_abort(Comm& world) {
  world.barrier();
  internal_error("checkpoint: another rank failed but the job was not aborted");
}

// Rank 0: the newest candidate from `next` on whose meta.json it can read and whose files exist
// (parsed: its meta); the ones passed over go into cand.problems.
Proposal propose(Candidates& cand, size_t& next, const LoadRequest& req, std::unique_ptr<ParsedMeta>& parsed) {
  Proposal mine;
  mine.single = cand.single;
  mine.status = cand.any ? Proposal::Status::NoneUsable : Proposal::Status::NoCheckpoint;
  while (mine.status == Proposal::Status::NoneUsable && (cand.single ? next < 1 : next < cand.iterations.size())) {
    const int64_t it = cand.single ? -1 : cand.iterations[next];
    const std::string path = cand.single ? req.dir : req.dir + "/" + checkpoint_dir_name(it);
    const std::string label = cand.single ? path : checkpoint_dir_name(it);
    ++next;
    try {
      auto p = std::make_unique<ParsedMeta>(parse_meta(path, it));
      for (const IndexedFile& f : p->files) {
        struct stat st {};
        if (::stat((path + "/" + f.name).c_str(), &st) != 0) throw InputError(f.name + " is missing");
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
    check_model(path, *parsed, req.model, req.optional);  // a mismatch is an error, not a reason to fall back
    mine.status = Proposal::Status::Load;
    mine.iteration = parsed->iteration;
  }
  return mine;
}

}  // namespace

CheckpointReader::~CheckpointReader() = default;

std::unique_ptr<CheckpointReader> CheckpointReader::open(Comm& world, const LoadRequest& req) {
  const bool rank0 = world.rank() == 0;
  Candidates cand;
  if (rank0) cand = find_candidates(req.dir);
  size_t next = 0;
  for (;;) {
    std::unique_ptr<ParsedMeta> parsed;
    const Proposal mine = rank0 ? propose(cand, next, req, parsed) : Proposal{};
    const Proposal proposal = share_proposal(world, mine);
    if (proposal.status == Proposal::Status::NoCheckpoint) return nullptr;
    if (proposal.status == Proposal::Status::NoneUsable) {
      if (!rank0) wait_for_abort(world);
      std::string msg = "checkpoint.load: no usable checkpoint in " + req.dir;
      for (const std::string& p : cand.problems) msg += "; " + p;
      input_error(msg);
    }
    const bool single = proposal.single;
    const std::string path = single ? req.dir : req.dir + "/" + checkpoint_dir_name(proposal.iteration);

    // Every rank: its own view of meta.json, then the files its boxes need.
    std::unique_ptr<CheckpointReader> r(new CheckpointReader());
    r->path_ = path;
    Problem problem;
    try {
      if (!parsed) parsed = std::make_unique<ParsedMeta>(parse_meta(path, single ? -1 : proposal.iteration));
    } catch (const InputError&) {
      problem = {0, kMetaUnreadable};
    }
    if (parsed) {
      r->meta_ = parsed->meta;
      r->iteration_ = parsed->iteration;
      for (const IndexedFile& f : parsed->files)
        for (const CkptTensor& t : f.tensors) {
          r->shapes_[t.name] = t.global_shape;
          r->boxes_[t.name].push_back({f.name, t.file_key(), t.box_offset, t.box_size});
        }
      // the tensors of each file this rank's boxes intersect
      std::map<std::string, std::set<std::string>> touched;
      for (const CkptTensor& t : req.wanted) {
        auto it = r->boxes_.find(t.name);
        if (it == r->boxes_.end() && req.optional && req.optional(t.name)) continue;  // not read (tensors())
        if (it == r->boxes_.end() || r->shapes_[t.name] != t.global_shape)
          internal_error("checkpoint: wanted tensor '" + t.name + "' " + shape_string(t.global_shape) +
                         " is not in " + path + " (the model check should have caught it)");
        for (const SavedBox& b : it->second)
          if (boxes_intersect(t, b)) touched[b.file].insert(b.key);
      }
      for (size_t i = 0; i < parsed->files.size() && !problem.reason; ++i) {
        const IndexedFile& f = parsed->files[i];
        auto tf = touched.find(f.name);
        bool needed = req.verify_all_files || tf != touched.end();
        for (size_t t = 0; t < f.tensors.size() && !needed && req.needs_tensor; ++t)
          needed = req.needs_tensor(f.tensors[t].name);
        if (needed && tf == touched.end()) tf = touched.emplace(f.name, std::set<std::string>()).first;
        if (needed && !req.verify_all_files && tf->second.empty())  // whole tensors by name: the whole file
          for (const CkptTensor& t : f.tensors) tf->second.insert(t.file_key());
        if (!needed) {
          if (!req.warn_other_files) continue;
          std::unique_ptr<SafetensorsReader> unused;
          if (int reason = verify_file(path, f, nullptr, unused, r->bytes_verified_))
            spdlog::warn("WARNING: checkpoint {}: {}: {} (not read here: the model shards are intact and are used)",
                         path, f.name, reason_text(reason));
          continue;
        }
        int reason = verify_file(path, f, req.verify_all_files ? nullptr : &tf->second, r->files_[f.name],
                                 r->bytes_verified_);
        if (reason) problem = {i + 1, reason};
      }
    }
    const Problem worst = worst_problem(world, problem);
    if (!worst.reason) return r;
    if (rank0) {
      const std::string what = worst.slot == 0 ? std::string("meta.json") : parsed->files[worst.slot - 1].name;
      const std::string text = what + ": " + reason_text(worst.reason);
      spdlog::warn("WARNING: checkpoint {}: {}; {}", path, text,
                   single ? "it cannot be loaded" : "falling back to an older checkpoint");
      cand.problems.push_back((single ? path : checkpoint_dir_name(proposal.iteration)) + ": " + text);
    }
  }
}

void CheckpointReader::read(const CkptTensor& t) { bytes_read_ += read_one(t); }

void CheckpointReader::read_all(const std::vector<CkptTensor>& tensors, int threads) {
  threads = std::max(1, std::min(threads, int(tensors.size())));
  const size_t n_threads = size_t(threads);
  std::vector<uint64_t> bytes(n_threads, 0);
  std::vector<std::exception_ptr> errors(n_threads);
  auto work = [&](int w) {  // tensors w, w + threads, ...: the big and the small ones mixed
    try {
      for (size_t i = size_t(w); i < tensors.size(); i += size_t(threads)) bytes[size_t(w)] += read_one(tensors[i]);
    } catch (...) {
      errors[size_t(w)] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < threads; ++w) pool.emplace_back(work, w);
  work(0);
  for (std::thread& t : pool) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (uint64_t b : bytes) bytes_read_ += b;
}

uint64_t CheckpointReader::read_one(const CkptTensor& t) const {
  const size_t nd = t.local_shape.size();
  TPT_CHECK(t.data && t.global_shape.size() == nd && t.box_offset.size() == nd && t.box_size.size() == nd);
  std::fill(t.data, t.data + volume(t.local_shape), 0.0f);
  auto it = boxes_.find(t.name);
  const auto shape = shapes_.find(t.name);
  uint64_t bytes = 0;
  if (it == boxes_.end() || shape == shapes_.end() || shape->second != t.global_shape)
    input_error("checkpoint " + path_ + ": no tensor '" + t.name + "' of global shape " + shape_string(t.global_shape));
  for (const SavedBox& b : it->second) {
    if (!boxes_intersect(t, b)) continue;
    auto f = files_.find(b.file);
    if (f == files_.end() || !f->second)
      internal_error("checkpoint: read() of '" + t.name + "', which open() was not asked for");
    std::vector<int64_t> size(nd), src(nd), dst(nd);  // the intersection, in the saved box and the local tensor
    for (size_t d = 0; d < nd; ++d) {
      const int64_t lo = std::max(t.box_offset[d], b.offset[d]);
      size[d] = std::min(t.box_offset[d] + t.box_size[d], b.offset[d] + b.size[d]) - lo;
      src[d] = lo - b.offset[d];
      dst[d] = lo - t.box_offset[d];
    }
    bytes += uint64_t(volume(size)) * 4;
    f->second->read_box(b.key, src, size, t.data, t.local_shape, dst);
  }
  return bytes;
}

}  // namespace tpt
