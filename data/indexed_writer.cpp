#include "data/indexed_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "data/megatron_format.h"

namespace tpt {
namespace {

template <typename T>
void append_le(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}

template <typename T>
bool fits(int32_t v) {
  return static_cast<int64_t>(v) >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
         static_cast<int64_t>(v) <= static_cast<int64_t>(std::numeric_limits<T>::max());
}

// Flushes, fsyncs and closes f; throws InputError naming `name` on failure.
void close_synced(std::FILE* f, const std::string& name) {
  const bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) input_error(name + ": write failed: " + std::strerror(ok ? errno : err));
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, int dtype_code)
    : prefix_(prefix),
      bin_tmp_(prefix + ".bin.tmp-" + std::to_string(::getpid())),
      idx_tmp_(prefix + ".idx.tmp-" + std::to_string(::getpid())),
      dtype_(dtype_code),
      itemsize_(megatron::dtype_itemsize(dtype_code)) {
  TPT_CHECK(megatron::dtype_is_integer(dtype_code));
  bin_ = std::fopen(bin_tmp_.c_str(), "wb");
  if (bin_ == nullptr) input_error(prefix + ".bin: cannot create (" + bin_tmp_ + "): " + std::strerror(errno));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_ != nullptr) std::fclose(bin_);
  if (!finished_) {
    std::remove(bin_tmp_.c_str());
    std::remove(idx_tmp_.c_str());
  }
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  TPT_CHECK(!finished_ && tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()));
  buffer_.clear();
  buffer_.reserve(tokens.size() * itemsize_);
  for (int32_t t : tokens) {
    switch (dtype_) {
      case megatron::kU8: TPT_CHECK(fits<uint8_t>(t)); append_le<uint8_t>(buffer_, static_cast<uint8_t>(t)); break;
      case megatron::kI8: TPT_CHECK(fits<int8_t>(t)); append_le<int8_t>(buffer_, static_cast<int8_t>(t)); break;
      case megatron::kI16: TPT_CHECK(fits<int16_t>(t)); append_le<int16_t>(buffer_, static_cast<int16_t>(t)); break;
      case megatron::kU16: TPT_CHECK(fits<uint16_t>(t)); append_le<uint16_t>(buffer_, static_cast<uint16_t>(t)); break;
      case megatron::kI32: append_le<int32_t>(buffer_, t); break;
      case megatron::kI64: append_le<int64_t>(buffer_, t); break;
      default: TPT_CHECK(false);
    }
  }
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), bin_) != buffer_.size())
    input_error(prefix_ + ".bin: write failed (" + bin_tmp_ + "): " + std::strerror(errno));
  sizes_.push_back(static_cast<int32_t>(tokens.size()));
  pointers_.push_back(bytes_);
  bytes_ += static_cast<int64_t>(buffer_.size());
  num_tokens_ += static_cast<int64_t>(tokens.size());
}

void IndexedDatasetWriter::end_document() {
  TPT_CHECK(!finished_);
  doc_idx_.push_back(num_sequences());
}

void IndexedDatasetWriter::finish() {
  TPT_CHECK(!finished_);
  if (doc_idx_.back() != num_sequences()) end_document();
  std::FILE* bin = bin_;
  bin_ = nullptr;
  close_synced(bin, bin_tmp_);

  std::vector<uint8_t> idx;
  idx.insert(idx.end(), megatron::kIdxMagic, megatron::kIdxMagic + sizeof megatron::kIdxMagic);
  append_le<uint64_t>(idx, megatron::kIdxVersion);
  append_le<uint8_t>(idx, static_cast<uint8_t>(dtype_));
  append_le<uint64_t>(idx, sizes_.size());
  append_le<uint64_t>(idx, doc_idx_.size());
  for (int32_t s : sizes_) append_le(idx, s);
  for (int64_t p : pointers_) append_le(idx, p);
  for (int64_t d : doc_idx_) append_le(idx, d);
  std::FILE* f = std::fopen(idx_tmp_.c_str(), "wb");
  if (f == nullptr) input_error(prefix_ + ".idx: cannot create (" + idx_tmp_ + "): " + std::strerror(errno));
  if (std::fwrite(idx.data(), 1, idx.size(), f) != idx.size()) {
    const int err = errno;
    std::fclose(f);
    input_error(prefix_ + ".idx: write failed (" + idx_tmp_ + "): " + std::strerror(err));
  }
  close_synced(f, idx_tmp_);

  if (std::rename(bin_tmp_.c_str(), (prefix_ + ".bin").c_str()) != 0)
    input_error(prefix_ + ".bin: cannot rename " + bin_tmp_ + " into place: " + std::strerror(errno));
  if (std::rename(idx_tmp_.c_str(), (prefix_ + ".idx").c_str()) != 0)
    input_error(prefix_ + ".idx: cannot rename " + idx_tmp_ + " into place: " + std::strerror(errno));
  finished_ = true;
}

}  // namespace tpt
