#include "chunk_index.h"

#include <gtest/gtest.h>

namespace kvstore::scan_detail {
namespace {

ChunkRec rec(uint32_t group, std::string key) {
  ChunkRec c;
  c.group = group;
  c.key = std::move(key);
  return c;
}

TEST(ChunkIndex, FindsEachChunkByGroupAndKeyAndNothingElse) {
  std::vector<ChunkRec> chunks;
  for (int i = 0; i < 1000; ++i) chunks.push_back(rec(static_cast<uint32_t>(i % 3), std::to_string(i * 7919)));
  chunks.push_back(rec(5, "same"));
  chunks.push_back(rec(6, "same"));  // one key in two groups: two chunks
  const ChunkIndex index(chunks);
  for (size_t i = 0; i < chunks.size(); ++i) EXPECT_EQ(index.find(chunks[i].group, chunks[i].key), static_cast<long>(i));
  EXPECT_EQ(index.find(1, std::to_string(0)), ChunkIndex::kNone);  // key 0 is in group 0
  EXPECT_EQ(index.find(0, "absent"), ChunkIndex::kNone);
  EXPECT_EQ(index.find(7, "same"), ChunkIndex::kNone);
}

TEST(ChunkIndex, EmptyIndexFindsNothing) {
  std::vector<ChunkRec> none;
  EXPECT_EQ(ChunkIndex(none).find(0, "k"), ChunkIndex::kNone);
}

}  // namespace
}  // namespace kvstore::scan_detail
