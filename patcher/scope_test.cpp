#include "scope.h"

#include <gtest/gtest.h>

#include "text.h"

namespace patcher {
namespace {

std::vector<std::string> L(const std::string& s) { return split_lines(s).lines; }

TEST(Scope, MultiLineSignatureDoesNotEndTheBlock) {
  auto lines = L(
      "class A:\n"
      "    def f(\n"
      "        self,\n"
      "    ) -> None:\n"
      "        x = 1\n"
      "\n"
      "        y = 2\n"
      "    def g(self):\n"
      "        pass\n");
  auto m = find_scope(lines, "class A/def f");
  ASSERT_TRUE(m.ok);
  EXPECT_EQ(m.range.begin, 1u);
  EXPECT_EQ(m.range.end, 7u);  // through "y = 2", not into g
}

TEST(Scope, DocstringAtColumnZeroStaysInside) {
  auto lines = L(
      "def f():\n"
      "    s = '''\n"
      "text at column zero\n"
      "'''\n"
      "    return s\n"
      "x = 1\n");
  auto m = find_scope(lines, "def f");
  ASSERT_TRUE(m.ok);
  EXPECT_EQ(m.range.end, 5u);
}

TEST(Scope, ShallowCommentDoesNotEndTheBlockButCodeDoes) {
  auto lines = L(
      "def f():\n"
      "    a = 1\n"
      "# a comment at column 0\n"
      "    b = 2\n"
      "def g():\n"
      "    pass\n");
  auto m = find_scope(lines, "def f");
  ASSERT_TRUE(m.ok);
  EXPECT_EQ(m.range.end, 4u);
}

TEST(Scope, NameMustEndAtAWordBoundaryAndAsyncCounts) {
  auto lines = L(
      "def schedule_batch():\n"
      "    pass\n"
      "async def schedule():\n"
      "    pass\n");
  auto m = find_scope(lines, "def schedule");
  ASSERT_TRUE(m.ok);
  EXPECT_EQ(m.range.begin, 2u);
}

TEST(Scope, AmbiguousOrMissingReportsWhatItFound) {
  auto lines = L(
      "class A:\n"
      "    def f(self):\n"
      "        pass\n"
      "class B:\n"
      "    def f(self):\n"
      "        pass\n");
  auto m = find_scope(lines, "def f");
  EXPECT_FALSE(m.ok);
  EXPECT_EQ(m.found, (std::vector<size_t>{1, 4}));
  m = find_scope(lines, "class B/def f");
  ASSERT_TRUE(m.ok);
  EXPECT_EQ(m.range.begin, 4u);
  m = find_scope(lines, "class C/def f");
  EXPECT_FALSE(m.ok);
  EXPECT_EQ(m.segment, "class C");
  EXPECT_TRUE(m.found.empty());
  EXPECT_EQ(m.headers.size(), 4u);
}

TEST(Scope, BackslashContinuationAndBracketsInStrings) {
  auto lines = L(
      "def f():\n"
      "    x = \"(\" + \\\n"
      "1\n"
      "    return x\n"
      "y = 2\n");
  auto starts = logical_starts(lines);
  EXPECT_FALSE(starts[2]);
  EXPECT_TRUE(starts[3]);
  auto m = find_scope(lines, "def f");
  ASSERT_TRUE(m.ok);
  EXPECT_EQ(m.range.end, 4u);
}

}  // namespace
}  // namespace patcher
