// The YAML config loader (core/config.h): parse_config on arbitrary text, then config_to_yaml.
#include "core/config.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  tpt::fuzz::expect_input_errors_only([&] {
    const tpt::Config c = tpt::parse_config(std::string(reinterpret_cast<const char*>(data), n), "fuzz.yaml");
    (void)tpt::config_to_yaml(c);
  });
  return 0;
}
