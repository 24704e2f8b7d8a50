// A read-only memory-mapped file (docs/ARCHITECTURE.md "Data formats": datasets and checkpoints are mapped,
// never read whole). Opening errors are InputError naming the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tpt {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only; throws InputError "<path>: <reason>" if it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }  // nullptr for an empty file
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

bool file_exists(const std::string& path);  // a regular file (or a link to one) exists at path

}  // namespace tpt
