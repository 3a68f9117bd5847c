// analyze(): the state of a tree, per file and per overlay, read-only.
#include "state.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <set>

#include "engine.h"
#include "region.h"
#include "sentinel.h"
#include "text.h"
#include "test_util.h"

// gtest prints these by their output names in a failure.
namespace patcher {
void PrintTo(FileStatus s, std::ostream* os) { *os << file_status_name(s); }
void PrintTo(OverlayStatus s, std::ostream* os) { *os << overlay_status_name(s); }
void PrintTo(FileOverlayStatus s, std::ostream* os) { *os << file_overlay_status_name(s); }
}  // namespace patcher

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
  EXPECT_EQ(ts.overlay("example-cache")->state, OverlayStatus::Pristine);
  EXPECT_EQ(ts.overlay("example-cache-stats")->state, OverlayStatus::Pristine);
  EXPECT_EQ(ts.overlay("example-cache-stats")->superseded,
            std::vector<std::string>{"example/scheduler.py: dataclass-import"});
  EXPECT_EQ(ts.file("example/scheduler.py")->state, FileStatus::Pristine);
  EXPECT_EQ(ts.file("example/cache_hooks.py")->state, FileStatus::Absent);
  EXPECT_FALSE(ts.journal);
  EXPECT_TRUE(ts.leftovers.empty());
}

TEST(State, AppliedTree) {
  Fixture f;
  f.apply_all();
  TreeState ts = f.state();
  EXPECT_EQ(ts.overlay("example-cache")->state, OverlayStatus::Applied);
  EXPECT_EQ(ts.overlay("example-cache-stats")->state, OverlayStatus::Applied);
  EXPECT_EQ(ts.file("example/cache_hooks.py")->state, FileStatus::Present);
  for (const auto& fo : ts.file("example/scheduler.py")->overlays)
    for (const auto& e : fo.edits) EXPECT_NE(e.state, EditStatus::Missing) << fo.overlay << "/" << e.id;
}

// A new file deleted by hand after apply: the overlay is half-applied, and
// the problem names the file that lacks it and what to do.
TEST(State, HalfAppliedNamesTheFileThatLacksTheOverlay) {
  Fixture f;
  f.apply_all();
  ASSERT_EQ(::unlink(f.w.tree_file("example/cache_hooks.py").c_str()), 0);
  TreeState ts = f.state();
  const OverlayState* os = ts.overlay("example-cache");
  ASSERT_EQ(os->state, OverlayStatus::HalfApplied);
  ASSERT_FALSE(os->problems.empty());
  EXPECT_EQ(os->problems.front().rfind("example/cache_hooks.py: does not carry this overlay, which ", 0), 0u)
      << os->problems.front();
  EXPECT_NE(os->problems.front().find("reinstall the engine wheel"), std::string::npos);
}

// A hand edit in a region of the first overlay, below a region of the
// second: the problem gives the file's own line of that region's sentinel.
TEST(State, ATamperedRegionIsNamedByItsLineInTheFile) {
  Fixture f;
  f.apply_all();
  for (const char* rel : {"example/scheduler.py", "example/worker.py"}) {
    std::string path = f.w.tree_file(rel);
    Text text = split_lines(read_file(path));
    auto regions = parse_regions(text.lines, rel);
    ASSERT_TRUE(regions.ok());
    // The last region of example-cache with a region of example-cache-stats before it.
    const Region* target = nullptr;
    bool later_before = false;
    std::vector<Region> by_begin = *regions;
    std::sort(by_begin.begin(), by_begin.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
    for (const Region& r : by_begin) {
      if (r.overlay == "example-cache-stats") later_before = true;
      if (r.overlay == "example-cache" && later_before) target = &r;
    }
    if (!target) continue;
    text.lines[target->begin + 1] += "  # hand edit";
    write_file(path, join_lines(text));
    TreeState ts = f.state();
    const FileState* fs = ts.file(rel);
    ASSERT_EQ(fs->state, FileStatus::Tampered);
    EXPECT_EQ(fs->message.rfind("line " + std::to_string(target->begin + 1) + ": region example-cache/", 0), 0u)
        << fs->message;
    return;
  }
  GTEST_SKIP() << "no example-cache region below an example-cache-stats region in the example tree";
}

// A new file whose [[new_files]] entry was dropped from the manifest after
// apply: nothing would remove it, so status lists it and check fails.
TEST(State, AManagedFileNoManifestNamesIsAStray) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}).code, 0);
  write_file(w.tree_file("example/gone.py"),
             new_file_header("#", "example-cache", "0123456789abcdef") + "\nVALUE = 1\n");
  write_file(w.tree_file("example/notes.py"), "# an ordinary module\n");
  auto st = w.run({"status"});
  EXPECT_EQ(st.code, 0) << st.err;
  EXPECT_NE(st.out.find("stray overlay file example/gone.py: created by overlay example-cache"), std::string::npos)
      << st.out;
  EXPECT_EQ(st.out.find("example/notes.py"), std::string::npos) << st.out;
  auto r = w.run({"check"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("example/gone.py is a stray overlay file"), std::string::npos) << r.err;
}

// Issue 37: a transaction's own temps and saved old bytes carry the new-file
// header; status and check called them stray overlay files to delete by hand,
// and deleting them after the commit point makes the transaction
// unfinishable. They are leftovers, each with what the next command does.
TEST(State, APendingTransactionsOwnTempsAreLeftoversNotStrays) {
  struct Kill {
    const char* cmd;
    const char* fault;
    const char* file;  // a temp or saved copy of a new file, carrying its header
  };
  for (const Kill& k : {Kill{"apply", "journal-commit:1", "example/.cache_hooks.py.overlay-tmp"},
                        Kill{"apply", "rename:1", "example/.cache_hooks.py.overlay-tmp"},
                        Kill{"revert", "rename:1", "example/.cache_hooks.py.overlay-old"}}) {
    SCOPED_TRACE(std::string(k.cmd) + " " + k.fault);
    Workspace w;
    if (std::string(k.cmd) == "revert") {
      ASSERT_EQ(w.run({"apply"}).code, 0);
    }
    ASSERT_EQ(w.run({k.cmd}, {{"OVERLAY_FAULT", k.fault}}).code, 99);
    ASSERT_EQ(::access(w.tree_file(k.file).c_str(), F_OK), 0);
    auto st = w.run({"status"});
    EXPECT_EQ(st.code, 0) << st.err;
    EXPECT_EQ(st.out.find("stray"), std::string::npos) << st.out;
    EXPECT_EQ(st.out.find("by hand"), std::string::npos) << st.out;
    EXPECT_NE(st.out.find(std::string(k.file) + ": "), std::string::npos) << st.out;  // listed with its fate
    auto j = status_state(w.run({"status", "--json"}).out);
    EXPECT_TRUE(j["strays"].empty()) << j["strays"].dump();
    auto c = w.run({"check"});
    EXPECT_EQ(c.err.find("stray"), std::string::npos) << c.err;
    EXPECT_EQ(c.err.find("by hand"), std::string::npos) << c.err;
  }
}

TEST(State, EveryEditStatusHasOneName) {
  EXPECT_STREQ(edit_status_name(EditStatus::Applied), "applied");
  EXPECT_STREQ(edit_status_name(EditStatus::Missing), "missing");
  EXPECT_STREQ(edit_status_name(EditStatus::Superseded), "superseded");
}

// The names are the JSON format (docs/JSON.md): they must never change.
TEST(State, EveryFileStatusHasOneName) {
  const std::pair<FileStatus, std::string> all[] = {
      {FileStatus::Pristine, "pristine"}, {FileStatus::Applied, "applied"},   {FileStatus::Partial, "partial"},
      {FileStatus::Tampered, "tampered"}, {FileStatus::Stale, "stale"},       {FileStatus::Drift, "drift"},
      {FileStatus::Missing, "missing"},   {FileStatus::Absent, "absent"},     {FileStatus::Present, "present"},
      {FileStatus::BuildInput, "build-input"}};
  std::set<std::string> names;
  for (const auto& [s, name] : all) {
    EXPECT_EQ(file_status_name(s), name);
    names.insert(file_status_name(s));
  }
  EXPECT_EQ(names.size(), std::size(all));
}

TEST(State, EveryOverlayStatusHasOneName) {
  const std::pair<OverlayStatus, std::string> all[] = {
      {OverlayStatus::Pristine, "pristine"}, {OverlayStatus::Applied, "applied"},
      {OverlayStatus::HalfApplied, "half-applied"}, {OverlayStatus::Tampered, "tampered"},
      {OverlayStatus::Stale, "stale"},       {OverlayStatus::Drift, "drift"},
      {OverlayStatus::Superseded, "superseded"}, {OverlayStatus::Absent, "absent"}};
  std::set<std::string> names;
  for (const auto& [s, name] : all) {
    EXPECT_EQ(overlay_status_name(s), name);
    names.insert(overlay_status_name(s));
  }
  EXPECT_EQ(names.size(), std::size(all));
}

TEST(State, EveryFileOverlayStatusHasOneName) {
  EXPECT_STREQ(file_overlay_status_name(FileOverlayStatus::Pristine), "pristine");
  EXPECT_STREQ(file_overlay_status_name(FileOverlayStatus::Applied), "applied");
  EXPECT_STREQ(file_overlay_status_name(FileOverlayStatus::Partial), "partial");
  EXPECT_STREQ(file_overlay_status_name(FileOverlayStatus::Neutral), "neutral");
}

// Classification: each overlay's state in each file, on a pristine and an applied tree.
TEST(State, PerFileOverlayStatesFollowTheRegions) {
  Fixture f;
  TreeState before = f.state();  // named: a temporary would die before the loop reads it
  for (const auto& fo : before.file("example/scheduler.py")->overlays)
    EXPECT_EQ(fo.state, FileOverlayStatus::Pristine) << fo.overlay;
  f.apply_all();
  TreeState ts = f.state();
  EXPECT_EQ(ts.file("example/scheduler.py")->overlays.size(), 2u);
  for (const auto& fo : ts.file("example/scheduler.py")->overlays)
    EXPECT_EQ(fo.state, FileOverlayStatus::Applied) << fo.overlay;
  EXPECT_EQ(ts.file("example/scheduler.py")->applied,
            (std::vector<std::string>{"example-cache", "example-cache-stats"}));
}

TEST(State, AMissingRegionIsPartialAndHalfApplied) {
  Fixture f;
  f.apply_all();
  std::string p = f.w.tree_file("example/worker.py");
  std::string text = read_file(p);
  std::string region =
      "# >>> overlay example-cache/worker-import sha256=064866d7b60aaf7a\nfrom example import cache_hooks\n"
      "# <<< overlay example-cache/worker-import\n";
  ASSERT_NE(text.find(region), std::string::npos);
  write_file(p, text.replace(text.find(region), region.size(), ""));
  TreeState ts = f.state();
  const FileState* worker = ts.file("example/worker.py");
  EXPECT_EQ(worker->state, FileStatus::Partial);
  ASSERT_EQ(worker->overlays.size(), 1u);
  EXPECT_EQ(worker->overlays[0].state, FileOverlayStatus::Partial);
  EXPECT_EQ(ts.overlay("example-cache")->state, OverlayStatus::HalfApplied);
  EXPECT_EQ(ts.overlay("example-cache-stats")->state, OverlayStatus::Applied);
}

TEST(State, OneFileAppliedAndOnePristineIsHalfApplied) {
  Fixture f;
  std::string p = f.w.tree_file("example/worker.py");
  std::string pristine = read_file(p);
  f.apply_all();
  write_file(p, pristine);
  TreeState ts = f.state();
  EXPECT_EQ(ts.file("example/worker.py")->state, FileStatus::Pristine);
  EXPECT_EQ(ts.file("example/scheduler.py")->state, FileStatus::Applied);
  EXPECT_EQ(ts.overlay("example-cache")->state, OverlayStatus::HalfApplied);
}

TEST(State, AChangedOrMissingTargetIsDrift) {
  Fixture f;
  std::string p = f.w.tree_file("example/worker.py");
  std::string text = read_file(p);
  write_file(p, text.replace(text.find("32000"), 5, "32001"));
  TreeState ts = f.state();
  EXPECT_EQ(ts.file("example/worker.py")->state, FileStatus::Drift);
  EXPECT_EQ(ts.overlay("example-cache")->state, OverlayStatus::Drift);
  ASSERT_EQ(::unlink(p.c_str()), 0);
  ts = f.state();
  EXPECT_EQ(ts.file("example/worker.py")->state, FileStatus::Missing);
  EXPECT_EQ(ts.overlay("example-cache")->state, OverlayStatus::Drift);
}

TEST(State, AnEditOutsideTheRegionsIsTampered) {
  Fixture f;
  f.apply_all();
  std::string p = f.w.tree_file("example/worker.py");
  write_file(p, read_file(p) + "# by hand\n");
  TreeState ts = f.state();
  EXPECT_EQ(ts.file("example/worker.py")->state, FileStatus::Tampered);
  EXPECT_EQ(ts.overlay("example-cache")->state, OverlayStatus::Tampered);
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
  EXPECT_EQ(sched->state, FileStatus::Stale);
  EXPECT_EQ(sched->stale_overlays, std::vector<std::string>{"example-cache-stats"});
  EXPECT_EQ(ts.overlay("example-cache-stats")->state, OverlayStatus::Stale);
  EXPECT_EQ(ts.overlay("example-cache")->state, OverlayStatus::Applied);
}

}  // namespace
}  // namespace patcher::testing
