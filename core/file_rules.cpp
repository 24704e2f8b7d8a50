// The rules for files that tptrain reads (core/file_rules.h).
#include "core/file_rules.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace tpt {
namespace {

// The open file descriptor of a regular file; O_NONBLOCK so that opening a FIFO returns at once
// (it is then refused by fstat).
int open_regular(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) input_error(what + ": cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    input_error(what + ": cannot open " + path + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    input_error(what + ": " + path + ": not a regular file (" + file_kind(st.st_mode) + ")");
  }
  return fd;
}

}  // namespace

const char* file_kind(unsigned mode) {
  const auto m = mode_t(mode);
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a plain file";
}

std::string confined_path(const std::string& dir, const std::string& entry, const std::string& named_by,
                          const std::string& field, const std::string& what) {
  const std::string head = what + ": " + named_by + ": " + field + " '" + entry + "' ";
  if (entry.empty()) input_error(head + "is empty (a file name relative to " + dir + ")");
  const std::filesystem::path p(entry);
  if (p.is_absolute())
    input_error(head + "is an absolute path: a file it names must be relative to " + dir);
  for (const auto& part : p)
    if (part == "..") input_error(head + "has a '..' component: a file it names must lie inside " + dir);
  return dir + "/" + entry;
}

void check_regular_file(const std::string& path, const std::string& what) { ::close(open_regular(path, what)); }

std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  const int fd = open_regular(path, what);
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      input_error(what + ": cannot read " + path + ": " + std::strerror(err));
    }
    if (n == 0) break;
    if (text.size() + uint64_t(n) > max_bytes) {
      ::close(fd);
      input_error(what + ": " + path + " is larger than " + std::to_string(max_bytes) + " bytes");
    }
    text.append(buf, size_t(n));
  }
  ::close(fd);
  return text;
}

}  // namespace tpt
