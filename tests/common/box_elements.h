// The tests' own walk over a shard's box (core/sharded_tensor.h), element by element with plain
// index arithmetic: an independent reference for the code's for_each_box_row.
#pragma once
#include <cstdint>

#include "core/sharded_tensor.h"

namespace tpt::test {

// f(local flat index, global flat index) for every element of p's box, row-major.
template <class F>
void for_each_box_element(const TensorShard& p, F&& f) {
  int64_t n = 1;
  for (int64_t s : p.box_size) n *= s;
  for (int64_t e = 0; e < n; ++e) {
    int64_t rem = e, local = 0, global = 0, ls = 1, gs = 1;
    for (size_t k = p.box_size.size(); k-- > 0;) {
      const int64_t i = rem % p.box_size[k];
      rem /= p.box_size[k];
      local += i * ls;
      global += (p.box_offset[k] + i) * gs;
      ls *= p.local_shape[k];
      gs *= p.global_shape[k];
    }
    f(local, global);
  }
}

}  // namespace tpt::test
