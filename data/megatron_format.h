// Constants of the on-disk token formats (docs/ARCHITECTURE.md "Data formats"), shared by the
// readers (data/corpus.cpp) and the writer (data/indexed_writer.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tpt::megatron {

// .idx header: magic, <Q version, <B dtype code, <Q sequence count, <Q document count.
inline constexpr char kIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIdxVersion = 1;
inline constexpr size_t kIdxHeaderBytes = 9 + 8 + 1 + 8 + 8;  // = 34

// Megatron's dtype codes.
enum DtypeCode : int {
  kU8 = 1, kI8 = 2, kI16 = 3, kI32 = 4, kI64 = 5, kF64 = 6, kF32 = 7, kU16 = 8,
};

// Bytes per element of a dtype code; 0 for an unknown code.
inline size_t dtype_itemsize(int code) {
  switch (code) {
    case kU8: case kI8: return 1;
    case kI16: case kU16: return 2;
    case kI32: case kF32: return 4;
    case kI64: case kF64: return 8;
    default: return 0;
  }
}

inline bool dtype_is_integer(int code) { return dtype_itemsize(code) != 0 && code != kF32 && code != kF64; }

inline std::string dtype_name(int code) {
  switch (code) {
    case kU8: return "uint8";
    case kI8: return "int8";
    case kI16: return "int16";
    case kI32: return "int32";
    case kI64: return "int64";
    case kF64: return "float64";
    case kF32: return "float32";
    case kU16: return "uint16";
    default: return "unknown(" + std::to_string(code) + ")";
  }
}

}  // namespace tpt::megatron

namespace tpt::llmc {

// llm.c token shard: 256 x int32 header ([0] magic, [1] version, [2] token count), then the tokens:
// uint16 for GPT-2 (magic 20240520, version 1), uint32 for Llama 3 (magic 20240801, version 7).
inline constexpr int32_t kMagic = 20240520;
inline constexpr int32_t kVersion = 1;
inline constexpr int32_t kMagicLlama3 = 20240801;
inline constexpr int32_t kVersionLlama3 = 7;
inline constexpr size_t kHeaderInts = 256;
inline constexpr size_t kHeaderBytes = kHeaderInts * 4;

}  // namespace tpt::llmc
