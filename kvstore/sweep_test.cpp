#include "kvtier/kvstore/sweep.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>

#include "test_tmpdir.h"
#include "kvtier/kvstore/walk.h"

namespace kvstore {
namespace {

PlanItem item(int root, const std::string& rel, bool manifest) {
  auto st = stat_beneath(root, rel);
  EXPECT_TRUE(st) << rel;
  return {rel, manifest ? DeleteReason::kSuperseded : DeleteReason::kOrphan, "", *st, manifest};
}

TEST(Sweep, DeletesManifestsThenPayloads) {
  testing::TmpDir t;
  t.write("m/a.json", "{}");
  t.write("c/x.bin", "xx");
  t.write("c/keep.bin", "k");
  auto root = open_root(t.path());
  Plan p;
  p.items = {item(root->get(), "m/a.json", true), item(root->get(), "c/x.bin", false)};
  auto r = execute_plan(root->get(), p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->deleted, 2u);
  EXPECT_EQ(r->bytes, 4u);
  EXPECT_FALSE(t.exists("m/a.json"));
  EXPECT_FALSE(t.exists("c/x.bin"));
  EXPECT_TRUE(t.exists("c/keep.bin"));
}

TEST(Sweep, CountsDeletionsForTheProgressLine) {
  testing::TmpDir t;
  t.write("m/a.json", "{}");
  t.write("c/x.bin", "xxxx");
  t.write("c/gone.bin", "g");
  auto root = open_root(t.path());
  Plan p;
  p.items = {item(root->get(), "m/a.json", true), item(root->get(), "c/gone.bin", false),
             item(root->get(), "c/x.bin", false)};
  p.bytes = 7;
  ::unlink((t / "c/gone.bin").c_str());  // already gone: not counted as freed
  Progress progress(false, "sweep");
  auto r = execute_plan(root->get(), p, &progress);
  ASSERT_TRUE(r);
  EXPECT_EQ(progress.deleted(), 2u);
  EXPECT_EQ(progress.freed(), 6u);
  EXPECT_EQ(progress.line(1.0), "sweep: deleted 2/3 files, 0.0 MiB of 0.0 MiB freed");
}

TEST(Sweep, ChangedFileIsKept) {
  testing::TmpDir t;
  t.write("c/x.bin", "xx");
  t.write("c/y.bin", "yy");
  auto root = open_root(t.path());
  Plan p;
  p.items = {item(root->get(), "c/x.bin", false), item(root->get(), "c/y.bin", false)};
  t.write("c/x.bin", "rewritten by a writer");  // new size
  ::unlink((t / "c/y.bin").c_str());
  t.write("c/y.bin", "yy");  // same size, new inode
  auto r = execute_plan(root->get(), p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->deleted, 0u);
  ASSERT_EQ(r->skipped.size(), 2u);
  EXPECT_EQ(r->skipped[0].why, "changed since planned, kept");
  EXPECT_TRUE(t.exists("c/x.bin"));
  EXPECT_TRUE(t.exists("c/y.bin"));
}

// A writer republished a superseded boundary under the same name: the new
// manifest names the state payload the plan meant to delete with the old one.
TEST(Sweep, ChangedManifestHoldsEveryPayload) {
  testing::TmpDir t;
  t.write("m/a.json", "{}");
  t.write("m/b.json", "{}");
  t.write("c/state.bin", "ss");
  t.write("c/orphan.bin", "oo");
  auto root = open_root(t.path());
  Plan p;
  p.items = {item(root->get(), "m/a.json", true), item(root->get(), "m/b.json", true),
             item(root->get(), "c/orphan.bin", false), item(root->get(), "c/state.bin", false)};
  ::unlink((t / "m/b.json").c_str());
  t.write("m/b.json", "{}");  // same name and size, new inode
  auto r = execute_plan(root->get(), p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->deleted, 1u);  // the unchanged manifest only
  EXPECT_FALSE(t.exists("m/a.json"));
  EXPECT_TRUE(t.exists("m/b.json"));
  EXPECT_TRUE(t.exists("c/state.bin"));
  EXPECT_TRUE(t.exists("c/orphan.bin"));
  EXPECT_EQ(r->held, 2u);
  EXPECT_EQ(r->held_for, "m/b.json");
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_EQ(r->skipped[0].rel, "m/b.json");
}

// Enough payloads for the unlinks to be split over several threads: every
// file is still re-checked, and the report stays in path order.
TEST(Sweep, ManyPayloadsAcrossThreads) {
  testing::TmpDir t;
  auto rel = [](int i) { return fmt::format("c{:03}/x{:04}.bin", i % 700, i); };
  constexpr int kFiles = 2100;
  for (int i = 0; i < kFiles; ++i) t.write(rel(i), "xx");
  t.write("m/a.json", "{}");
  auto root = open_root(t.path());
  Plan p;
  p.items.push_back(item(root->get(), "m/a.json", true));
  std::vector<std::string> rels;
  for (int i = 0; i < kFiles; ++i) rels.push_back(rel(i));
  std::sort(rels.begin(), rels.end());  // plans are sorted by path
  for (const auto& r : rels) p.items.push_back(item(root->get(), r, false));
  std::vector<std::string> changed;
  for (size_t i = 0; i < rels.size(); i += 300) {
    t.write(rels[i], "rewritten");  // new size: must be kept
    changed.push_back(rels[i]);
  }
  auto r = execute_plan(root->get(), p);
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->errors.empty());
  EXPECT_EQ(r->deleted, 1 + rels.size() - changed.size());
  EXPECT_EQ(r->bytes, 2 + 2 * (rels.size() - changed.size()));
  ASSERT_EQ(r->skipped.size(), changed.size());
  for (size_t i = 0; i < changed.size(); ++i) {
    EXPECT_EQ(r->skipped[i].rel, changed[i]);
    EXPECT_TRUE(t.exists(changed[i]));
  }
  size_t left = 0;
  for (const auto& f : rels) left += t.exists(f);
  EXPECT_EQ(left, changed.size());
}

TEST(Sweep, VanishedFileIsSkipped) {
  testing::TmpDir t;
  t.write("c/x.bin", "xx");
  auto root = open_root(t.path());
  Plan p;
  p.items = {item(root->get(), "c/x.bin", false)};
  ::unlink((t / "c/x.bin").c_str());
  auto r = execute_plan(root->get(), p);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_EQ(r->skipped[0].why, "already gone");
}

TEST(Sweep, SymlinkSwappedInIsNotFollowed) {
  testing::TmpDir outside;
  outside.write("c/x.bin", "xx");
  testing::TmpDir t;
  t.write("c/x.bin", "xx");
  auto root = open_root(t.path());
  Plan p;
  p.items = {item(root->get(), "c/x.bin", false)};
  std::filesystem::remove_all(t / "c");
  ASSERT_EQ(::symlink((outside / "c").c_str(), (t / "c").c_str()), 0);
  auto r = execute_plan(root->get(), p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->deleted, 0u);
  EXPECT_EQ(r->errors.size(), 1u);
  EXPECT_TRUE(outside.exists("c/x.bin"));
}

}  // namespace
}  // namespace kvstore
