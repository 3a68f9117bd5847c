// Guarantees 1, 3, 4, 5 and 6, and the states, through the `overlay` CLI run
// as a subprocess on a scratch copy of the example tree.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace patcher::testing {
namespace {

using ::testing::HasSubstr;

const char* kSched = "example/scheduler.py";
const char* kWorker = "example/worker.py";
const char* kSchedPin = "cbfa95d6cee05a1fc649a57530c1bdaa2fb90eccb5380ac818e436f6e991e5a7";
const char* kWorkerPin = "decf892c294e627cbfa98f297cf8d7579ba8c0e5fc3f7ddc9d52602f42de0399";

int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

void replace_in(const std::string& path, const std::string& from, const std::string& to) {
  std::string t = read_file(path);
  size_t p = t.find(from);
  ASSERT_NE(p, std::string::npos) << from;
  t.replace(p, from.size(), to);
  write_file(path, t);
}

nlohmann::json status_json(const Workspace& w) {
  auto r = w.run({"status", "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
  return nlohmann::json::parse(r.out)["state"];  // every command: {..., "state": {...}}
}

std::string overlay_state(const nlohmann::json& st, const std::string& name) {
  for (const auto& o : st["overlays"])
    if (o["name"] == name) return o["state"];
  return "?";
}

std::string file_state(const nlohmann::json& st, const std::string& path) {
  for (const auto& f : st["files"])
    if (f["path"] == path) return f["state"];
  return "?";
}

TEST(Cli, ApplyCheckRevertRoundTrip) {
  Workspace w;
  auto pristine = snapshot(w.tree);
  EXPECT_EQ(w.run({"check", "--expect", "pristine"}).code, 0);
  EXPECT_EQ(w.run({"check"}).code, 1);  // consistent, but not applied
  auto r = w.run({"apply"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(w.run({"check"}).code, 0);
  EXPECT_EQ(w.run({"check", "--expect", "pristine"}).code, 1);
  auto st = status_json(w);
  EXPECT_EQ(overlay_state(st, "example-cache"), "applied");
  EXPECT_EQ(overlay_state(st, "example-cache-stats"), "applied");
  EXPECT_EQ(file_state(st, "example/cache_hooks.py"), "present");
  r = w.run({"revert"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(diff_bytes(pristine, snapshot(w.tree)), "");
}

// Guarantee 1: every anchor of every file resolves before the first write.
TEST(Guarantee1Preflight, AnchorFailureInLastFileWritesNothing) {
  Workspace w;
  // worker.py comes after scheduler.py, whose anchors still match.
  replace_in(w.tree_file(kWorker), "        return tokens", "        return list(tokens)");
  replace_in(w.manifests + "/example-cache.toml", "decf892c294e627cbfa98f297cf8d7579ba8c0e5fc3f7ddc9d52602f42de0399",
             sha256_file(w.tree_file(kWorker)));
  replace_in(w.manifests + "/example-cache.toml", "        tokens = [hash(word)", "        tokens = [hush(word)");
  auto before = snapshot(w.tree);
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("example/worker.py"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
}

TEST(Guarantee1Preflight, CompileFailureWritesNothing) {
  Workspace w;
  write_file(w.overlays + "/example-cache-stats/count_hit.py", "cache_stats.record_hit(\n");
  auto before = snapshot(w.tree);
  auto r = w.run({"apply", "--check-injected"});
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
}

TEST(Guarantee1Preflight, DriftInOneOverlayBlocksTheOtherToo) {
  Workspace w;
  replace_in(w.tree_file(kSched), "        return batch\n", "        return list(batch)\n");
  auto before = snapshot(w.tree);
  EXPECT_EQ(w.run({"apply"}).code, 3);
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
}

// Guarantee 3: idempotent.
TEST(Guarantee3Idempotent, SecondApplyWritesNothingAndExitsZero) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}).code, 0);
  auto applied = snapshot(w.tree);
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("nothing to do"));
  EXPECT_EQ(diff_snapshots(applied, snapshot(w.tree)), "");
}

TEST(Guarantee3Idempotent, NoSequenceOfAppliesDuplicatesARegion) {
  Workspace w;
  for (auto args : std::vector<std::vector<std::string>>{{"apply", "--overlays", "example-cache"},
                                                          {"apply", "--overlays", "example-cache"},
                                                          {"apply"},
                                                          {"apply", "--overlays", "example-cache-stats"},
                                                          {"apply"}}) {
    auto r = w.run(args);
    ASSERT_EQ(r.code, 0) << r.err;
  }
  std::string s = read_file(w.tree_file(kSched));
  EXPECT_EQ(count(s, ">>> overlay example-cache/lookup"), 1);
  EXPECT_EQ(count(s, ">>> overlay example-cache-stats/count-hit"), 1);
  EXPECT_EQ(count(s, "from example import cache_hooks"), 1);
  EXPECT_EQ(count(read_file(w.tree_file(kWorker)), ">>> overlay"), 2);
}

// Guarantee 4: layering.
TEST(Guarantee4Layering, LaterOverlayAnchorsInsideEarlierRegion) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}).code, 0);
  std::string s = read_file(w.tree_file(kSched));
  size_t outer = s.find(">>> overlay example-cache/import-cache");
  size_t inner = s.find(">>> overlay example-cache-stats/stats-import");
  size_t outer_end = s.find("<<< overlay example-cache/import-cache");
  ASSERT_NE(inner, std::string::npos);
  EXPECT_LT(outer, inner);
  EXPECT_LT(inner, outer_end);
}

TEST(Guarantee4Layering, RevertLaterLeavesEarlierApplied) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}).code, 0);
  auto r = w.run({"revert", "--overlays", "example-cache-stats"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(w.run({"check", "--overlays", "example-cache"}).code, 0);
  EXPECT_EQ(w.run({"check", "--overlays", "example-cache-stats", "--expect", "pristine"}).code, 0);
  EXPECT_EQ(count(read_file(w.tree_file(kSched)), "example-cache-stats"), 0);
}

TEST(Guarantee4Layering, RevertEarlierWhileLaterAppliedIsRefused) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}).code, 0);
  auto before = snapshot(w.tree);
  auto r = w.run({"revert", "--overlays", "example-cache"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("cannot revert example-cache"));
  EXPECT_THAT(r.err, HasSubstr("example-cache-stats"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
}

TEST(Guarantee4Layering, ApplyOrderFollowsAfter) {
  Workspace w;
  auto before = snapshot(w.tree);
  auto r = w.run({"apply", "--overlays", "example-cache-stats"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("apply example-cache first"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
  // Named in either order, they apply in `after` order.
  r = w.run({"apply", "--overlays", "example-cache-stats,example-cache"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(w.run({"check"}).code, 0);
}

// Guarantee 5: revert restores the pinned bytes exactly.
TEST(Guarantee5Revert, ShaEqualsPinAndNewFilesAreGone) {
  Workspace w;
  chmod(w.tree_file(kWorker).c_str(), 0640);
  ASSERT_EQ(w.run({"apply"}).code, 0);
  struct stat st {};
  stat(w.tree_file(kWorker).c_str(), &st);
  EXPECT_EQ(st.st_mode & 07777, 0640u);  // mode kept through apply
  ASSERT_EQ(w.run({"revert"}).code, 0);
  EXPECT_EQ(sha256_file(w.tree_file(kSched)), kSchedPin);
  EXPECT_EQ(sha256_file(w.tree_file(kWorker)), kWorkerPin);
  stat(w.tree_file(kWorker).c_str(), &st);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_NE(::access(w.tree_file("example/cache_hooks.py").c_str(), F_OK), 0);
  EXPECT_NE(::access(w.tree_file("example/cache_stats.py").c_str(), F_OK), 0);
}

TEST(Guarantee5Revert, OwnerIsKept) {
  if (geteuid() != 0) GTEST_SKIP() << "changing owners needs root";
  Workspace w;
  ASSERT_EQ(chown(w.tree_file(kWorker).c_str(), 1234, 4321), 0);
  ASSERT_EQ(w.run({"apply"}).code, 0);
  struct stat st {};
  stat(w.tree_file(kWorker).c_str(), &st);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_gid, 4321u);
}

// Guarantee 6: drift report.
TEST(Guarantee6Drift, NearestLinesScoreAndUnifiedDiff) {
  Workspace w;
  replace_in(w.tree_file(kWorker), "        tokens = [hash(word) % self.vocab_size for word in prompt.split()]",
             "        tokens = [hash(w) % self.vocab_size for w in prompt.split()]");
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("example/worker.py: drift"));
  EXPECT_THAT(r.err, HasSubstr("remember"));
  EXPECT_THAT(r.err, HasSubstr("nearest lines (similarity)"));
  EXPECT_THAT(r.err, ::testing::ContainsRegex("line 9 0\\.[89][0-9]:"));
  EXPECT_THAT(r.err, HasSubstr("-        tokens = [hash(word) % self.vocab_size for word in prompt.split()]"));
  EXPECT_THAT(r.err, HasSubstr("+        tokens = [hash(w) % self.vocab_size for w in prompt.split()]"));
  EXPECT_THAT(r.err, HasSubstr("@@ -1,1 +9,1 @@"));
  // status shows the same report and the drift state.
  auto st = status_json(w);
  EXPECT_EQ(file_state(st, kWorker), "drift");
  EXPECT_EQ(overlay_state(st, "example-cache"), "drift");
}

TEST(Guarantee6Drift, AnchorFoundTooOftenListsWhere) {
  Workspace w;
  replace_in(w.tree_file(kWorker), "        return tokens\n",
             "        return tokens\n\n    def again(self, prompt: str) -> list[int]:\n"
             "        tokens = [hash(word) % self.vocab_size for word in prompt.split()]\n        return tokens\n");
  replace_in(w.manifests + "/example-cache.toml", "  scope = \"class Worker/def run\"\n", "");
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("found 2 times, expected 1"));
  EXPECT_THAT(r.err, HasSubstr("found at line 9, line 13"));
}

TEST(Guarantee6Drift, MissingScopeShowsNearestHeaders) {
  Workspace w;
  replace_in(w.tree_file(kSched), "    def schedule(", "    def schedule_batch(");
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("scope \"class Scheduler/def schedule\": \"def schedule\" found 0 times"));
  EXPECT_THAT(r.err, HasSubstr("def schedule_batch("));
}

// States.
TEST(States, RegionEditedByHandIsTampered) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}).code, 0);
  replace_in(w.tree_file(kWorker), "        cache_hooks.remember(prompt, tokens)", "        cache_hooks.remember(prompt, [])");
  auto st = status_json(w);
  EXPECT_EQ(file_state(st, kWorker), "tampered");
  EXPECT_EQ(overlay_state(st, "example-cache"), "tampered");
  auto before = snapshot(w.tree);
  auto c = w.run({"check"});
  EXPECT_EQ(c.code, 4);
  EXPECT_THAT(c.err, HasSubstr("example/worker.py"));
  EXPECT_THAT(c.err, HasSubstr("edited by hand"));
  EXPECT_EQ(w.run({"apply"}).code, 4);
  EXPECT_EQ(w.run({"revert"}).code, 4);
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
}

TEST(States, TextOutsideRegionsEditedIsTampered) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}).code, 0);
  replace_in(w.tree_file(kWorker), "vocab_size: int = 32000", "vocab_size: int = 64000");
  EXPECT_EQ(file_state(status_json(w), kWorker), "tampered");
  EXPECT_EQ(w.run({"check"}).code, 4);
}

TEST(States, MissingRegionIsHalfAppliedNotPristine) {
  Workspace w;
  ASSERT_EQ(w.run({"apply", "--overlays", "example-cache"}).code, 0);
  // Remove one region by hand: the anchor is back, but the overlay is half there.
  replace_in(w.tree_file(kWorker),
             "# >>> overlay example-cache/worker-import sha256=064866d7b60aaf7a\nfrom example import cache_hooks\n"
             "# <<< overlay example-cache/worker-import\n",
             "");
  auto st = status_json(w);
  EXPECT_EQ(overlay_state(st, "example-cache"), "half-applied");
  auto before = snapshot(w.tree);
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 4);
  EXPECT_THAT(r.err, HasSubstr("half-applied"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
}

TEST(States, OneFileAppliedOtherPristineIsHalfApplied) {
  Workspace w;
  auto pristine_worker = read_file(w.tree_file(kWorker));
  ASSERT_EQ(w.run({"apply", "--overlays", "example-cache"}).code, 0);
  write_file(w.tree_file(kWorker), pristine_worker);
  auto st = status_json(w);
  EXPECT_EQ(file_state(st, kWorker), "pristine");
  EXPECT_EQ(file_state(st, kSched), "applied");
  EXPECT_EQ(overlay_state(st, "example-cache"), "half-applied");
  EXPECT_EQ(w.run({"check"}).code, 4);
}

TEST(States, SupersededEditIsReportedAndNeverApplied) {
  Workspace w;
  auto st = status_json(w);
  bool seen = false;
  for (const auto& f : st["files"])
    for (const auto& o : f["overlays"])
      for (const auto& e : o["edits"])
        if (e["id"] == "dataclass-import") {
          EXPECT_EQ(e["state"], "superseded");
          seen = true;
        }
  EXPECT_TRUE(seen);
  ASSERT_EQ(w.run({"apply"}).code, 0);
  EXPECT_EQ(count(read_file(w.tree_file(kSched)), "dataclass-import"), 0);
  EXPECT_EQ(overlay_state(status_json(w), "example-cache-stats"), "applied");
}

TEST(States, PristineWithShaMismatchIsDrift) {
  Workspace w;
  replace_in(w.tree_file(kWorker), "32000", "32001");
  auto st = status_json(w);
  EXPECT_EQ(file_state(st, kWorker), "drift");
  auto r = w.run({"check"});
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("differs from the pin"));
}

TEST(CheckInjected, SyntaxErrorNamesFileLineAndRegion) {
  Workspace w;
  // indent = 0 puts the lookup body at the `for` statement's level.
  replace_in(w.manifests + "/example-cache.toml", "  indent = 4\n", "  indent = 0\n");
  auto r = w.run({"apply", "--check-injected", "--overlays", "example-cache"});
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_THAT(r.err, ::testing::ContainsRegex("example/scheduler.py:[0-9]+"));
  EXPECT_THAT(r.err, HasSubstr("(in region example-cache/lookup)"));
}

TEST(CheckInjected, CleanTreeCompilesInOneProcess) {
  Workspace w;
  auto r = w.run({"apply", "--check-injected"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("compiled 13 files and fragments: ok"));
  r = w.run({"check", "--check-injected"});
  EXPECT_EQ(r.code, 0) << r.err;
  auto bad = w.run({"check", "--check-injected", "--python", "/nonexistent/python"});
  EXPECT_EQ(bad.code, 2);
}

TEST(CheckInjected, BrokenFragmentIsReportedAsFragment) {
  Workspace w;
  write_file(w.overlays + "/example-cache/cache_hooks.py", "def lookup(prompt:\n    pass\n");
  auto r = w.run({"apply", "--check-injected"});
  EXPECT_EQ(r.code, 5);
  EXPECT_THAT(r.err, HasSubstr("cache_hooks.py:1"));
}

TEST(Cli, DefaultManifestsFromEngineVersion) {
  Workspace w;
  // No --manifests: the anchors folder beside the binary, version from the tree.
  auto r = run_process({overlay_bin(), "status", "--root", w.tree, "--engine", "example"}, {});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("overlay example-cache: pristine"));
  r = run_process({overlay_bin(), "status", "--root", w.tree, "--engine", "example", "--engine-version", "9.9"}, {});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("no manifests for example 9.9"));
  r = run_process({overlay_bin(), "status", "--root", w.tree}, {});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("cannot detect the vllm version"));
}

TEST(Cli, HelpListsExitCodes) {
  auto r = run_process({overlay_bin(), "--help"}, {});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("3  drift"));
  EXPECT_THAT(r.out, HasSubstr("6  I/O error"));
}

}  // namespace
}  // namespace patcher::testing

namespace patcher::testing {
namespace {

// A fragment edited after apply: regions are intact but stale. Apply refuses
// (it would change injected code silently); revert still restores the pins.
TEST(States, StaleFragmentRefusesApplyButRevertWorks) {
  Workspace w;
  auto pristine = snapshot(w.tree);
  ASSERT_EQ(w.run({"apply"}).code, 0);
  write_file(w.overlays + "/example-cache/worker_remember.py",
             "tokens = [hash(word) % self.vocab_size for word in prompt.split()]\n"
             "cache_hooks.remember(prompt, list(tokens))\n");
  write_file(w.overlays + "/example-cache-stats/cache_stats.py", "HITS = {}\n");
  auto st = status_json(w);
  EXPECT_EQ(file_state(st, kWorker), "stale");
  EXPECT_EQ(file_state(st, "example/cache_stats.py"), "stale");
  EXPECT_EQ(overlay_state(st, "example-cache"), "stale");
  auto before = snapshot(w.tree);
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 4);
  EXPECT_THAT(r.err, HasSubstr("revert, then apply again"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
  EXPECT_EQ(w.run({"check"}).code, 4);
  r = w.run({"revert"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(diff_bytes(pristine, snapshot(w.tree)), "");
  ASSERT_EQ(w.run({"apply"}).code, 0);
  EXPECT_THAT(read_file(w.tree_file(kWorker)), HasSubstr("list(tokens)"));
}

}  // namespace
}  // namespace patcher::testing

namespace patcher::testing {
namespace {

TEST(Cli, PlanWritesNothingAndPlanRevertListsRemovals) {
  Workspace w;
  auto before = snapshot(w.tree);
  auto r = w.run({"plan", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["changes"].size(), 4u);  // two patched targets, two new files
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
  ASSERT_EQ(w.run({"apply"}).code, 0);
  auto applied = snapshot(w.tree);
  r = w.run({"plan", "--revert", "--overlays", "example-cache-stats"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("would patch example/scheduler.py"));
  EXPECT_THAT(r.out, HasSubstr("- example-cache-stats/count-hit"));
  EXPECT_THAT(r.out, HasSubstr("would delete example/cache_stats.py"));
  EXPECT_EQ(diff_snapshots(applied, snapshot(w.tree)), "");
}

TEST(Cli, JsonErrorsCarryCodeKindFileAndMessage) {
  Workspace w;
  std::remove(w.tree_file(kWorker).c_str());
  auto r = w.run({"apply", "--json"});
  EXPECT_EQ(r.code, 3);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["error"]["code"], 3);
  EXPECT_EQ(j["error"]["kind"], "drift");
  EXPECT_EQ(j["error"]["file"], kWorker);
}

TEST(Cli, MissingRootOrSubcommandIsUsage) {
  EXPECT_EQ(run_process({overlay_bin(), "status"}, {}).code, 2);
  EXPECT_EQ(run_process({overlay_bin(), "--root", "/tmp"}, {}).code, 2);
  EXPECT_EQ(run_process({overlay_bin(), "frobnicate", "--root", "/tmp"}, {}).code, 2);
}

}  // namespace
}  // namespace patcher::testing

namespace patcher::testing {
namespace {

TEST(Cli, PlanDiffShowsTheInjectedRegion) {
  Workspace w;
  auto r = w.run({"plan", "--diff", "--overlays", "example-cache"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--- a/example/worker.py\n+++ b/example/worker.py\n"));
  EXPECT_THAT(r.out, HasSubstr("+        # >>> overlay example-cache/remember sha256=ccea02a207a2f0d6\n"
                               "         tokens = [hash(word) % self.vocab_size for word in prompt.split()]\n"
                               "+        cache_hooks.remember(prompt, tokens)\n"));
  EXPECT_THAT(r.out, HasSubstr("@@ -0,0 +1,12 @@\n+# === overlay example-cache new-file"));
  EXPECT_THAT(r.out, HasSubstr("+            # >>> overlay example-cache/lookup"));
}

}  // namespace
}  // namespace patcher::testing

namespace patcher::testing {
namespace {

TEST(CheckInjected, EverythingCompilesInOneInterpreterProcess) {
  Workspace w;
  std::string counter = w.dir + "/python-runs";
  std::string wrapper = w.dir + "/counting-python";
  write_file(wrapper, "#!/bin/sh\necho run >> '" + counter + "'\nexec python3 \"$@\"\n");
  chmod(wrapper.c_str(), 0755);
  auto r = w.run({"apply", "--check-injected", "--python", wrapper});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("compiled 13 files and fragments"));
  EXPECT_EQ(read_file(counter), "run\n");
}

}  // namespace
}  // namespace patcher::testing
