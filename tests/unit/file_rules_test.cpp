// The rules for files that tptrain reads (core/file_rules.h): names a file gives stay inside its
// folder, and only regular files are read (a FIFO, /dev/zero, a directory are InputErrors at once).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "core/file_rules.h"
#include "core/mmap_file.h"

namespace tpt {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(FileRules, ConfinedPathRefusesEscapesByName) {
  auto confine = [](const std::string& entry) { return confined_path("/d", entry, "/d/list.json", "files[0]", "what"); };
  EXPECT_EQ(confine("a.bin"), "/d/a.bin");
  EXPECT_EQ(confine("sub/a.bin"), "/d/sub/a.bin");
  EXPECT_EQ(confine("./a.bin"), "/d/./a.bin");
  EXPECT_EQ(confine("a..b/..c"), "/d/a..b/..c");  // dots inside names are no '..' component
  EXPECT_EQ(confine("sub/.../a"), "/d/sub/.../a");
  for (const std::string bad : {"..", "../a", "sub/../../a", "sub/..", "a/../b", "sub//../a"})
    EXPECT_EQ(error_of([&] { confine(bad); }),
              "what: /d/list.json: files[0] '" + bad + "' has a '..' component: a file it names must lie inside /d")
        << bad;
  for (const std::string bad : {"/etc/passwd", "//a", "/d/a.bin"})
    EXPECT_EQ(error_of([&] { confine(bad); }),
              "what: /d/list.json: files[0] '" + bad + "' is an absolute path: a file it names must be relative to /d")
        << bad;
  EXPECT_NE(error_of([&] { confine(""); }).find("files[0] '' is empty"), std::string::npos);
}

TEST(FileRules, OnlyRegularFilesAreRead) {
  const std::string dir = (fs::temp_directory_path() / ("file_rules_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir + "/a.txt") << "hello";
  fs::create_symlink(dir + "/a.txt", dir + "/link.txt");
  EXPECT_EQ(read_regular_file(dir + "/a.txt", "w", 5), "hello");
  EXPECT_EQ(read_regular_file(dir + "/link.txt", "w", 5), "hello");  // a link to a regular file is one
  EXPECT_EQ(error_of([&] { read_regular_file(dir + "/a.txt", "w", 4); }), "w: " + dir + "/a.txt is larger than 4 bytes");
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  // a FIFO nobody writes to: refused at once (a blocking open would hang the test)
  EXPECT_EQ(error_of([&] { read_regular_file(dir + "/fifo", "w", 1 << 20); }), "w: " + dir + "/fifo: not a regular file (a FIFO)");
  EXPECT_EQ(error_of([&] { check_regular_file(dir + "/fifo", "w"); }), "w: " + dir + "/fifo: not a regular file (a FIFO)");
  EXPECT_EQ(error_of([&] { MappedFile m(dir + "/fifo"); }), dir + "/fifo: not a regular file (a FIFO)");
  EXPECT_EQ(error_of([&] { MappedFile m("/dev/zero"); }), "/dev/zero: not a regular file (a character device)");
  EXPECT_EQ(error_of([&] { MappedFile m(dir); }), dir + ": not a regular file (a directory)");
  EXPECT_EQ(error_of([&] { read_regular_file("/dev/zero", "w", 1 << 20); }),
            "w: /dev/zero: not a regular file (a character device)");
  EXPECT_EQ(error_of([&] { read_regular_file(dir, "w", 1 << 20); }), "w: " + dir + ": not a regular file (a directory)");
  EXPECT_NE(error_of([&] { check_regular_file(dir + "/none", "w"); }).find("w: cannot open " + dir + "/none: No such file"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tpt
