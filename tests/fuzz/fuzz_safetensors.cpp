// The safetensors header and data (core/safetensors.h): open, then read every (small) tensor.
#include "core/safetensors.h"
#include "fuzz_common.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  const std::string path = tpt::fuzz::scratch() + "/x.safetensors";
  tpt::fuzz::write_file(path, data, n);
  tpt::fuzz::expect_input_errors_only([&] {
    tpt::SafetensorsReader r(path);
    for (const std::string& name : r.names()) {
      const int64_t numel = r.info(name).numel();
      if (numel > (int64_t(1) << 20)) continue;
      std::vector<float> out(static_cast<size_t>(numel));
      r.read(name, out.data());
    }
  });
  return 0;
}
