// Host-side helpers of the kernel launchers (kernels.cu, vocab_kernels.cu): a tensor's pointer as
// its storage type, the alignment test that allows vector accesses, and the same-dtype check.
#pragma once
#include <string>

#include "core/cuda/device_util.h"
#include "core/ops.h"

namespace tpt::cuda {

// A tensor's pointer as its storage type (host side).
template <class T>
const T* typed(CBuf x) {
  return static_cast<const T*>(x.p);
}
template <class T>
T* typed(Buf x) {
  return static_cast<T*>(x.p);
}

// Every pointer aligned to W elements of its own type (vector accesses allowed).
template <int W>
bool all_aligned() {
  return true;
}
template <int W, class P, class... Ps>
bool all_aligned(P* p, Ps*... ps) {
  return (p == nullptr || is_aligned(p, W * sizeof(P))) && all_aligned<W>(ps...);
}

// Operands of one kernel share a storage type.
inline void check_same(DType a, DType b, const char* what) {
  if (a != b) internal_error(std::string("CUDA kernel ") + what + ": operands of different dtypes");
}

}  // namespace tpt::cuda
