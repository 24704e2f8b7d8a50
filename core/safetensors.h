// safetensors files (https://huggingface.co/docs/safetensors): HF GPT-2 weights for init_from and
// export, and checkpoint shards (docs/ARCHITECTURE.md "Checkpoint format").
// Layout: <u64 little-endian N> <N bytes of JSON header> <data>. The header maps each tensor name
// to {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the data section) and
// may hold "__metadata__": {string: string}. Tensors are row-major.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mmap_file.h"

namespace tpt {

struct SafetensorInfo {
  std::string name;
  std::string dtype;           // "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL", ...
  std::vector<int64_t> shape;  // empty for a scalar
  uint64_t begin = 0, end = 0; // byte range inside the data section
  int64_t numel() const;
};

// Reads a memory-mapped safetensors file. The constructor validates the whole header (JSON,
// dtypes, shapes, offsets against the file length, overlaps) and throws InputError naming the
// file (and the tensor) on any inconsistency.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);

  const std::string& path() const { return file_.path(); }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  const SafetensorInfo& info(const std::string& name) const;  // InputError if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Whole tensor converted to fp32 (from F32, F16, BF16 or F64) into out[numel]. Both reads are the
  // one path every tensor enters by (HF import, init_from, checkpoint load): a value that is not
  // finite once converted is an InputError "<path>: tensor '<name>': holds NaN at index [i, j]; ...".
  void read(const std::string& name, float* out) const;
  // A box of the tensor: dimension d covers [offsets[d], offsets[d] + sizes[d]). out receives the
  // box row-major (prod(sizes) floats), or with out_shape it goes to out_at inside a row-major
  // tensor of out_shape at out. InputError if the box is not inside the tensor.
  void read_box(const std::string& name, std::span<const int64_t> offsets, std::span<const int64_t> sizes,
                float* out, std::span<const int64_t> out_shape = {}, std::span<const int64_t> out_at = {}) const;
  // The raw bytes of a tensor, as stored (possibly unaligned).
  const uint8_t* raw(const std::string& name) const;

 private:
  MappedFile file_;
  uint64_t data_start_ = 0;
  std::map<std::string, SafetensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// "F32", "BF16", "F16": the safetensors dtype name of a DType.
const char* safetensors_dtype_name(DType t);

// Collects fp32 tensors and string metadata, then writes one safetensors file (header padded with
// spaces to a multiple of 8 bytes, tensors in the order added, file fsynced). Each tensor is stored
// as F32, or as BF16 / F16 converted while writing (round to nearest even, core/dtype.h). The data
// pointers passed to add() are not copied: they must stay valid until write() returns.
class SafetensorsWriter {
 public:
  // InputError "tensor '<name>': max |w| X overflows F16 (largest 65504); BF16 or F32 hold it" when
  // a finite value would round to inf in `stored` (every tensor that leaves in a narrower dtype).
  void add(const std::string& name, std::vector<int64_t> shape, const float* data, DType stored = DType::F32);
  // Bytes of the data section so far (what the tensors added take as stored).
  uint64_t data_bytes() const;
  void set_metadata(const std::string& key, const std::string& value);
  // Writes (truncating) `path` and fsyncs it; throws InputError naming the file if it cannot.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    const float* data;
    DType stored;
    uint64_t bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tpt
