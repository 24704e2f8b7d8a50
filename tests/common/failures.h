// Failures collected from the rank threads of a thread-ranks test (gtest assertions are
// thread-safe, but keep the output readable: at most a few printed per run).
#pragma once
#include <gtest/gtest.h>

#include <mutex>
#include <string>

namespace tpt {

struct Failures {
  std::mutex m;
  int count = 0;
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    if (++count <= 8) ADD_FAILURE() << what;
  }
};

}  // namespace tpt
