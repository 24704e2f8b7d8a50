#include "data/bpe_merge.h"

#include <atomic>

namespace tpt::bpe {
namespace {

std::atomic<uint64_t> next_cache_id{1};

struct ThreadCache {
  uint64_t owner = 0;
  PieceCache::Map map;
};
thread_local ThreadCache thread_cache;

}  // namespace

PieceCache::PieceCache() : id_(next_cache_id.fetch_add(1)) {}

PieceCache::Map& PieceCache::get() const {
  ThreadCache& c = thread_cache;
  if (c.owner != id_ || c.map.size() >= kMaxEntries) {
    c.map.clear();
    c.owner = id_;
  }
  return c.map;
}

}  // namespace tpt::bpe
