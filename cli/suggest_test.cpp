#include "suggest.h"

#include <gtest/gtest.h>

namespace {

const std::vector<std::string> kSubs = {"status", "plan", "apply", "check", "revert", "recover"};

TEST(Nearest, Typos) {
  EXPECT_EQ(kvtier::nearest("stauts", kSubs), "status");  // swapped neighbours
  EXPECT_EQ(kvtier::nearest("statsu", kSubs), "status");
  EXPECT_EQ(kvtier::nearest("aply", kSubs), "apply");     // one deletion
  EXPECT_EQ(kvtier::nearest("chek", kSubs), "check");
  EXPECT_EQ(kvtier::nearest("revret", kSubs), "revert");
  EXPECT_EQ(kvtier::nearest("--jsno", {"--json", "--root"}), "--json");
}

TEST(Nearest, PrefixOnlyWhenUnique) {
  EXPECT_EQ(kvtier::nearest("ver", {"verify", "gc", "stat", "inspect"}), "verify");
  EXPECT_EQ(kvtier::nearest("re", kSubs), "");  // too short, and revert/recover
}

TEST(Nearest, NothingCloseMeansNothing) {
  EXPECT_EQ(kvtier::nearest("frobnicate", kSubs), "");
  EXPECT_EQ(kvtier::nearest("xy", kSubs), "");
}

}  // namespace
