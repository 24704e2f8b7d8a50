// The files of a Hugging Face checkpoint (interop/hf/shards.h).
#include "interop/hf/shards.h"

#include <filesystem>

#include "core/error.h"
#include "core/file_rules.h"
#include "parallel/checkpoint.h"  // shape_string

namespace tpt {
namespace {

namespace fs = std::filesystem;

bool is_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

}  // namespace

HFPaths hf_paths(const std::string& path) {
  HFPaths p;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    p.dir = path;
  } else {
    const fs::path parent = fs::path(path).parent_path();
    p.dir = parent.empty() ? std::string(".") : parent.string();
    const std::string base = fs::path(path).filename().string();
    if (base.ends_with(".index.json")) p.index = path;
    else if (base == "config.json") p.config = path;
    else p.file = path;
  }
  if (p.config.empty() && is_file(p.dir + "/config.json")) p.config = p.dir + "/config.json";
  return p;
}

nlohmann::json read_json_file(const std::string& path, const std::string& what,
                              const nlohmann::json::parser_callback_t& cb) {
  // a regular file of at most 1 GiB (a tokenizer.json is tens of MiB): not a FIFO, not /dev/zero
  const std::string text = read_regular_file(path, what, uint64_t(1) << 30);
  try {
    return nlohmann::json::parse(text, cb);
  } catch (const InputError&) {
    throw;
  } catch (const nlohmann::json::exception& e) {
    input_error(what + ": " + path + " is not valid JSON: " + e.what());
  }
}

HFShards::HFShards(const HFPaths& p, const std::string& what) : what_(what) {
  std::string index = p.index;
  std::string single = p.file;
  if (index.empty() && single.empty()) {
    if (is_file(p.dir + "/model.safetensors.index.json")) index = p.dir + "/model.safetensors.index.json";
    else if (is_file(p.dir + "/model.safetensors")) single = p.dir + "/model.safetensors";
    else
      input_error(what + ": " + p.dir + " holds neither model.safetensors nor model.safetensors.index.json");
  }
  if (!index.empty()) open_index(index, p.dir);
  else {
    where_ = single;
    shards_.push_back(std::make_unique<SafetensorsReader>(single));
    for (const std::string& n : shards_.back()->names()) owner_[n] = 0;
  }
}

std::vector<std::string> HFShards::names() const {
  std::vector<std::string> out;
  for (const auto& [n, s] : owner_) out.push_back(n);
  return out;
}

std::set<std::string> HFShards::dtypes() const {
  std::set<std::string> out;
  for (const auto& [n, s] : owner_) out.insert(shards_[s]->info(n).dtype);
  return out;
}

const SafetensorsReader& HFShards::check(const std::string& name, const std::vector<int64_t>& shape) const {
  auto it = owner_.find(name);
  if (it == owner_.end())
    input_error(what_ + ": " + where_ + ": tensor '" + name + "' is missing (config.json implies shape " +
                shape_string(shape) + ")");
  const SafetensorsReader& st = *shards_[it->second];
  if (st.info(name).shape != shape)
    input_error(what_ + ": " + st.path() + ": tensor '" + name + "' has shape " + shape_string(st.info(name).shape) +
                ", but config.json implies " + shape_string(shape));
  return st;
}

void HFShards::rows(const std::string& name, const std::vector<int64_t>& shape, int64_t r0, int64_t n,
                    float* out) const {
  const SafetensorsReader& st = check(name, shape);
  if (n == 0) return;
  if (shape.size() == 1) st.read_box(name, std::vector<int64_t>{r0}, std::vector<int64_t>{n}, out);
  else st.read_box(name, std::vector<int64_t>{r0, 0}, std::vector<int64_t>{n, shape[1]}, out);
}

void HFShards::open_index(const std::string& index, const std::string& dir) {
  where_ = index;
  // A tensor named twice in weight_map: JSON parsers keep one silently, so the keys are seen as
  // they are parsed (depth 1: the top-level keys, depth 2: the keys inside them).
  std::string top;
  std::string twice;
  const nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t ev,
                                                   nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key) {
      const std::string k = parsed.get<std::string>();
      if (depth == 1) {
        top = k;
        seen_.clear();
      } else if (depth == 2 && top == "weight_map" && !seen_.insert(k).second && twice.empty()) {
        twice = k;
      }
    }
    return true;
  };
  const nlohmann::json j = read_json_file(index, what_, cb);
  if (!twice.empty()) input_error(what_ + ": " + index + ": weight_map names tensor '" + twice + "' twice");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    input_error(what_ + ": " + index + ": no \"weight_map\" object (a Hugging Face model.safetensors.index.json)");
  std::map<std::string, size_t> shard_ids;
  std::vector<std::string> shard_files;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      input_error(what_ + ": " + index + ": weight_map[\"" + it.key() + "\"] is " + it.value().dump() +
                  ", not a file name");
    const std::string file = it.value().get<std::string>();
    auto [s, fresh] = shard_ids.emplace(file, shard_files.size());
    if (fresh) {
      // inside the checkpoint's folder by name (a symlink there, as the HF cache makes, may point out)
      const std::string path = confined_path(dir, file, index, "weight_map[\"" + it.key() + "\"] names shard", what_);
      std::error_code ec;
      if (!fs::exists(path, ec))
        input_error(what_ + ": " + index + " names shard '" + file + "' (tensor '" + it.key() +
                    "'), which does not exist: " + path);
      check_regular_file(path, what_ + ": " + index + " names shard '" + file + "'");
      shard_files.push_back(path);
    }
    owner_[it.key()] = s->second;
  }
  if (shard_files.empty()) input_error(what_ + ": " + index + ": weight_map is empty");
  for (const std::string& f : shard_files) shards_.push_back(std::make_unique<SafetensorsReader>(f));
  // every tensor of the index in its shard; no tensor in two shards or outside the index
  for (const auto& [name, s] : owner_)
    if (!shards_[s]->contains(name))
      input_error(what_ + ": " + index + " maps tensor '" + name + "' to " + shard_files[s] +
                  ", which does not hold it");
  for (size_t s = 0; s < shards_.size(); ++s)
    for (const std::string& name : shards_[s]->names()) {
      auto it = owner_.find(name);
      if (it == owner_.end())
        input_error(what_ + ": " + shard_files[s] + " holds tensor '" + name + "', which " + index +
                    " does not name");
      if (it->second != s)
        input_error(what_ + ": tensor '" + name + "' is in two shards: " + shard_files[s] + " and " +
                    shard_files[it->second] + " (the index names the latter)");
    }
}

}  // namespace tpt
