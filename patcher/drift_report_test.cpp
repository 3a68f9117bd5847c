// Drift reports a porter can act on, and the small input defects of issue 13:
// superseded edits named as such, anchors that moved out of their scope, one
// block per file, structured --json, pin-only drift with a diff, bounded input
// sizes, long and hostile path names, JSON for every failure under --json,
// and staleness per overlay.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace patcher::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

void replace_in(const std::string& path, const std::string& from, const std::string& to) {
  std::string t = read_file(path);
  size_t p = t.find(from);
  ASSERT_NE(p, std::string::npos) << from;
  t.replace(p, from.size(), to);
  write_file(path, t);
}

TEST(DriftReport, ASupersededEditWhoseUpstreamTextIsGoneSaysSo) {
  Workspace w;
  replace_in(w.tree_file("example/scheduler.py"), "from dataclasses import dataclass, field",
             "import dataclasses");
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("edit example-cache-stats/dataclass-import: anchor found 0 times"));
  EXPECT_THAT(r.err, HasSubstr("superseded_by upstream text that is no longer in the file: \"from dataclasses"));
  auto j = nlohmann::json::parse(w.run({"plan", "--json"}).out);
  bool seen = false;
  for (const auto& f : j["error"]["files"])
    for (const auto& e : f["edits"])
      if (e.value("edit", "") == "dataclass-import") {
        seen = true;
        EXPECT_EQ(e["superseded_by"], "from dataclasses import dataclass");
      }
  EXPECT_TRUE(seen) << j.dump(2);
}

TEST(DriftReport, AScopeMissSaysWhereTheAnchorTextMovedTo) {
  Workspace w;
  replace_in(w.tree_file("example/worker.py"), "class Worker", "class Runner");
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("scope \"class Worker/def run\": \"class Worker\" found 0 times"));
  EXPECT_THAT(r.err, HasSubstr("outside the scope: line 9 (in class Runner/def run)"));
}

// Issue 37: a `def` whose signature spans several lines was left out of the
// enclosing scope (0.32.0 scheduler.py line 1881: "in class
// OffloadingConnectorScheduler", not in build_connector_meta): the closing
// `) -> T:` line is shallower than the body and hid the header.
TEST(DriftReport, TheEnclosingFunctionOfAMultiLineSignatureIsNamed) {
  Workspace w;
  replace_in(w.tree_file("example/worker.py"), "    def run(self, prompt: str) -> list[int]:\n",
             "    def run(\n        self,\n        prompt: str,\n    ) -> list[int]:\n");
  replace_in(w.tree_file("example/worker.py"), "class Worker", "class Runner");
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("outside the scope: line 12 (in class Runner/def run)")) << r.err;
}

// Issue 37: a nearest match inside text an earlier overlay injects was
// offered as "line 6 (inside an injected region)", a line number of the
// in-memory build, not of the file on disk.
TEST(DriftReport, ANearestMatchInInjectedTextIsNamedByItsRegionNotAsALineOfTheFile) {
  Workspace w;
  replace_in(w.manifests + "/example-cache-stats.toml", "anchor = \"from example import cache_hooks\"",
             "anchor = \"from example import cache_hook\"");
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("line 2 of the region example-cache/import-cache injects (not a line of the file on "
                               "disk) 0.9"))
      << r.err;
  EXPECT_THAT(r.err, HasSubstr("+++ example/scheduler.py line 2 of the region example-cache/import-cache injects"));
  EXPECT_THAT(r.err, Not(HasSubstr("inside an injected region")));
  auto j = nlohmann::json::parse(w.run({"plan", "--json"}).out);
  const auto& e = j["error"]["files"][0]["edits"][0];
  EXPECT_EQ(e["edit"], "stats-import") << e.dump(2);
  EXPECT_EQ(e["nearest"][0]["line"], 0) << e.dump(2);
  EXPECT_EQ(e["nearest"][0]["injected_by"], "example-cache/import-cache");
  EXPECT_EQ(e["nearest"][0]["region_line"], 2);
  EXPECT_EQ(e["nearest"][0]["text"], "from example import cache_hooks");
}

TEST(DriftReport, OneBlockPerFileAndTheFirstLineNamesEveryFile) {
  Workspace w;
  replace_in(w.tree_file("example/scheduler.py"), "for request in batch:", "for req in batch:");
  replace_in(w.tree_file("example/worker.py"), "for word in prompt.split()", "for w in prompt.split()");
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 3);
  std::string first = r.err.substr(0, r.err.find('\n'));
  EXPECT_THAT(first, HasSubstr("drift in 2 files: example/scheduler.py, example/worker.py"));
  // scheduler.py is shared by both overlays: its block appears once.
  EXPECT_EQ(count(r.err, "example/scheduler.py: sha256"), 1u) << r.err;
  EXPECT_EQ(count(r.err, "edit example-cache/lookup:"), 1u) << r.err;
}

TEST(DriftReport, JsonCarriesStructuredFieldsNotHumanLines) {
  Workspace w;
  replace_in(w.tree_file("example/worker.py"), "for word in prompt.split()", "for w in prompt.split()");
  auto r = w.run({"apply", "--json"});
  EXPECT_EQ(r.code, 3);
  auto j = nlohmann::json::parse(r.out);
  const auto& err = j["error"];
  EXPECT_FALSE(err.contains("details"));
  ASSERT_EQ(err["files"].size(), 1u);
  EXPECT_EQ(err["files"][0]["file"], "example/worker.py");
  const auto& e = err["files"][0]["edits"][0];
  EXPECT_EQ(e["overlay"], "example-cache");
  EXPECT_EQ(e["edit"], "remember");
  EXPECT_EQ(e["expected"], 1);
  EXPECT_EQ(e["found"], 0);
  EXPECT_EQ(e["nearest"][0]["line"], 9);
  EXPECT_GT(e["nearest"][0]["score"].get<double>(), 0.9);
  EXPECT_THAT(e["diff"].dump(), HasSubstr("+        tokens = [hash(word) % self.vocab_size for w in prompt.split()]"));
}

TEST(DriftReport, PinOnlyDriftShowsTheDiffAndThePinLine) {
  Workspace w;
  std::string pristine = w.dir + "/pristine";
  std::filesystem::copy(source_dir() + "/fixtures/example", pristine, std::filesystem::copy_options::recursive);
  write_file(w.tree_file("example/worker.py"), read_file(w.tree_file("example/worker.py")) + "# an upstream comment\n");
  std::string sha = sha256_file(w.tree_file("example/worker.py"));
  auto r = w.run({"plan", "--pristine", pristine});
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("update the pin in"));
  EXPECT_THAT(r.err, HasSubstr("sha256 = \"" + sha + "\""));
  EXPECT_THAT(r.err, HasSubstr("+# an upstream comment"));
  auto j = nlohmann::json::parse(w.run({"plan", "--json", "--pristine", pristine}).out);
  const auto& e = j["error"]["files"][0]["edits"][0];
  EXPECT_EQ(e["kind"], "pin");
  EXPECT_EQ(e["pin_line"], "sha256 = \"" + sha + "\"");
  EXPECT_FALSE(e["diff"].empty());
}

TEST(InputLimits, AHugeAnchorIsRefusedAsBadInput) {
  Workspace w;
  std::string toml = read_file(w.manifests + "/example-cache.toml");
  std::string big(100 * 1024, 'x');
  replace_in(w.manifests + "/example-cache.toml", "anchor = \"        tokens = [hash(word) % self.vocab_size for word in prompt.split()]\"",
             "anchor = \"" + big + "\"");
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("is 102400 bytes; at most 65536"));
}

TEST(InputLimits, AHugeManifestIsRefusedBeforeItIsRead) {
  Workspace w;
  std::string path = w.manifests + "/example-cache.toml";
  std::string toml = read_file(path);
  toml += "\n# " + std::string(5 << 20, 'x') + "\n";
  write_file(path, toml);
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("at most 4194304 are read"));
}

TEST(BadNames, ALongPathComponentIsBadInputNotIo) {
  Workspace w;
  replace_in(w.manifests + "/example-cache.toml", "path = \"example/cache_hooks.py\"",
             "path = \"example/" + std::string(300, 'a') + ".py\"");
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("longer than 255 bytes"));
}

TEST(BadNames, ANewlineInANameIsEscapedAndTheErrorStaysOneLine) {
  Workspace w;
  std::string root = w.dir + "/no such tree\nsecond line";
  auto r = run_process({overlay_bin(), "status", "--root", root, "--manifests", w.manifests}, {});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(count(r.err, "\n"), 1u) << r.err;
  EXPECT_THAT(r.err, HasSubstr("no such tree\\nsecond line"));
}

TEST(JsonErrors, AnUnknownFlagUnderJsonPrintsJson) {
  Workspace w;
  auto r = w.run({"status", "--json", "--no-such-flag"});
  EXPECT_EQ(r.code, 2);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["error"]["code"], 2);
  EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr("no-such-flag"));
}

TEST(Staleness, ChangingOneOverlaysFragmentMakesOnlyThatOverlayStale) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}).code, 0);
  // example-cache-stats's count-hit sits in scheduler.py beside example-cache's regions.
  std::string frag = w.overlays + "/example-cache-stats/count_hit.py";
  write_file(frag, read_file(frag) + "pass\n");
  auto j = status_state(w.run({"status", "--json"}).out);
  std::map<std::string, std::string> states;
  for (const auto& o : j["overlays"]) states[o["name"]] = o["state"];
  EXPECT_EQ(states["example-cache-stats"], "stale");
  EXPECT_EQ(states["example-cache"], "applied");
  EXPECT_EQ(w.run({"check", "--overlays", "example-cache"}).code, 0);
  EXPECT_EQ(w.run({"check", "--overlays", "example-cache-stats"}).code, 4);
  // Apply of the fresh overlay may not rebuild the file under the stale one.
  auto before = snapshot(w.tree);
  auto r = w.run({"apply", "--overlays", "example-cache"});
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_THAT(r.err, HasSubstr("revert example-cache-stats"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
  ASSERT_EQ(w.run({"revert", "--overlays", "example-cache-stats"}).code, 0);
  ASSERT_EQ(w.run({"apply"}).code, 0);
  EXPECT_EQ(w.run({"check"}).code, 0);
}

}  // namespace
}  // namespace patcher::testing
