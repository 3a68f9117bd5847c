// (group, key) -> position of a chunk in a rank's sorted records (private to
// kvstorelib). Built once after the walk and only read after that, so the
// manifest threads look chunks up concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/kvstore/inventory.h"

namespace kvstore::scan_detail {

class ChunkIndex {
 public:
  static constexpr long kNone = -1;

  explicit ChunkIndex(const std::vector<ChunkRec>& chunks) : chunks_(chunks) {
    size_t n = 16;
    while (n < 2 * chunks.size()) n *= 2;
    slots_.assign(n, {0, 0});
    for (size_t i = 0; i < chunks.size(); ++i) {
      uint64_t h = hash(chunks[i].group, chunks[i].key);
      size_t s = h & (n - 1);
      while (slots_[s].second != 0) s = (s + 1) & (n - 1);
      slots_[s] = {static_cast<uint32_t>(h >> 32), static_cast<uint32_t>(i + 1)};
    }
  }

  long find(uint32_t group, std::string_view key) const {
    uint64_t h = hash(group, key);
    size_t mask = slots_.size() - 1;
    // The tag (the hash's high half) spares most visits to records that do
    // not match, each a likely cache miss.
    for (size_t s = h & mask; slots_[s].second != 0; s = (s + 1) & mask) {
      if (slots_[s].first != static_cast<uint32_t>(h >> 32)) continue;
      const ChunkRec& c = chunks_[slots_[s].second - 1];
      if (c.group == group && c.key == key) return static_cast<long>(slots_[s].second - 1);
    }
    return kNone;
  }

 private:
  static uint64_t hash(uint32_t group, std::string_view key) {
    uint64_t h = std::hash<std::string_view>{}(key) ^ (uint64_t{group} * 0x9E3779B97F4A7C15ull);
    return h ^ (h >> 29);
  }

  const std::vector<ChunkRec>& chunks_;
  std::vector<std::pair<uint32_t, uint32_t>> slots_;  // (tag, position + 1); 0: empty
};

}  // namespace kvstore::scan_detail
