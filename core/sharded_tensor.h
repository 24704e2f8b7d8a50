// One rank's shard of a global tensor, and the one walk over a box that the parameter layout and
// its initialisation, the checkpoints and the safetensors reader all use (docs/ARCHITECTURE.md
// "Checkpoint format").
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tpt {

// The box [box_offset, box_offset + box_size) of a tensor of global_shape that one rank holds,
// stored row-major as the leading part, in every dimension, of a local tensor of local_shape (only
// the word embedding's local tensor is larger than its box: padded vocabulary rows). Parameters
// (model/gpt.h ParamInfo) and checkpoint tensors (parallel/checkpoint.h CkptTensor) are this plus
// where their bytes live. The distributed optimizer's blocks are flat ranges of the local tensor:
// flat_range_boxes turns one into boxes.
struct TensorShard {
  std::string name;  // global name, e.g. "h.3.attn.qkv.weight"
  std::vector<int64_t> global_shape, box_offset, box_size, local_shape;
};

inline int64_t volume(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The walk: a box of `size` lies at a_at in a row-major tensor of a_shape and at b_at in one of
// b_shape (empty *_at: the origin). f(a, b, n) is called for every run of n consecutive elements in
// both, in row-major order, with a and b the flat offsets of the run's first element (inner
// dimensions the box covers whole in both tensors are merged into one run). A 0-d box is one run of 1.
template <class F>
void for_each_box_row(std::span<const int64_t> size, std::span<const int64_t> a_shape, std::span<const int64_t> a_at,
                      std::span<const int64_t> b_shape, std::span<const int64_t> b_at, F&& f) {
  const size_t nd = size.size();
  for (int64_t s : size)
    if (s <= 0) return;
  if (nd == 0) return f(int64_t(0), int64_t(0), int64_t(1));
  std::vector<int64_t> as(nd, 1), bs(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) as[d - 1] = as[d] * a_shape[d], bs[d - 1] = bs[d] * b_shape[d];
  int64_t a0 = 0, b0 = 0;
  for (size_t d = 0; d < nd; ++d) a0 += (a_at.empty() ? 0 : a_at[d]) * as[d], b0 += (b_at.empty() ? 0 : b_at[d]) * bs[d];
  size_t k = nd - 1;  // runs cover dimensions k.. (k > 0: dimensions after k are whole in both)
  int64_t run = size[nd - 1];
  while (k > 0 && size[k] == a_shape[k] && size[k] == b_shape[k]) run *= size[--k];
  std::vector<int64_t> idx(k, 0);
  for (;;) {
    int64_t a = a0, b = b0;
    for (size_t d = 0; d < k; ++d) a += idx[d] * as[d], b += idx[d] * bs[d];
    f(a, b, run);
    int d = int(k) - 1;
    while (d >= 0 && ++idx[size_t(d)] == size[size_t(d)]) idx[size_t(d--)] = 0;
    if (d < 0) return;
  }
}

// The boxes of the elements [begin, end) of a row-major tensor of `shape`, in order: at most
// 2 * rank - 1 boxes (a partial first row, whole rows, a partial last row, recursively), each as
// (offset, size).
std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> flat_range_boxes(const std::vector<int64_t>& shape,
                                                                                    int64_t begin, int64_t end);

}  // namespace tpt
