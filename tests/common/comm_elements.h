// Elements of any DType that stand for small numbers, for the communicator tests (unit, MPI, NCCL):
// element id (0..255) has byte k = id + 37 k, so a misplaced element, a wrong element size or a
// torn element shows in its bytes. Collectives that move values (gather, broadcast, all-to-all,
// messages) must deliver them byte for byte.
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace tpt::test {

inline const DType kCommTypes[] = {DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::I64, DType::U8};

inline const char* comm_type_name(DType t) {
  const char* names[] = {"f32", "bf16", "f16", "f64", "i32", "i64", "u8"};
  return names[int(t)];
}

inline std::vector<char> id_elements(const std::vector<int>& ids, DType t) {
  const size_t e = size_t(dtype_bytes(t));
  std::vector<char> out(ids.size() * e);
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t k = 0; k < e; ++k) out[i * e + k] = char(uint8_t(ids[i] + 37 * int(k)));
  return out;
}

// The ids of such elements; -1 for an element whose bytes do not belong to one id.
inline std::vector<int> element_ids(const std::vector<char>& bytes, DType t) {
  const size_t e = size_t(dtype_bytes(t));
  std::vector<int> ids(bytes.size() / e);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = uint8_t(bytes[i * e]);
    for (size_t k = 0; k < e; ++k)
      if (uint8_t(bytes[i * e + k]) != uint8_t(ids[i] + 37 * int(k))) {
        ids[i] = -1;
        break;
      }
  }
  return ids;
}

// The all-to-all the MPI and NCCL tests run (2 to 4 ranks): rank `from` sends count(from, to)
// elements to `to` -- uneven, none from rank 1 to rank 0, and with 4 ranks none to rank 3 -- the
// j-th standing for base + 64 from + 16 to + j. What `rank` sends and, by the definition of an
// all-to-all, receives: the blocks of peers 0, 1, ... back to back.
struct AllToAllCase {
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<int> send_ids, recv_ids;
};
inline AllToAllCase all_to_all_case(int rank, int size, int base = 0) {
  auto count = [size](int from, int to) -> int64_t {
    if ((size == 4 && to == 3) || (from == 1 && to == 0)) return 0;
    return (from + 2 * to) % 4 + (from == to ? 1 : 3);
  };
  AllToAllCase c;
  for (int p = 0; p < size; ++p) {
    c.send_counts.push_back(count(rank, p));
    c.recv_counts.push_back(count(p, rank));
    for (int64_t j = 0; j < count(rank, p); ++j) c.send_ids.push_back(base + 64 * rank + 16 * p + int(j));
    for (int64_t j = 0; j < count(p, rank); ++j) c.recv_ids.push_back(base + 64 * p + 16 * rank + int(j));
  }
  return c;
}

}  // namespace tpt::test
