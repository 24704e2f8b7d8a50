#include "core/sharded_tensor.h"

namespace tpt {

std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> flat_range_boxes(const std::vector<int64_t>& shape,
                                                                                    int64_t begin, int64_t end) {
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> out;
  if (begin >= end) return out;
  const size_t nd = shape.size();
  if (nd == 0) return {{{}, {}}};
  if (nd == 1) return {{{begin}, {end - begin}}};
  const std::vector<int64_t> inner_shape(shape.begin() + 1, shape.end());
  const int64_t inner = volume(inner_shape);
  if (inner == 0) return out;
  auto row_part = [&](int64_t row, int64_t a, int64_t b) {  // [a, b) of one leading row
    for (auto& [off, size] : flat_range_boxes(inner_shape, a, b)) {
      off.insert(off.begin(), row);
      size.insert(size.begin(), 1);
      out.emplace_back(std::move(off), std::move(size));
    }
  };
  int64_t r0 = begin / inner;
  const int64_t r1 = end / inner;
  if (r0 == r1) {
    row_part(r0, begin - r0 * inner, end - r0 * inner);
    return out;
  }
  if (begin % inner) row_part(r0++, begin % inner, inner);
  if (r1 > r0) {
    std::vector<int64_t> off(nd, 0), size = shape;
    off[0] = r0;
    size[0] = r1 - r0;
    out.emplace_back(std::move(off), std::move(size));
  }
  if (end % inner) row_part(r1, 0, end % inner);
  return out;
}

}  // namespace tpt
