// New files whose folder does not exist yet: the folder is built whole inside
// the transaction (staged under a temp name, renamed into place after the
// commit point), recorded in the journal, and removed again by revert when the
// engine created it and nothing else is in it. A kill at every step of apply
// and of revert must leave a tree that status describes and that both apply
// and revert bring to a known state.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace patcher::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kKilled = 99;

// example-cache gains a package two folders deep (example/plugins/cache/)
// with two modules, and a module in an existing folder.
void add_package(const Workspace& w) {
  std::string toml = read_file(w.manifests + "/example-cache.toml");
  toml += R"(
[[new_files]]
path = "example/plugins/cache/__init__.py"
source = "pkg_init.py"

[[new_files]]
path = "example/plugins/cache/store.py"
source = "pkg_store.py"
)";
  write_file(w.manifests + "/example-cache.toml", toml);
  write_file(w.overlays + "/example-cache/pkg_init.py", "from example.plugins.cache.store import Store\n");
  write_file(w.overlays + "/example-cache/pkg_store.py", "class Store:\n    pass\n");
}

bool exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

struct Ref {
  Snapshot pristine, applied;
};

const Ref& ref() {
  static Ref r = [] {
    Ref x;
    Workspace w;
    add_package(w);
    x.pristine = snapshot(w.tree);
    auto a = w.run({"apply"});
    EXPECT_EQ(a.code, 0) << a.err;
    x.applied = snapshot(w.tree);
    return x;
  }();
  return r;
}

// Status must read the tree (exit 0) and report each new file as it is on disk.
void expect_status_matches_disk(const Workspace& w, const std::string& ctx) {
  auto r = w.run({"status", "--json"});
  ASSERT_EQ(r.code, 0) << ctx << r.err;
  auto st = status_state(r.out);
  for (const auto& f : st["files"]) {
    if (!f["new_file"].get<bool>()) continue;
    std::string path = f["path"];
    EXPECT_EQ(f["state"], exists(w.tree_file(path)) ? "present" : "absent") << ctx << " " << path;
  }
  EXPECT_EQ(st["journal"].get<bool>(), exists(w.tree + "/.overlay-journal")) << ctx;
  // Every leftover on disk is reported.
  std::set<std::string> reported;
  for (const auto& l : st["leftovers"]) reported.insert(l["path"].get<std::string>());
  for (const char* p : {"example/.plugins.overlay-tmp", ".overlay-journal", ".overlay-journal.tmp"})
    if (exists(w.tree_file(p))) {
      EXPECT_TRUE(reported.count(p)) << ctx << " " << p;
    }
}

TEST(NewFolder, ApplyCreatesTheFolderWithItsMarkerAndRevertRemovesIt) {
  Workspace w;
  add_package(w);
  auto before = snapshot(w.tree);
  auto plan = w.run({"plan"});
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("would mkdir example/plugins"));
  auto a = w.run({"apply", "--check-injected"});
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_TRUE(exists(w.tree_file("example/plugins/.overlay-dir")));
  EXPECT_TRUE(exists(w.tree_file("example/plugins/cache/.overlay-dir")));
  EXPECT_THAT(read_file(w.tree_file("example/plugins/cache/store.py")), HasSubstr("class Store:"));
  EXPECT_FALSE(exists(w.tree_file("example/.plugins.overlay-tmp")));
  EXPECT_EQ(w.run({"check"}).code, 0);
  auto r = w.run({"revert"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("did rmdir example/plugins/cache"));
  EXPECT_THAT(r.out, HasSubstr("did rmdir example/plugins\n"));
  EXPECT_EQ(diff_bytes(before, snapshot(w.tree)), "");
  EXPECT_EQ(w.run({"check", "--expect", "pristine"}).code, 0);
}

TEST(NewFolder, RevertKeepsAFolderHoldingSomethingElse) {
  Workspace w;
  add_package(w);
  ASSERT_EQ(w.run({"apply"}).code, 0);
  write_file(w.tree_file("example/plugins/cache/notes.txt"), "mine\n");
  auto r = w.run({"revert"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_file(w.tree_file("example/plugins/cache/notes.txt")), "mine\n");
  EXPECT_FALSE(exists(w.tree_file("example/plugins/cache/store.py")));
  EXPECT_TRUE(exists(w.tree_file("example/plugins/cache/.overlay-dir")));  // still the engine's folder
  // Once the user's file is gone, the next revert (nothing else to do) leaves it; apply then revert removes it.
  ::unlink(w.tree_file("example/plugins/cache/notes.txt").c_str());
  ASSERT_EQ(w.run({"apply"}).code, 0);
  ASSERT_EQ(w.run({"revert"}).code, 0);
  EXPECT_FALSE(exists(w.tree_file("example/plugins")));
}

TEST(NewFolder, RevertNeverRemovesAFolderItDidNotCreate) {
  Workspace w;
  add_package(w);
  // The folder exists before the apply (an empty one the user made): the
  // engine only adds files to it, and revert leaves it.
  ASSERT_EQ(::mkdir(w.tree_file("example/plugins").c_str(), 0755), 0);
  ASSERT_EQ(w.run({"apply"}).code, 0);
  EXPECT_FALSE(exists(w.tree_file("example/plugins/.overlay-dir")));
  EXPECT_TRUE(exists(w.tree_file("example/plugins/cache/.overlay-dir")));
  ASSERT_EQ(w.run({"revert"}).code, 0);
  EXPECT_TRUE(exists(w.tree_file("example/plugins")));
  EXPECT_FALSE(exists(w.tree_file("example/plugins/cache")));
}

TEST(NewFolder, AFileInTheWayIsBadInput) {
  Workspace w;
  add_package(w);
  write_file(w.tree_file("example/plugins"), "a file, not a folder\n");
  auto before = snapshot(w.tree);
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
}

TEST(NewFolder, KillAtEveryApplyStepThenBothWaysConverge) {
  const Ref& R = ref();
  Workspace probe;
  add_package(probe);
  auto steps = fault_steps(probe, {"apply"});
  std::set<std::string> names;
  for (const auto& s : steps) names.insert(s.name);
  EXPECT_TRUE(names.count("mkdir"));
  EXPECT_TRUE(names.count("marker-write"));
  for (const auto& s : steps) {
    for (bool then_apply : {true, false}) {
      Workspace w;
      add_package(w);
      auto r = w.run({"apply"}, {{"OVERLAY_FAULT", s.spec()}});
      ASSERT_EQ(r.code, kKilled) << s.spec() << r.err;
      expect_status_matches_disk(w, "after kill at " + s.spec());
      auto fix = w.run({then_apply ? "apply" : "revert"});
      ASSERT_EQ(fix.code, 0) << s.spec() << fix.err;
      EXPECT_EQ(diff_bytes(then_apply ? R.applied : R.pristine, snapshot(w.tree)), "") << s.spec();
    }
  }
}

TEST(NewFolder, KillAtEveryRevertStepThenBothWaysConverge) {
  const Ref& R = ref();
  Workspace probe;
  add_package(probe);
  ASSERT_EQ(probe.run({"apply"}).code, 0);
  auto steps = fault_steps(probe, {"revert"});
  std::set<std::string> names;
  for (const auto& s : steps) names.insert(s.name);
  EXPECT_TRUE(names.count("rmdir"));
  for (const auto& s : steps) {
    for (bool then_revert : {true, false}) {
      Workspace w;
      add_package(w);
      ASSERT_EQ(w.run({"apply"}).code, 0);
      auto r = w.run({"revert"}, {{"OVERLAY_FAULT", s.spec()}});
      ASSERT_EQ(r.code, kKilled) << s.spec() << r.err;
      expect_status_matches_disk(w, "after kill at " + s.spec());
      auto fix = w.run({then_revert ? "revert" : "apply"});
      ASSERT_EQ(fix.code, 0) << s.spec() << fix.err;
      EXPECT_EQ(diff_bytes(then_revert ? R.pristine : R.applied, snapshot(w.tree)), "") << s.spec();
    }
  }
}

TEST(NewFolder, DiscardAfterAKillPastTheCommitPointRemovesTheNewFolder) {
  const Ref& R = ref();
  Workspace w;
  add_package(w);
  ASSERT_EQ(w.run({"apply"}, {{"OVERLAY_FAULT", "rename:2"}}).code, kKilled);
  ASSERT_TRUE(exists(w.tree + "/.overlay-journal"));
  auto d = w.run({"recover", "--discard"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(diff_bytes(R.pristine, snapshot(w.tree)), "") << d.out;
}

}  // namespace
}  // namespace patcher::testing
