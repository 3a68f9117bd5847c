#include "anchor.h"

#include <gtest/gtest.h>

namespace patcher {
namespace {

TEST(Anchor, FindsEveryExactMultiLineOccurrence) {
  std::vector<std::string> lines = {"a", "b", "a", "b", "a"};
  EXPECT_EQ(find_anchor(lines, 0, lines.size(), {"a", "b"}), (std::vector<size_t>{0, 2}));
  EXPECT_EQ(find_anchor(lines, 1, lines.size(), {"a", "b"}), (std::vector<size_t>{2}));
  EXPECT_TRUE(find_anchor(lines, 0, lines.size(), {" a"}).empty());  // indentation matters
}

TEST(Anchor, SimilarityIsARatioOfCommonCharacters) {
  EXPECT_DOUBLE_EQ(similarity("abcd", "abcd"), 1.0);
  EXPECT_DOUBLE_EQ(similarity("abcd", "wxyz"), 0.0);
  EXPECT_DOUBLE_EQ(similarity("abcd", "abxd"), 0.75);
}

TEST(Anchor, NearestRanksTheRenamedLineFirst) {
  std::vector<std::string> lines = {"import os", "    for req in batch:", "    return batch"};
  auto near = nearest(lines, 0, lines.size(), {"    for request in batch:"});
  ASSERT_FALSE(near.empty());
  EXPECT_EQ(near[0].line, 1u);
  EXPECT_GT(near[0].score, 0.8);
  EXPECT_LE(near.size(), 3u);
}

TEST(Anchor, UnifiedDiffListsRemovalsBeforeAdditions) {
  auto d = unified_diff({"a", "b", "c"}, {"a", "B", "c"}, "anchor", "file", 1, 10);
  std::vector<std::string> want = {"--- anchor", "+++ file", "@@ -1,3 +10,3 @@", " a", "-b", "+B", " c"};
  EXPECT_EQ(d, want);
}

}  // namespace
}  // namespace patcher
