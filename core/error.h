// Errors that cross a rank's code: main() turns them into the contract's exit codes.
#pragma once
#include <stdexcept>
#include <string>

namespace tpt {

// Bad input from the user (config, data, checkpoint, arguments): exit status 2.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A bug or an environment failure inside tptrain: exit status 1.
struct InternalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void input_error(const std::string& msg) { throw InputError(msg); }
[[noreturn]] inline void internal_error(const std::string& msg) { throw InternalError(msg); }

}  // namespace tpt

// Checks an internal invariant (never user input): throws InternalError with the location.
#define TPT_CHECK(cond)                                                                     \
  do {                                                                                      \
    if (!(cond))                                                                            \
      ::tpt::internal_error(std::string("internal check failed: ") + #cond + " at " + __FILE__ + \
                            ":" + std::to_string(__LINE__));                                \
  } while (0)
