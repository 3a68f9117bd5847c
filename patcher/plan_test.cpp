#include "plan.h"

#include <gtest/gtest.h>

#include "region.h"

namespace patcher {
namespace {

Edit make_edit(const std::string& id, Action a, std::vector<std::string> anchor, std::vector<std::string> frag,
               int indent = 0) {
  Edit e;
  e.id = id;
  e.action = a;
  e.anchor_lines = std::move(anchor);
  e.fragment_lines = std::move(frag);
  e.indent = indent;
  return e;
}

TEST(Plan, InsertReindentsToAnchorPlusIndentAndWrapsInSentinels) {
  Manifest m;
  m.overlay = "ov";
  FileSpec f;
  f.path = "m.py";
  f.edits.push_back(make_edit("hook", Action::InsertAfter, {"    def f(self):"}, {"if x:", "    y()"}, 4));
  Text t = split_lines("class A:\n    def f(self):\n        return 1\n");
  Build b = base_build(t);
  auto s = apply_overlay(b, m, f, join_lines(t), "m.py");
  ASSERT_TRUE(s.ok()) << s.error().line();
  std::vector<std::string> body = {"        if x:", "            y()"};
  std::vector<std::string> want = {"class A:", "    def f(self):",
                                   begin_sentinel("#", "        ", "ov", "hook", region_hash(body)), body[0], body[1],
                                   end_sentinel("#", "        ", "ov", "hook"), "        return 1"};
  EXPECT_EQ(b.texts(), want);
  EXPECT_EQ(b.region_at(4), "ov/hook");
  EXPECT_EQ(b.region_at(1), "");
}

TEST(Plan, OccurrencesAppliesAtEveryMatchAndCountsMustAgree) {
  Manifest m;
  m.overlay = "ov";
  FileSpec f;
  f.path = "m.py";
  f.edits.push_back(make_edit("each", Action::InsertBefore, {"x = 1"}, {"y = 0"}));
  f.edits[0].occurrences = 2;
  Text t = split_lines("x = 1\nx = 1\n");
  Build b = base_build(t);
  ASSERT_TRUE(apply_overlay(b, m, f, join_lines(t), "m.py").ok());
  EXPECT_EQ(b.regions.size(), 2u);
  f.edits[0].occurrences = 1;
  Build c = base_build(t);
  auto s = apply_overlay(c, m, f, join_lines(t), "m.py");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().kind, ErrorKind::Drift);
}

TEST(Plan, SupersededEditIsSkipped) {
  Manifest m;
  m.overlay = "ov";
  FileSpec f;
  f.path = "m.py";
  f.edits.push_back(make_edit("old", Action::InsertAfter, {"x = 1"}, {"y = 2"}));
  f.edits[0].superseded_by = "y = 2";
  Text t = split_lines("x = 1\ny = 2\n");
  Build b = base_build(t);
  ASSERT_TRUE(apply_overlay(b, m, f, join_lines(t), "m.py").ok());
  EXPECT_EQ(b.text(), "x = 1\ny = 2\n");
}

TEST(Plan, FileWithoutFinalNewlineRoundTrips) {
  Manifest m;
  m.overlay = "ov";
  FileSpec f;
  f.path = "m.py";
  f.edits.push_back(make_edit("tail", Action::InsertAfter, {"x = 1"}, {"y = 2"}));
  m.files.push_back(f);
  Text t = split_lines("x = 1");
  Build b = base_build(t);
  ASSERT_TRUE(apply_overlay(b, m, f, "x = 1", "m.py").ok());
  auto back = strip_overlay(split_lines(b.text()).lines, m, f, "m.py", nullptr);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(join_lines(*back, false), "x = 1");
}

}  // namespace
}  // namespace patcher
