#include "region.h"

#include <gtest/gtest.h>

#include "text.h"

namespace patcher {
namespace {

TEST(Region, SentinelsRoundTrip) {
  std::string b = begin_sentinel("#", "    ", "ov", "e1", "0123456789abcdef");
  EXPECT_EQ(b, "    # >>> overlay ov/e1 sha256=0123456789abcdef");
  Sentinel s = parse_sentinel(b);
  EXPECT_EQ(s.kind, SentinelKind::Begin);
  EXPECT_EQ(s.overlay, "ov");
  EXPECT_EQ(s.edit, "e1");
  EXPECT_EQ(s.hash, "0123456789abcdef");
  EXPECT_EQ(parse_sentinel(end_sentinel("//", "", "ov", "e1")).kind, SentinelKind::End);
  EXPECT_EQ(parse_sentinel(new_file_header("#", "ov", "0123456789abcdef")).kind, SentinelKind::NewFile);
  EXPECT_EQ(parse_sentinel("# >>> overlay broken").kind, SentinelKind::Malformed);
  EXPECT_EQ(parse_sentinel("x = 1  # >>> overlay a/b").kind, SentinelKind::None);
  EXPECT_EQ(comment_prefix("a/b.py"), "#");
  EXPECT_EQ(comment_prefix("a/b.cpp"), "//");
}

TEST(Region, UnbalancedSentinelsAreTampered) {
  auto r = parse_regions({"# >>> overlay a/x sha256=0123456789abcdef", "x = 1"}, "f.py");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind, ErrorKind::Tampered);
  EXPECT_NE(r.error().message.find("no end sentinel"), std::string::npos);
  r = parse_regions({"# >>> overlay a/x sha256=0123456789abcdef", "# <<< overlay a/y"}, "f.py");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("does not close"), std::string::npos);
}

TEST(Region, StripRestoresReplacedAnchorAndChecksHash) {
  Manifest m;
  m.overlay = "ov";
  FileSpec spec;
  spec.path = "f.py";
  Edit e;
  e.id = "rep";
  e.action = Action::Replace;
  e.anchor_lines = {"    old = 1"};
  spec.edits.push_back(e);
  m.files.push_back(spec);
  std::vector<std::string> body = {"    new = 2"};
  std::vector<std::string> lines = {"def f():", begin_sentinel("#", "    ", "ov", "rep", region_hash(body)), body[0],
                                    end_sentinel("#", "    ", "ov", "rep"), "    return 0"};
  std::map<std::string, int> counts;
  auto out = strip_overlay(lines, m, m.files[0], "f.py", &counts);
  ASSERT_TRUE(out.ok()) << out.error().line();
  EXPECT_EQ(*out, (std::vector<std::string>{"def f():", "    old = 1", "    return 0"}));
  EXPECT_EQ(counts["rep"], 1);
  lines[2] = "    new = 3";  // hand edit
  auto bad = strip_overlay(lines, m, m.files[0], "f.py", nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind, ErrorKind::Tampered);
  EXPECT_NE(bad.error().message.find("edited by hand"), std::string::npos);
}

}  // namespace
}  // namespace patcher
