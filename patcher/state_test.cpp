// analyze(): the state of a tree, per file and per overlay, read-only.
#include "state.h"

#include <gtest/gtest.h>

#include "engine.h"
#include "test_util.h"

namespace patcher::testing {
namespace {

struct Fixture {
  Workspace w;
  ManifestSet set;
  Tree tree;
  Fixture() {
    auto s = load_manifests(w.manifests, w.overlays);
    EXPECT_TRUE(s.ok());
    set = std::move(*s);
    auto t = Tree::open(w.tree);
    EXPECT_TRUE(t.ok());
    tree = std::move(*t);
  }
  TreeState state() {
    auto ts = analyze(tree, set);
    EXPECT_TRUE(ts.ok()) << ts.error().line();
    return *ts;
  }
  void apply_all() {
    Session s{std::move(tree), set, ""};
    ASSERT_TRUE(apply(s, Request{}).ok());
    tree = std::move(s.tree);
  }
};

TEST(State, PristineTreeWithASupersededEdit) {
  Fixture f;
  TreeState ts = f.state();
  EXPECT_EQ(ts.overlay("example-cache")->state, "pristine");
  EXPECT_EQ(ts.overlay("example-cache-stats")->state, "pristine");
  EXPECT_EQ(ts.overlay("example-cache-stats")->superseded,
            std::vector<std::string>{"example/scheduler.py: dataclass-import"});
  EXPECT_EQ(ts.file("example/scheduler.py")->state, "pristine");
  EXPECT_EQ(ts.file("example/cache_hooks.py")->state, "absent");
  EXPECT_FALSE(ts.journal);
  EXPECT_TRUE(ts.leftovers.empty());
}

TEST(State, AppliedTree) {
  Fixture f;
  f.apply_all();
  TreeState ts = f.state();
  EXPECT_EQ(ts.overlay("example-cache")->state, "applied");
  EXPECT_EQ(ts.overlay("example-cache-stats")->state, "applied");
  EXPECT_EQ(ts.file("example/cache_hooks.py")->state, "present");
  for (const auto& fo : ts.file("example/scheduler.py")->overlays)
    for (const auto& e : fo.edits) EXPECT_NE(e.state, EditStatus::Missing) << fo.overlay << "/" << e.id;
}

TEST(State, EveryEditStatusHasOneName) {
  EXPECT_STREQ(edit_status_name(EditStatus::Applied), "applied");
  EXPECT_STREQ(edit_status_name(EditStatus::Missing), "missing");
  EXPECT_STREQ(edit_status_name(EditStatus::Superseded), "superseded");
}

TEST(State, AnEditOutsideTheRegionsIsTampered) {
  Fixture f;
  f.apply_all();
  std::string p = f.w.tree_file("example/worker.py");
  write_file(p, read_file(p) + "# by hand\n");
  TreeState ts = f.state();
  EXPECT_EQ(ts.file("example/worker.py")->state, "tampered");
  EXPECT_EQ(ts.overlay("example-cache")->state, "tampered");
}

TEST(State, StalenessIsPerOverlay) {
  Fixture f;
  f.apply_all();
  // example-cache-stats's fragment changes after the apply.
  std::string frag = f.w.overlays + "/example-cache-stats/count_hit.py";
  write_file(frag, read_file(frag) + "pass\n");
  auto set = load_manifests(f.w.manifests, f.w.overlays);
  ASSERT_TRUE(set.ok());
  f.set = std::move(*set);
  TreeState ts = f.state();
  const FileState* sched = ts.file("example/scheduler.py");
  EXPECT_EQ(sched->state, "stale");
  EXPECT_EQ(sched->stale_overlays, std::vector<std::string>{"example-cache-stats"});
  EXPECT_EQ(ts.overlay("example-cache-stats")->state, "stale");
  EXPECT_EQ(ts.overlay("example-cache")->state, "applied");
}

}  // namespace
}  // namespace patcher::testing
