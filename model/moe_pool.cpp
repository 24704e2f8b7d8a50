// The MoE layers' pool of kept rows (model/moe_pool.h).
#include "model/moe_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/error.h"
#include "model/stage_bytes.h"

namespace tpt {

namespace {
constexpr int64_t kAlign = stage_bytes::kScratchAlign;
}

MoERowPool::MoERowPool(Ops& ops, int64_t bytes) : ops_(ops), planned_(bytes) {
  TPT_CHECK(bytes >= 0 && bytes % kAlign == 0);
  if (bytes > 0) regions_.push_back({static_cast<char*>(ops_.alloc_bytes(size_t(bytes))), bytes, {{0, bytes}}});
}

MoERowPool::~MoERowPool() {
  for (Region& r : regions_) ops_.free(r.base);
}

int64_t MoERowPool::capacity() const {
  int64_t n = 0;
  for (const Region& r : regions_) n += r.size;
  return n;
}

char* MoERowPool::fit(size_t region, int64_t bytes) {
  Region& r = regions_[region];
  for (auto it = r.free.begin(); it != r.free.end(); ++it) {
    if (it->second < bytes) continue;
    const int64_t off = it->first, left = it->second - bytes;
    r.free.erase(it);
    if (left > 0) r.free.emplace(off + bytes, left);
    char* p = r.base + off;
    used_.emplace(p, std::make_pair(region, bytes));
    in_use_ += bytes;
    peak_ = std::max(peak_, in_use_);
    return p;
  }
  return nullptr;
}

char* MoERowPool::take(int64_t bytes, int64_t layer, int64_t rows) {
  TPT_CHECK(bytes > 0 && bytes % kAlign == 0);
  for (size_t i = 0; i < regions_.size(); ++i)
    if (char* p = fit(i, bytes)) return p;
  // a region of 4 such blocks: a lasting imbalance grows it now and then, not per block, and never by
  // much more than it asked for (on a GPU near its memory's end)
  const int64_t cap = capacity();
  const int64_t grow = 4 * bytes;
  spdlog::warn("WARNING: MoE layer {}: its experts' {} rows ({} bytes) do not fit in the MoE layers' pool of kept "
               "rows ({} bytes, {} in use); growing it by {} bytes (one allocation now, not in the plan; "
               "model.moe_kept_rows_factor plans more)", layer, rows, bytes, cap, in_use_, grow);
  regions_.push_back({static_cast<char*>(ops_.alloc_bytes(size_t(grow))), grow, {{0, grow}}});
  char* p = fit(regions_.size() - 1, bytes);
  TPT_CHECK(p);
  return p;
}

void MoERowPool::give(char* block) {
  const auto u = used_.find(block);
  TPT_CHECK(u != used_.end());
  Region& r = regions_[u->second.first];
  int64_t off = block - r.base, bytes = u->second.second;
  in_use_ -= bytes;
  used_.erase(u);
  auto next = r.free.lower_bound(off);
  if (next != r.free.end() && next->first == off + bytes) {  // merge the free block after
    bytes += next->second;
    next = r.free.erase(next);
  }
  if (next != r.free.begin()) {  // and the one before
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      bytes += prev->second;
      r.free.erase(prev);
    }
  }
  r.free.emplace(off, bytes);
}

}  // namespace tpt
