#include "diff.h"

#include <gtest/gtest.h>

namespace patcher {
namespace {

// Applies a unified diff made by unified_file_diff to `a` (test oracle).
std::vector<std::string> patch(const std::vector<std::string>& a, const std::vector<std::string>& diff) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (size_t i = 2; i < diff.size(); ++i) {
    const std::string& l = diff[i];
    if (l.rfind("@@ -", 0) == 0) {
      size_t start = std::stoul(l.substr(4));
      size_t len = std::stoul(l.substr(l.find(',') + 1));
      size_t from = len ? start - 1 : start;
      while (pos < from) out.push_back(a[pos++]);
      continue;
    }
    if (l[0] == ' ' || l[0] == '-') ++pos;
    if (l[0] == ' ' || l[0] == '+') out.push_back(l.substr(1));
  }
  while (pos < a.size()) out.push_back(a[pos++]);
  return out;
}

TEST(FileDiff, HunksWithContextAndPatchBack) {
  std::vector<std::string> a, b;
  for (int i = 0; i < 40; ++i) a.push_back("line " + std::to_string(i));
  b = a;
  b.insert(b.begin() + 5, {"# >>> region", "new", "# <<< region"});
  b[30] = "changed";
  b.erase(b.begin() + 40);
  auto d = unified_file_diff(a, b, "a", "b");
  ASSERT_GE(d.size(), 4u);
  EXPECT_EQ(d[0], "--- a");
  EXPECT_EQ(d[2], "@@ -3,6 +3,9 @@");
  int hunks = 0;
  for (auto& l : d) hunks += l.rfind("@@", 0) == 0;
  EXPECT_EQ(hunks, 3);
  EXPECT_EQ(patch(a, d), b);
}

TEST(FileDiff, EqualFilesGiveNoDiffAndEdgesWork) {
  std::vector<std::string> a = {"x", "y"};
  EXPECT_TRUE(unified_file_diff(a, a, "a", "b").empty());
  EXPECT_EQ(patch({}, unified_file_diff({}, a, "a", "b")), a);
  EXPECT_EQ(patch(a, unified_file_diff(a, {}, "a", "b")), std::vector<std::string>{});
}

}  // namespace
}  // namespace patcher
