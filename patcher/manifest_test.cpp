#include "manifest.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace patcher {
namespace {

TEST(Manifest, ParsesTheContractFieldsAndDefaults) {
  auto dir = testing::source_dir() + "/overlays/example-cache";
  std::string toml = testing::read_file(testing::source_dir() + "/anchors/example-1.0/example-cache.toml");
  auto m = parse_manifest(toml, "example-cache.toml", dir);
  ASSERT_TRUE(m.ok()) << m.error().line();
  EXPECT_EQ(m->overlay, "example-cache");
  EXPECT_EQ(m->engine, "example");
  EXPECT_EQ(m->engine_version, "1.0");
  ASSERT_EQ(m->files.size(), 2u);
  const Edit* lookup = m->find_edit("lookup");
  ASSERT_NE(lookup, nullptr);
  EXPECT_EQ(lookup->scope, "class Scheduler/def schedule");
  EXPECT_EQ(lookup->anchor_lines, (std::vector<std::string>{"        for request in batch:"}));
  EXPECT_EQ(lookup->occurrences, 1);
  EXPECT_EQ(lookup->indent, 4);
  EXPECT_EQ(lookup->action, Action::InsertAfter);
  EXPECT_EQ(m->find_edit("remember")->action, Action::Replace);
  ASSERT_EQ(m->new_files.size(), 1u);
  EXPECT_FALSE(m->new_files[0].text.empty());
}

TEST(Manifest, SetIsOrderedByOrderFileAndAfter) {
  auto set = load_manifests(testing::source_dir() + "/anchors/example-1.0", testing::source_dir() + "/overlays");
  ASSERT_TRUE(set.ok()) << set.error().line();
  ASSERT_EQ(set->overlays.size(), 2u);
  EXPECT_EQ(set->overlays[0].overlay, "example-cache");
  EXPECT_EQ(set->overlays[1].overlay, "example-cache-stats");
}

}  // namespace
}  // namespace patcher
