// The kept rows of a stage's MoE layers with EP > 1 (model/moe.h MoEMLP): how many rows a layer's
// experts receive is routing's choice, so each layer and micro-batch in flight takes the rows it
// received, from one region planned for the layers' mean load (model.moe_kept_rows_factor x the
// balanced load, docs/MOE.md "Buffers"), and gives them back after its backward -- as Megatron's
// dropless dispatch allocates what arrives. Blocks come first fit (lowest address) and are given
// back in any order, neighbours merged. A block that fits nowhere grows the pool by a region of four
// such blocks (one device allocation, with a warning): never a drop.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "core/ops.h"

namespace tpt {

class MoERowPool {
 public:
  // one region of `bytes` (a multiple of 256, may be 0)
  MoERowPool(Ops& ops, int64_t bytes);
  ~MoERowPool();
  MoERowPool(const MoERowPool&) = delete;
  MoERowPool& operator=(const MoERowPool&) = delete;
  // a block of `bytes` (a multiple of 256, > 0) for `rows` of MoE layer `layer` (named in the warning
  // when the pool grows)
  char* take(int64_t bytes, int64_t layer, int64_t rows);
  void give(char* block);  // a block take returned
  int64_t capacity() const;           // the bytes of its regions
  int64_t planned() const { return planned_; }  // the first region's (what the plan counts)
  int64_t in_use() const { return in_use_; }
  int64_t peak() const { return peak_; }  // the most bytes in use at once

 private:
  struct Region {
    char* base;
    int64_t size;
    std::map<int64_t, int64_t> free;  // offset -> bytes, disjoint and not adjacent
  };
  Ops& ops_;
  std::vector<Region> regions_;
  std::map<char*, std::pair<size_t, int64_t>> used_;  // block -> region, bytes
  int64_t planned_ = 0, in_use_ = 0, peak_ = 0;
  char* fit(size_t region, int64_t bytes);
};

}  // namespace tpt
