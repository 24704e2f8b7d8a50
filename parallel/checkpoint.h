// Sharded checkpoints (docs/ARCHITECTURE.md "Checkpoint format"): the on-disk format, the collective save
// (iter_N.partial -> iter_N -> latest file) and the collective find / verify / load that reads any
// saved layout into any other. Knows nothing of the model: a tensor is a name, its global shape and
// the box of it a rank holds.
//
//   <save>/latest_checkpointed_iteration.txt          "200\n", replaced atomically, written last
//   <save>/iter_0000200/meta.json                     see CheckpointWriter::commit
//   <save>/iter_0000200/<file>.safetensors            fp32 tensors (the boxes), global names
//
// Every shard file's CRC-32C is in meta.json together with the tensor index (for every file, every
// tensor's name, global shape, box offset and box size). A reader verifies the checksum of each
// file it reads; the ranks agree on one checkpoint, falling back to older ones past a bad file.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/sharded_tensor.h"
#include "parallel/comm.h"

namespace tpt {

class SafetensorsReader;

// 2: a tensor index entry may name its safetensors key ("key": a rank saving several boxes of one
// tensor, e.g. the distributed optimizer's flat block, stores them as name#1, name#2, ...).
inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr const char* kCheckpointFormat = "tptrain-checkpoint";
inline constexpr const char* kLatestFile = "latest_checkpointed_iteration.txt";

// A rank's shard of a global tensor (core/sharded_tensor.h) and the host memory holding its local
// tensor, prod(local_shape) floats.
struct CkptTensor : TensorShard {
  float* data = nullptr;
  std::string key = {};  // the key in its safetensors file when not `name` (several boxes of one tensor)
  const std::string& file_key() const { return key.empty() ? name : key; }
};

// The parts of a rank's tensor t held in the local flat ranges [r.first, r.second) (row-major in
// local_shape), each as a box of the global tensor pointing into t.data; padding outside the box
// is left out. More than one part: keys name#1, name#2, ...
std::vector<CkptTensor> flat_range_parts(const CkptTensor& t, const std::vector<std::pair<int64_t, int64_t>>& ranges);

// A tensor of the whole model, for the shape check on load.
struct GlobalTensor {
  std::string name;
  std::vector<int64_t> shape;
};

std::string checkpoint_dir_name(int64_t iteration);                       // iter_0000200
std::string model_shard_name(int tp_rank, int pp_rank);                   // model_tp00_pp000.safetensors
std::string model_shard_name(int tp_rank, int pp_rank, int dp_rank);      // model_tp00_pp000_dp000.safetensors
std::string optim_shard_name(int tp_rank, int pp_rank, int dp_rank);      // optim_tp00_pp000_dp000.safetensors
std::string shape_string(const std::vector<int64_t>& shape);              // [3, 64, 64]
// meta.json's "grid" as "TP 2 x PP 2 x DP 2", with CP and EP where they are > 1 ("TP 1 x CP 2 x PP 1 x
// DP 1", "TP 2 x PP 2 x DP 2, EP 4"); "an unrecorded grid" if meta.json has none.
std::string describe_saved_grid(const nlohmann::json& grid);

// CRC-32C (Castagnoli), the checksum named "crc32c" in meta.json; crc32c(0, "123456789", 9) = 0xE3069283.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);

// Creates `save_dir` if needed and checks that a file can be written in it; InputError naming the
// path otherwise. Called at start-up so that a bad checkpoint.save fails before any training.
void check_save_dir(const std::string& save_dir);

// Saves one checkpoint, collectively over `world`:
//   CheckpointWriter w(world, save, iteration);     rank 0 creates iter_N.partial/
//   w.write_file(name, tensors);                    any rank, any number of files (owners only)
//   w.commit(meta, keep_last);                      fsync, meet, meta.json, rename, latest file
// A failure throws InputError naming the path on the rank that saw it (main aborts the job); the
// previous checkpoint and the latest file stay untouched until the new checkpoint is complete.
class CheckpointWriter {
 public:
  CheckpointWriter(Comm& world, std::string save_dir, int64_t iteration);
  // A save that failed before its commit completed (an exception on this rank: a full disk, say)
  // removes iter_N.partial, so it does not hold the disk space. Never throws.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // Writes <partial>/<file_name> (fp32 safetensors, the boxes of `tensors`; empty boxes skipped),
  // fsyncs it and leaves a sidecar with its size, CRC-32C and tensor index for rank 0.
  void write_file(const std::string& file_name, const std::vector<CkptTensor>& tensors);
  // Collective. Rank 0 merges the sidecars into meta.json (`meta` plus format, format_version,
  // iteration, checksum, files), renames iter_N.partial to iter_N, replaces the latest file and
  // deletes all but the newest keep_last (> 0) complete checkpoints. Returns the bytes of all files.
  uint64_t commit(nlohmann::json meta, int keep_last);
  const std::string& path() const { return final_dir_; }
  // Makes the names of the files written so far durable (fsync of iter_N.partial); commit does it
  // too, here for a background writer to do it off the main thread.
  void sync_files();
  int64_t iteration() const { return iteration_; }
  int rank() const { return world_.rank(); }
  uint64_t bytes_written() const { return bytes_written_; }  // this rank's shard files so far
  // Makes write_file stop with an InputError at its next write once *flag is true (another thread
  // abandoning a background save, parallel/checkpoint_async.h).
  void set_cancel_flag(const std::atomic<bool>* flag) { control_.cancel = flag; }

  // What a file write checks on the way (also the test hooks' state, parallel/checkpoint.cpp).
  struct WriteControl {
    const std::atomic<bool>* cancel = nullptr;
    int64_t kill_after_bytes = -1;  // TPTRAIN_TEST_KILL=[R/]bytes:B@N: SIGKILL after B bytes of shards
  };

 private:
  Comm& world_;
  std::string save_dir_, partial_dir_, final_dir_;
  int64_t iteration_;
  int files_written_ = 0, files_synced_ = 0;
  uint64_t bytes_written_ = 0;
  bool committed_ = false;
  WriteControl control_;
};

// What a rank asks of a checkpoint directory.
struct LoadRequest {
  // A save directory (its latest complete checkpoint, older ones as fallbacks) or one iter_N
  // directory (that checkpoint only).
  std::string dir;
  std::vector<CkptTensor> wanted;   // this rank's tensors (their data pointers are not used by open)
  std::vector<GlobalTensor> model;  // every tensor of the whole model; empty: no shape check
  // Tensors of `model` the checkpoint may lack, and tensors of the checkpoint `model` may lack (state
  // that a run keeps only with some settings: FP8's delayed scaling); null: none. Present in both,
  // their shapes must agree.
  std::function<bool(const std::string& tensor)> optional;
  bool verify_all_files = false;    // verify every file, not just those `wanted` intersects
  // Readers of whole tensors by name (export): also verify and open every file holding a tensor
  // whose name this accepts (null: none), as if wanted.
  std::function<bool(const std::string& tensor)> needs_tensor;
  // Verify the files nothing above needs too (an export's or generate's optimizer shards): a problem
  // there is a WARNING naming the file, not a reason to fall back to an older checkpoint.
  bool warn_other_files = false;
};

// A checkpoint every rank has verified the files it needs of.
class CheckpointReader {
 public:
  // Collective over `world`. Rank 0 picks the newest candidate (latest file, else the newest
  // complete iter_*), checks its meta.json and that its files exist with their sizes; every rank
  // verifies the checksums of the files its `wanted` boxes intersect; the ranks agree, and a bad
  // candidate is skipped with a WARNING naming the file and the problem. Returns null (on every
  // rank) when `dir` holds no checkpoint at all. InputError when checkpoints exist but none is
  // usable, or when one does not match `model` (naming the tensor and both global shapes).
  static std::unique_ptr<CheckpointReader> open(Comm& world, const LoadRequest& request);
  ~CheckpointReader();

  // Fills t.data: zeros, then the intersection of t's box with every saved box of t.name.
  void read(const CkptTensor& t);
  // read() of every tensor (their data disjoint) on `threads` threads; the first error is rethrown.
  void read_all(const std::vector<CkptTensor>& tensors, int threads);

  const nlohmann::json& meta() const { return meta_; }
  int64_t iteration() const { return iteration_; }
  const std::string& path() const { return path_; }
  // Global shape of every tensor in the checkpoint.
  const std::map<std::string, std::vector<int64_t>>& tensors() const { return shapes_; }
  uint64_t bytes_read() const { return bytes_read_; }  // tensor data read so far (checksums not counted)
  uint64_t bytes_verified() const { return bytes_verified_; }

  struct SavedBox {
    std::string file, key;
    std::vector<int64_t> offset, size;
  };

 private:
  CheckpointReader() = default;
  uint64_t read_one(const CkptTensor& t) const;  // read(); returns the bytes read
  nlohmann::json meta_;
  int64_t iteration_ = 0;
  std::string path_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::string, std::vector<SavedBox>> boxes_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files_;
  uint64_t bytes_read_ = 0, bytes_verified_ = 0;
};

// Internal: shared by checkpoint.cpp and checkpoint_load.cpp.
namespace checkpoint_detail {
struct DirScan {
  std::vector<int64_t> complete;     // iterations of the iter_N directories, ascending
  std::vector<std::string> partial;  // names ending in .partial (incomplete, or being deleted)
};
DirScan scan_save_dir(const std::string& dir);
std::string read_text(const std::string& path);  // InputError naming the path if unreadable
// TPTRAIN_TEST_KILL's SIGKILL at `point` of the save of `iteration` on world rank `rank` (checkpoint.cpp)
void test_kill_point(const char* point, int64_t iteration, int rank);
}  // namespace checkpoint_detail

}  // namespace tpt
