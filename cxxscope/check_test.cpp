#include "check.h"

#include <gtest/gtest.h>

namespace cxxscope {
namespace {

FileReport with_errors(std::vector<std::pair<std::string, size_t>> errs) {
  FileReport r;
  r.ok = true;
  for (auto& [f, l] : errs) r.diagnostics.push_back(Diagnostic{"error", f, l, "boom"});
  return r;
}

TEST(CxxCheck, ErrorInsideARegionFails) {
  auto rep = with_errors({{"/t/a.cpp", 12}, {"/t/a.cpp", 3}});
  auto v = judge(rep, "/t/a.cpp", {{"ov/e1", 10, 14}}, {}, false);
  EXPECT_TRUE(v.failed);
  ASSERT_EQ(v.in_regions.size(), 1u);
  EXPECT_EQ(v.in_regions[0].region, "ov/e1");
  EXPECT_EQ(v.outside.size(), 1u);
}

TEST(CxxCheck, ErrorsOutsideCountOnlyWhenTheFileMustCompile) {
  auto rep = with_errors({{"/t/a.cpp", 3}, {"/usr/include/x.h", 9}});
  EXPECT_FALSE(judge(rep, "/t/a.cpp", {{"ov/e1", 10, 14}}, {}, false).failed);
  EXPECT_TRUE(judge(rep, "/t/a.cpp", {{"ov/e1", 10, 14}}, {}, true).failed);
  FileReport clean;
  clean.ok = true;
  clean.missing_headers = {"torch/all.h"};
  EXPECT_FALSE(judge(clean, "/t/a.cpp", {}, {}, false).failed);
  EXPECT_TRUE(judge(clean, "/t/a.cpp", {}, {}, true).failed);
}

TEST(CxxCheck, ErrorInANewFileCountsAsInjected) {
  auto rep = with_errors({{"/t/new.h", 2}});
  auto v = judge(rep, "/t/a.cpp", {}, {"/t/new.h"}, false);
  EXPECT_TRUE(v.failed);
  EXPECT_EQ(v.in_regions.at(0).region, "new file");
}

TEST(CxxCheck, RegionDroppedByThePreprocessorFailsClosed) {
  FileReport rep;
  rep.ok = true;
  rep.inactive = {{9, 20}};
  auto v = judge(rep, "/t/a.cpp", {{"ov/dead", 10, 13}, {"ov/live", 30, 33}}, {}, false);
  EXPECT_TRUE(v.failed);
  ASSERT_EQ(v.dropped.size(), 1u);
  EXPECT_EQ(v.dropped[0].region, "ov/dead");
}

// "#if 0" inside the region leaves its directive lines live; only code counts.
TEST(CxxCheck, DirectivesAroundDeadCodeDoNotMakeARegionLive) {
  FileReport rep;
  rep.ok = true;
  rep.inactive = {{12, 13}};
  InjectedRegion r{"ov/dead", 10, 15, {12, 13}};  // 11: #if 0, 14: #endif
  EXPECT_TRUE(judge(rep, "/t/a.cpp", {r}, {}, false).failed);
  InjectedRegion live{"ov/live", 10, 15, {12, 13, 14}};
  EXPECT_FALSE(judge(rep, "/t/a.cpp", {live}, {}, false).failed);
}

}  // namespace
}  // namespace cxxscope
