// Auxiliary outputs: whole records, a write error stops the output with one warning (train/aux_output.h).
#include "train/aux_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace tpt {

AuxOutput::AuxOutput(std::string path, std::string field) : path_(std::move(path)), field_(std::move(field)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) input_error(field_ + ": cannot write '" + path_ + "': " + std::strerror(errno));
}

AuxOutput::~AuxOutput() {
  if (fd_ >= 0) ::close(fd_);
}

bool AuxOutput::append(const std::string& record) {
  if (fd_ < 0) return false;
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      stop(n < 0 ? errno : ENOSPC);
      return false;
    }
    done += size_t(n);
  }
  size_ += record.size();
  return true;
}

// The warning, the partial record cut off (a device such as /dev/full cannot be truncated: nothing
// of the record reached it), the output closed.
void AuxOutput::stop(int err) {
  if (::ftruncate(fd_, off_t(size_)) != 0 && errno != EINVAL) {
    spdlog::warn("{}: cannot cut '{}' back to its last whole record: {}", field_, path_, std::strerror(errno));
  }
  ::close(fd_);
  fd_ = -1;
  spdlog::warn("{}: writing '{}' failed: {}; this output stops here (training and checkpoints go on)", field_, path_,
               std::strerror(err));
}

bool write_aux_file(const std::string& path, const std::string& text, const std::string& field) {
  try {
    AuxOutput out(path, field);
    if (out.append(text)) return true;
  } catch (const InputError& e) {
    spdlog::warn("{}; it is not written (training and checkpoints go on)", e.what());
    return false;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) std::remove(path.c_str());  // not half a file
  return false;
}

}  // namespace tpt
