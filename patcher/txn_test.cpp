// Guarantee 2: all-or-nothing across files, crash-safe. The CLI is killed
// (OVERLAY_FAULT=<step>:<n>, which _exits as a kill would) at EVERY step a
// write passes through; after each kill `status` must report exactly what is
// on disk, and apply must converge to the applied tree, revert to the
// pristine one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <set>

#include "test_util.h"

namespace patcher::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kKilled = 99;

using Step = FaultStep;

std::vector<Step> steps_of(const Workspace& w, const std::vector<std::string>& args) { return fault_steps(w, args); }

struct Reference {
  Snapshot pristine, applied;
};

const Reference& reference() {
  static Reference ref = [] {
    Reference r;
    Workspace w;
    r.pristine = snapshot(w.tree);
    auto a = w.run({"apply"});
    EXPECT_EQ(a.code, 0) << a.err;
    r.applied = snapshot(w.tree);
    return r;
  }();
  return ref;
}

bool exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

// Status must describe the bytes on disk exactly.
void expect_status_exact(const Workspace& w, const std::string& ctx) {
  const Reference& ref = reference();
  auto r = w.run({"status", "--json"});
  ASSERT_EQ(r.code, 0) << ctx << r.err;
  auto st = status_state(r.out);
  std::map<std::string, std::string> file_states;
  for (const auto& f : st["files"]) {
    std::string path = f["path"];
    std::string p = w.tree_file(path);
    std::string want;
    if (!exists(p)) {
      want = "absent";
    } else {
      std::string bytes = read_file(p);
      if (ref.pristine.count(path) && bytes == ref.pristine.at(path).bytes) want = "pristine";
      else if (bytes == ref.applied.at(path).bytes) want = f["new_file"] ? "present" : "applied";
      else want = "unexpected bytes";
    }
    EXPECT_EQ(f["state"], want) << ctx << " " << path;
    file_states[path] = want;
  }
  EXPECT_EQ(st["journal"].get<bool>(), exists(w.tree + "/.overlay-journal")) << ctx;
  std::set<std::string> temps_on_disk, temps_reported;
  for (const auto& [path, e] : snapshot(w.tree))
    if (path.size() > 12 && path.substr(path.size() - 12) == ".overlay-tmp") temps_on_disk.insert(path);
  for (const auto& t : st["stray_temps"]) temps_reported.insert(t);
  EXPECT_EQ(temps_on_disk, temps_reported) << ctx;
  auto on = [&](const std::string& p) { return file_states[p] == "applied" || file_states[p] == "present"; };
  std::map<std::string, std::vector<std::string>> files_of = {
      {"example-cache", {"example/scheduler.py", "example/worker.py", "example/cache_hooks.py"}},
      {"example-cache-stats", {"example/scheduler.py", "example/cache_stats.py"}}};
  for (const auto& o : st["overlays"]) {
    int n_on = 0;
    for (const auto& p : files_of[o["name"]]) n_on += on(p);
    std::string want = n_on == 0 ? "pristine" : n_on == static_cast<int>(files_of[o["name"]].size()) ? "applied" : "half-applied";
    EXPECT_EQ(o["state"], want) << ctx << " " << o["name"];
  }
}

TEST(Guarantee2CrashSafety, KillAtEveryApplyStepThenStatusIsExactAndBothWaysConverge) {
  const Reference& ref = reference();
  Workspace probe;
  auto steps = steps_of(probe, {"apply"});
  std::set<std::string> names;
  for (const auto& s : steps) names.insert(s.name);
  // The write path must pass through every named step, or the hook is stale.
  for (const char* must : {"temp-create", "temp-write", "temp-fsync", "dir-fsync", "journal-write",
                           "journal-write-partial", "journal-commit", "rename", "journal-remove"})
    EXPECT_TRUE(names.count(must)) << must;
  for (const auto& s : steps) {
    for (bool then_apply : {true, false}) {
      Workspace w;
      auto r = w.run({"apply"}, {{"OVERLAY_FAULT", s.spec()}});
      ASSERT_EQ(r.code, kKilled) << s.spec() << r.err;
      expect_status_exact(w, "after kill at " + s.spec());
      auto fix = w.run({then_apply ? "apply" : "revert"});
      ASSERT_EQ(fix.code, 0) << s.spec() << fix.err;
      EXPECT_EQ(diff_bytes(then_apply ? ref.applied : ref.pristine, snapshot(w.tree)), "") << s.spec();
      EXPECT_EQ(w.run({"check", "--expect", then_apply ? "applied" : "pristine"}).code, 0) << s.spec();
    }
  }
}

TEST(Guarantee2CrashSafety, KillAtEveryRevertStepThenStatusIsExactAndBothWaysConverge) {
  const Reference& ref = reference();
  Workspace probe;
  ASSERT_EQ(probe.run({"apply"}).code, 0);
  auto steps = steps_of(probe, {"revert"});
  ASSERT_GT(steps.size(), 10u);
  for (const auto& s : steps) {
    for (bool then_revert : {true, false}) {
      Workspace w;
      ASSERT_EQ(w.run({"apply"}).code, 0);
      auto r = w.run({"revert"}, {{"OVERLAY_FAULT", s.spec()}});
      ASSERT_EQ(r.code, kKilled) << s.spec() << r.err;
      expect_status_exact(w, "after kill at " + s.spec());
      auto fix = w.run({then_revert ? "revert" : "apply"});
      ASSERT_EQ(fix.code, 0) << s.spec() << fix.err;
      EXPECT_EQ(diff_bytes(then_revert ? ref.pristine : ref.applied, snapshot(w.tree)), "") << s.spec();
    }
  }
}

TEST(Guarantee2CrashSafety, KillDuringRecoveryThenConverges) {
  const Reference& ref = reference();
  // Kill after the journal committed and one file was renamed.
  auto broken = [](Workspace& w) {
    auto r = w.run({"apply"}, {{"OVERLAY_FAULT", "rename:2"}});
    ASSERT_EQ(r.code, kKilled);
    ASSERT_TRUE(exists(w.tree + "/.overlay-journal"));
  };
  Workspace probe;
  broken(probe);
  auto steps = steps_of(probe, {"apply"});
  std::set<std::string> names;
  for (const auto& s : steps) names.insert(s.name);
  EXPECT_TRUE(names.count("recover-rename"));
  EXPECT_TRUE(names.count("recover-journal-remove"));
  for (const auto& s : steps) {
    Workspace w;
    broken(w);
    auto r = w.run({"apply"}, {{"OVERLAY_FAULT", s.spec()}});
    ASSERT_EQ(r.code, kKilled) << s.spec();
    expect_status_exact(w, "after recovery kill at " + s.spec());
    ASSERT_EQ(w.run({"apply"}).code, 0) << s.spec();
    EXPECT_EQ(diff_bytes(ref.applied, snapshot(w.tree)), "") << s.spec();
  }
}

TEST(Guarantee2CrashSafety, CheckRefusesWhileAJournalIsPending) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}, {{"OVERLAY_FAULT", "rename:1"}}).code, kKilled);
  auto before = snapshot(w.tree);
  auto r = w.run({"check"});
  EXPECT_EQ(r.code, 4);
  EXPECT_THAT(r.err, HasSubstr("interrupted transaction"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");  // check is read-only
}

TEST(Guarantee2CrashSafety, DiskFullWhileWritingTempsLeavesTreeUntouched) {
  Workspace w;
  auto before = snapshot(w.tree);
  auto r = w.run({"apply"}, {{"OVERLAY_FAULT", "ENOSPC@temp-write:3"}});
  EXPECT_EQ(r.code, 6);
  EXPECT_THAT(r.err, HasSubstr("No space left on device"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree), /*dir_mtimes=*/false), "");
}

TEST(Guarantee2CrashSafety, IoErrorAfterCommitKeepsJournalAndNextRunFinishes) {
  const Reference& ref = reference();
  Workspace w;
  auto r = w.run({"apply"}, {{"OVERLAY_FAULT", "EIO@rename:2"}});
  EXPECT_EQ(r.code, 6);
  EXPECT_THAT(r.err, HasSubstr("journal kept"));
  expect_status_exact(w, "after EIO at rename:2");
  ASSERT_EQ(w.run({"apply"}).code, 0);
  EXPECT_EQ(diff_bytes(ref.applied, snapshot(w.tree)), "");
}

TEST(Guarantee2CrashSafety, StrayTempWithoutJournalIsRemovedNotUsed) {
  const Reference& ref = reference();
  Workspace w;
  write_file(w.tree + "/example/.worker.py.overlay-tmp", "garbage from a dead run\n");
  auto st = w.run({"status"});
  EXPECT_THAT(st.out, HasSubstr("leftover temp example/.worker.py.overlay-tmp: from a transaction that never committed"));
  ASSERT_EQ(w.run({"apply"}).code, 0);
  EXPECT_EQ(diff_bytes(ref.applied, snapshot(w.tree)), "");
}

TEST(Guarantee2CrashSafety, SecondConcurrentWriterIsRefused) {
  Workspace w;
  int fd = ::open(w.tree.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // as a running apply would hold it
  auto before = snapshot(w.tree);
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 7);  // busy
  EXPECT_THAT(r.err, HasSubstr("another overlay apply/revert/recover is running"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
  ::close(fd);
  EXPECT_EQ(w.run({"apply"}).code, 0);
}

}  // namespace
}  // namespace patcher::testing
