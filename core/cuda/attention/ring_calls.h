// Context parallelism's ring blocks as cuDNN calls (core/cuda/attention/cudnn_attention.cpp
// ring_forward / ring_backward): which (query chunks, key chunks) each call takes. Plain C++ (no
// CUDA), so that tests/unit/ring_attention_test.cpp checks the calls' masks on every machine.
#pragma once
#include <vector>

#include "core/ops.h"

namespace tpt::cuda {

// One cuDNN call of a ring block: query chunks q0 .. q0 + qn - 1 against key chunks k0 .. k0 + kn - 1
// (RingBlock's local chunks: 0, 1), causal or unmasked.
struct RingCall {
  int q0, qn, k0, kn;
  bool causal;
};

// A ring block's calls, in a fixed order. Each (query chunk, key chunk) pair that sees anything -- a
// query chunk sees an earlier key chunk whole and its own causally -- is one call; with merge, the
// pairs of parallel/context_parallel.h's blocks (a rank's chunks r < 2 CP - 1 - r, in token order)
// are one call per block, fewer and longer calls and one merge:
//   the rank's own K/V: both query chunks against both key chunks, causal (in the rank's token
//     order cuDNN's top-left causal mask is exactly the chunks': the later sees the earlier whole);
//   a lower rank's: both query chunks against its first chunk, unmasked (its second is later than both);
//   a higher rank's: the second query chunk against both its chunks, unmasked (the first sees neither).
inline std::vector<RingCall> ring_calls(const RingBlock& blk, bool merge) {
  std::vector<RingCall> pairs;
  bool causal = false;
  for (int qi = 0; qi < 2; ++qi)
    for (int kj = 0; kj < 2; ++kj)
      if (blk.q_chunks[qi] >= blk.k_chunks[kj]) {
        pairs.push_back({qi, 1, kj, 1, blk.q_chunks[qi] == blk.k_chunks[kj]});
        causal = causal || pairs.back().causal;
      }
  const bool ordered = blk.q_chunks[0] < blk.q_chunks[1] && blk.k_chunks[0] < blk.k_chunks[1];
  if (!merge || !ordered || pairs.size() < 2) return pairs;
  if (blk.q_chunks[0] == blk.k_chunks[0] && blk.q_chunks[1] == blk.k_chunks[1]) return {{0, 2, 0, 2, true}};
  if (causal) return pairs;
  if (pairs.size() == 4) return {{0, 2, 0, 2, false}};
  if (pairs.size() == 2 && pairs[0].k0 == pairs[1].k0) return {{0, 2, pairs[0].k0, 1, false}};
  if (pairs.size() == 2 && pairs[0].q0 == pairs[1].q0) return {{pairs[0].q0, 1, 0, 2, false}};
  return pairs;
}

// The calls' shapes (qn, kn, causal) of parallel/context_parallel.h's blocks, merged or per pair.
inline std::vector<RingCall> ring_shapes(bool merge) {
  if (merge) return {{0, 2, 0, 2, true}, {0, 2, 0, 1, false}, {1, 1, 0, 2, false}};
  return {{0, 1, 0, 1, true}, {0, 1, 0, 1, false}};
}

}  // namespace tpt::cuda
