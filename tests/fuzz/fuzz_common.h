// libFuzzer targets of the parsers that read user input (issue 17): each writes the input where the
// parser reads it and calls the same code tptrain runs. An InputError is the expected answer to
// bad input; anything else (a crash, a sanitizer report, another exception, a hang, a huge
// allocation) is a finding. Built with -DTPTRAIN_FUZZ=ON (clang); run by scripts/fuzz.sh.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace tpt::fuzz {

// A scratch directory of this process (created once, reused by every input).
inline const std::string& scratch() {
  static const std::string dir = [] {
    std::string d = std::filesystem::temp_directory_path().string() + "/tptrain_fuzz_" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write_file(const std::string& path, const uint8_t* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), std::streamsize(n));
}

// Runs f; InputError is fine, everything else propagates (libFuzzer reports it).
template <class F>
void expect_input_errors_only(F&& f) {
  try {
    f();
  } catch (const InputError&) {
  }
}

}  // namespace tpt::fuzz
