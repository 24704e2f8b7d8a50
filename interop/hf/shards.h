// The files of a Hugging Face checkpoint, for any model family (interop/hf/llama.h reads Llama's
// through it): what a path names (a directory, its model.safetensors.index.json, its config.json, one
// .safetensors file) and the tensors of its shards. The index is checked as it is read: a tensor
// named twice, a missing shard, a tensor in two shards or in a shard the index does not name are
// InputErrors naming the files, and so is a shard name that is absolute or has a '..' component
// (core/file_rules.h: confined_path). Every shard is memory-mapped (its header parsed); reads touch only
// the rows asked for.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"

namespace tpt {

// What a checkpoint path names: the directory, and the config.json (the named one, else the
// directory's, else empty), index or safetensors file named directly (empty when the path is the
// directory).
struct HFPaths {
  std::string dir, config, index, file;  // file: one safetensors file named directly
};
HFPaths hf_paths(const std::string& path);

// A JSON file parsed (cb: nlohmann's parser callback); a regular file of at most 1 GiB
// (core/file_rules.h). InputError "<what>: cannot open PATH", "<what>: PATH: not a regular file" or
// "<what>: PATH is not valid JSON: ..."; an InputError the callback throws passes through.
nlohmann::json read_json_file(const std::string& path, const std::string& what,
                              const nlohmann::json::parser_callback_t& cb = nullptr);

// The tensors of an HF checkpoint: one safetensors file, or the shards an index names (the path's
// index, else the directory's model.safetensors.index.json, else its model.safetensors). `what`
// starts every message (e.g. "model.init_from").
class HFShards {
 public:
  HFShards(const HFPaths& p, const std::string& what);

  const std::string& where() const { return where_; }  // the index, or the one file
  size_t num_shards() const { return shards_.size(); }
  bool contains(const std::string& name) const { return owner_.count(name) != 0; }
  std::vector<std::string> names() const;
  const SafetensorsReader& shard_of(const std::string& name) const { return *shards_[owner_.at(name)]; }
  std::set<std::string> dtypes() const;  // of every tensor ("F32", "BF16", ...)

  // Checks that `name` exists with `shape` (config.json's); returns its file.
  const SafetensorsReader& check(const std::string& name, const std::vector<int64_t>& shape) const;

  // rows [r0, r0 + n) of a 1-D or 2-D tensor (checked against `shape`) into out, row-major
  void rows(const std::string& name, const std::vector<int64_t>& shape, int64_t r0, int64_t n, float* out) const;

 private:
  void open_index(const std::string& index, const std::string& dir);

  std::string what_, where_;
  std::vector<std::unique_ptr<SafetensorsReader>> shards_;
  std::map<std::string, size_t> owner_;  // tensor -> its shard
  std::set<std::string> seen_;
};

}  // namespace tpt
