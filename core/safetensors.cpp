#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/sharded_tensor.h"

namespace tpt {
namespace {

// Bytes per element of every dtype the safetensors format defines; 0 = unknown.
size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},  {"BOOL", 1},
      {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

// Converts n elements of a float dtype starting at src (any alignment) to fp32.
void convert_to_fp32(const std::string& dtype, const uint8_t* src, int64_t n, float* out) {
  if (dtype == "F32") {
    std::memcpy(out, src, static_cast<size_t>(n) * 4);
  } else if (dtype == "BF16") {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = bf16_to_fp32(h);
    }
  } else if (dtype == "F16") {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = fp16_to_fp32(h);
    }
  } else if (dtype == "F64") {
    for (int64_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, src + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    TPT_CHECK(false && "convert_to_fp32: dtype checked by the caller");
  }
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// "[i, j]": the index of element `flat` of a row-major tensor of `shape`
std::string index_string(std::span<const int64_t> shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return shape_string(idx);
}

std::string format_g(float x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.7g", double(x));
  return buf;
}

}  // namespace

int64_t SafetensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : file_(path) {
  const size_t file_size = file_.size();
  auto fail = [&](const std::string& what) -> void { input_error(path + ": bad safetensors file: " + what); };
  if (file_size < 8) fail("only " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, file_.data(), 8);
  if (header_len > file_size - 8)
    fail("header length " + std::to_string(header_len) + " runs past the end of the file (" +
         std::to_string(file_size) + " bytes)");
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - data_start_;

  const char* hbegin = reinterpret_cast<const char*>(file_.data() + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(hbegin, hbegin + header_len);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail("__metadata__ value of '" + m.key() + "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { fail("tensor '" + name + "': " + what); };
    if (!v.is_object()) bad("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) bad("missing or non-string \"dtype\"");
    if (!v.contains("shape") || !v["shape"].is_array()) bad("missing or non-array \"shape\"");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      bad("\"data_offsets\" must be an array [begin, end]");
    SafetensorInfo info;
    info.name = name;
    info.dtype = v["dtype"].get<std::string>();
    const size_t esize = dtype_size(info.dtype);
    if (esize == 0) bad("unknown dtype '" + info.dtype + "'");
    uint64_t numel = 1;
    bool too_big = false, has_zero = false;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) bad("shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel)) too_big = true;
      has_zero = has_zero || dim == 0;
      info.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(dim, INT64_MAX)));
    }
    if (has_zero) numel = 0;
    uint64_t nbytes = 0;
    if ((too_big && !has_zero) || __builtin_mul_overflow(numel, esize, &nbytes) || nbytes > data_size)
      bad("shape " + v["shape"].dump() + " of dtype " + info.dtype + " needs more bytes than the file holds");
    for (const auto& o : v["data_offsets"])
      if (!o.is_number_unsigned()) bad("data_offsets must be non-negative integers");
    info.begin = v["data_offsets"][0].get<uint64_t>();
    info.end = v["data_offsets"][1].get<uint64_t>();
    if (info.begin > info.end)
      bad("data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) + ") are reversed");
    if (info.end > data_size)
      bad("data_offsets end " + std::to_string(info.end) + " is past the end of the data (" +
          std::to_string(data_size) + " bytes)");
    if (info.end - info.begin != nbytes)
      bad("data_offsets cover " + std::to_string(info.end - info.begin) + " bytes but dtype " + info.dtype +
          " and shape " + shape_string(info.shape) + " need " + std::to_string(nbytes));
    tensors_.emplace(name, std::move(info));
  }

  // No two tensors may share bytes.
  std::vector<const SafetensorInfo*> by_offset;
  for (const auto& [n, info] : tensors_)
    if (info.end > info.begin) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorInfo* a, const SafetensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      fail("tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name + "' overlap");
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

bool SafetensorsReader::contains(const std::string& name) const { return tensors_.count(name) != 0; }

const SafetensorInfo& SafetensorsReader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) input_error(path() + ": no tensor '" + name + "'");
  return it->second;
}

const uint8_t* SafetensorsReader::raw(const std::string& name) const {
  return file_.data() + data_start_ + info(name).begin;
}

void SafetensorsReader::read(const std::string& name, float* out) const {
  const SafetensorInfo& t = info(name);
  std::vector<int64_t> offsets(t.shape.size(), 0);
  read_box(name, offsets, t.shape, out);
}

void SafetensorsReader::read_box(const std::string& name, std::span<const int64_t> offsets,
                                 std::span<const int64_t> sizes, float* out, std::span<const int64_t> out_shape,
                                 std::span<const int64_t> out_at) const {
  const SafetensorInfo& t = info(name);
  auto bad = [&](const std::string& what) { input_error(path() + ": tensor '" + name + "': " + what); };
  if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16" && t.dtype != "F64")
    bad("dtype " + t.dtype + " cannot be read as float32 (need F32, F16, BF16 or F64)");
  const size_t ndim = t.shape.size();
  if (offsets.size() != ndim || sizes.size() != ndim)
    bad("box has " + std::to_string(offsets.size()) + "/" + std::to_string(sizes.size()) +
        " offsets/sizes but the tensor has " + std::to_string(ndim) + " dimensions");
  for (size_t d = 0; d < ndim; ++d)
    if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] > t.shape[d] || sizes[d] > t.shape[d] - offsets[d])
      bad("box dimension " + std::to_string(d) + " [" + std::to_string(offsets[d]) + ", +" +
          std::to_string(sizes[d]) + ") is outside shape " + shape_string(t.shape));
  if (out_shape.empty()) out_shape = sizes;
  TPT_CHECK(out_shape.size() == ndim && (out_at.empty() || out_at.size() == ndim));
  const size_t esize = dtype_size(t.dtype);
  const uint8_t* base = file_.data() + data_start_ + t.begin;
  // every value that enters (HF import, init_from, checkpoint load) is finite: a NaN or inf would
  // train silently on `lm loss NAN` and be saved again
  for_each_box_row(sizes, t.shape, offsets, out_shape, out_at, [&](int64_t src, int64_t dst, int64_t n) {
    convert_to_fp32(t.dtype, base + static_cast<size_t>(src) * esize, n, out + dst);
    for (int64_t k = 0; k < n; ++k)
      if (!std::isfinite(out[dst + k]))
        bad("holds " + std::string(std::isnan(out[dst + k]) ? "NaN" : out[dst + k] > 0 ? "+inf" : "-inf") +
            " at index " + index_string(t.shape, src + k) + "; a model is loaded from finite values only");
  });
}

const char* safetensors_dtype_name(DType t) {
  return t == DType::BF16 ? "BF16" : t == DType::F16 ? "F16" : "F32";
}

void SafetensorsWriter::add(const std::string& name, std::vector<int64_t> shape, const float* data, DType stored) {
  TPT_CHECK(name != "__metadata__" && !name.empty());
  for (const Entry& e : entries_) TPT_CHECK(e.name != name);
  int64_t numel = 1;
  for (int64_t d : shape) {
    TPT_CHECK(d >= 0);
    numel *= d;
  }
  TPT_CHECK(data != nullptr || numel == 0);
  // every value that leaves in a narrower dtype is representable: a finite value past its range
  // would be written as inf (and read back as NaN after one step)
  if (stored != DType::F32) {
    float max_abs = 0.0f;
    bool overflows = false;
    for (int64_t i = 0; i < numel; ++i) {
      const float x = data[i];
      if (!std::isfinite(x)) continue;
      max_abs = std::max(max_abs, std::fabs(x));
      overflows = overflows || std::isinf(round_to(x, stored));
    }
    if (overflows)
      input_error("tensor '" + name + "': max |w| " + format_g(max_abs) + " overflows " + safetensors_dtype_name(stored) +
                  " (largest " + format_g(stored == DType::F16 ? 65504.0f : 3.3895314e38f) + "); " +
                  (stored == DType::F16 && max_abs < 3.3895314e38f ? "BF16 or F32 hold" : "F32 holds") + " it");
  }
  entries_.push_back({name, std::move(shape), data, stored, uint64_t(numel) * uint64_t(dtype_bytes(stored))});
}

uint64_t SafetensorsWriter::data_bytes() const {
  uint64_t n = 0;
  for (const Entry& e : entries_) n += e.bytes;
  return n;
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

void SafetensorsWriter::write(const std::string& path) const {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", safetensors_dtype_name(e.stored)}, {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const uint64_t header_len = text.size();

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) input_error(path + ": cannot create: " + std::strerror(errno));
  auto write_all = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd, c, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        int err = errno;
        ::close(fd);
        input_error(path + ": write failed: " + std::strerror(err));
      }
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  write_all(&header_len, 8);
  write_all(text.data(), text.size());
  std::vector<uint16_t> half;  // a 16-bit tensor converted in blocks
  for (const Entry& e : entries_) {
    if (e.stored == DType::F32) {
      write_all(e.data, e.bytes);
      continue;
    }
    const uint64_t n = e.bytes / 2, block = uint64_t{1} << 20;
    half.resize(size_t(std::min(n, block)));
    for (uint64_t b = 0; b < n; b += block) {
      const uint64_t m = std::min(block, n - b);
      const float* src = e.data + b;
      if (e.stored == DType::BF16)
        for (uint64_t i = 0; i < m; ++i) half[i] = fp32_to_bf16(src[i]);
      else
        for (uint64_t i = 0; i < m; ++i) half[i] = fp32_to_fp16(src[i]);
      write_all(half.data(), size_t(m) * 2);  // little-endian hosts only (as the reader)
    }
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    input_error(path + ": fsync failed: " + std::strerror(err));
  }
  if (::close(fd) != 0) input_error(path + ": close failed: " + std::strerror(errno));
}

}  // namespace tpt
