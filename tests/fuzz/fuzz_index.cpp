// A Hugging Face checkpoint's model.safetensors.index.json (interop/hf/shards.h): the index parsed and
// checked against the shards it names (two small valid ones sit beside it, a.safetensors and
// b.safetensors, so that inputs reach the checks past the JSON: tensors named twice or in no shard,
// shard names with '..' or absolute, missing shards), then every named tensor's shape and rows read.
#include "fuzz_common.h"
#include "interop/hf/shards.h"

#include <vector>

namespace {

const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    const std::string d = tpt::fuzz::scratch() + "/hf";
    std::filesystem::create_directories(d);
    const std::vector<float> x(12, 0.5f);
    for (const char* shard : {"a", "b"}) {
      tpt::SafetensorsWriter w;
      w.add(std::string(shard) + ".weight", {3, 4}, x.data());
      w.add(std::string(shard) + ".bias", {4}, x.data());
      w.write(d + "/" + shard + ".safetensors");
    }
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  const std::string& dir = checkpoint_dir();
  tpt::fuzz::write_file(dir + "/model.safetensors.index.json", data, n);
  tpt::fuzz::expect_input_errors_only([&] {
    const tpt::HFShards shards(tpt::hf_paths(dir), "fuzz");
    std::vector<float> out(12);
    for (const std::string& name : shards.names()) {
      const tpt::SafetensorInfo& info = shards.shard_of(name).info(name);
      if (info.numel() > 12 || (info.shape.size() != 1 && info.shape.size() != 2)) continue;
      shards.rows(name, info.shape, 0, info.shape[0], out.data());
    }
  });
  return 0;
}
