// Guarantee 7: bad input. Every case must give a one-line error naming the
// file and the problem, its documented exit code, and write nothing (bytes
// and mtimes of the whole tree compared before and after).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "test_util.h"

namespace patcher::testing {
namespace {

namespace fs = std::filesystem;

void edit(const std::string& path, const std::string& from, const std::string& to) {
  std::string t = read_file(path);
  size_t p = t.find(from);
  ASSERT_NE(p, std::string::npos) << path << ": " << from;
  t.replace(p, from.size(), to);
  write_file(path, t);
}

struct Case {
  std::string name;
  std::function<void(Workspace&)> setup;
  int code;
  std::string file;     // the error line must name this file
  std::string problem;  // ... and this problem
  std::vector<std::string> args = {"apply"};
  bool io = false;  // an I/O failure may create and remove a temp: directory mtimes move
};

std::string cache(const Workspace& w) { return w.manifests + "/example-cache.toml"; }
std::string stats(const Workspace& w) { return w.manifests + "/example-cache-stats.toml"; }
const std::string kImportAnchor = "  anchor = \"from example.worker import Worker\"\n";

std::vector<Case> cases() {
  return {
      {"MalformedToml", [](Workspace& w) { edit(cache(w), "[[new_files]]", "[[new_files]"); }, 2,
       "example-cache.toml", "malformed TOML"},
      {"UnknownTopLevelKey", [](Workspace& w) { edit(cache(w), "summary =", "colour = \"red\"\nsummary ="); }, 2,
       "example-cache.toml", "unknown key \"colour\" in the manifest"},
      {"UnknownFileKey",
       [](Workspace& w) { edit(cache(w), "path = \"example/worker.py\"\n", "path = \"example/worker.py\"\nmode = 1\n"); },
       2, "example-cache.toml", "unknown key \"mode\" in [[files]]"},
      {"UnknownEditKey", [](Workspace& w) { edit(cache(w), kImportAnchor, kImportAnchor + "  anchr = \"x\"\n"); }, 2,
       "example-cache.toml", "unknown key \"anchr\" in [[files.edits]]"},
      {"MissingAnchor", [](Workspace& w) { edit(cache(w), kImportAnchor, ""); }, 2, "example-cache.toml",
       "missing required key \"anchor\""},
      {"MissingOverlayName", [](Workspace& w) { edit(cache(w), "overlay = \"example-cache\"\n", ""); }, 2,
       "example-cache.toml", "missing required key \"overlay\""},
      {"WrongType", [](Workspace& w) { edit(cache(w), kImportAnchor, kImportAnchor + "  occurrences = \"one\"\n"); },
       2, "example-cache.toml", "must be an integer"},
      {"BadAction", [](Workspace& w) { edit(cache(w), "action = \"replace\"", "action = \"substitute\""); }, 2,
       "example-cache.toml", "action \"substitute\""},
      {"DuplicateEditId", [](Workspace& w) { edit(cache(w), "id = \"lookup\"", "id = \"import-cache\""); }, 2,
       "example-cache.toml", "duplicate edit id \"import-cache\""},
      {"TargetPathDotDot",
       [](Workspace& w) { edit(cache(w), "path = \"example/worker.py\"", "path = \"example/../../outside.py\""); }, 2,
       "example-cache.toml: line ", "escapes the root through \"..\""},
      {"TargetPathAbsolute", [](Workspace& w) { edit(cache(w), "path = \"example/worker.py\"", "path = \"/etc/passwd\""); },
       2, "example-cache.toml: line ", "is absolute"},
      {"TargetIsSymlink",
       [](Workspace& w) {
         fs::rename(w.tree_file("example/worker.py"), w.dir + "/worker.py");
         fs::create_symlink(w.dir + "/worker.py", w.tree_file("example/worker.py"));
       },
       2, "example/worker.py", "is a symlink"},
      {"TargetDirIsSymlink",
       [](Workspace& w) {
         fs::rename(w.tree + "/example", w.dir + "/real-example");
         fs::create_symlink(w.dir + "/real-example", w.tree + "/example");
       },
       2, "example/scheduler.py", "goes through a symlink"},
      {"TargetNotRegularFile",
       [](Workspace& w) {
         fs::remove(w.tree_file("example/worker.py"));
         fs::create_directory(w.tree_file("example/worker.py"));
       },
       2, "example/worker.py", "not a regular file"},
      {"FragmentPathDotDot",
       [](Workspace& w) { edit(cache(w), "fragment = \"worker_import.py\"", "fragment = \"../../tree/example/worker.py\""); },
       2, "example-cache.toml", "escapes the root"},
      {"FragmentPathAbsolute",
       [](Workspace& w) { edit(cache(w), "fragment = \"worker_import.py\"", "fragment = \"/etc/hostname\""); }, 2,
       "example-cache.toml", "is absolute"},
      {"FragmentMissing", [](Workspace& w) { fs::remove(w.overlays + "/example-cache/worker_import.py"); }, 2,
       "worker_import.py", "fragment file does not exist"},
      {"FragmentIsSymlink",
       [](Workspace& w) {
         std::string f = w.overlays + "/example-cache/worker_import.py";
         fs::rename(f, w.dir + "/frag.py");
         fs::create_symlink(w.dir + "/frag.py", f);
       },
       2, "worker_import.py", "is a symlink"},
      {"FragmentNotUtf8",
       [](Workspace& w) { write_file(w.overlays + "/example-cache/worker_import.py", "x = '\xff\xfe'\n"); }, 2,
       "worker_import.py", "not valid UTF-8"},
      {"FragmentCrlf",
       [](Workspace& w) { write_file(w.overlays + "/example-cache/worker_import.py", "from example import cache_hooks\r\n"); },
       2, "worker_import.py", "CRLF"},
      {"FragmentNotAtColumnZero",
       [](Workspace& w) { write_file(w.overlays + "/example-cache/worker_import.py", "    import os\n"); }, 2,
       "worker_import.py", "column 0"},
      {"FragmentHasSentinel",
       [](Workspace& w) {
         write_file(w.overlays + "/example-cache/worker_import.py",
                    "# >>> overlay other/thing sha256=0123456789abcdef\nimport os\n");
       },
       2, "worker_import.py", "looks like an overlay sentinel"},
      // Issue 37: a NUL byte is valid UTF-8 but breaks any source it is injected into.
      {"FragmentHasNul",
       [](Workspace& w) {
         write_file(w.overlays + "/example-cache/worker_import.py", std::string("import os\n\0x = 1\n", 17));
       },
       2, "worker_import.py", "contains a NUL byte (line 2)"},
      {"FragmentHasNulCheck",
       [](Workspace& w) { write_file(w.overlays + "/example-cache/worker_import.py", std::string("import os\0\n", 11)); },
       2, "worker_import.py", "contains a NUL byte (line 1)", {"check"}},
      {"NewFileSourceHasNul",
       [](Workspace& w) { write_file(w.overlays + "/example-cache/cache_hooks.py", std::string("x = 1\n\0", 7)); }, 2,
       "cache_hooks.py", "contains a NUL byte"},
      {"TargetMissing", [](Workspace& w) { fs::remove(w.tree_file("example/worker.py")); }, 3, "example/worker.py",
       "does not exist"},
      {"TargetUnreadable", [](Workspace&) {}, 6, "example/worker.py", "Permission denied",
       {"apply"}},  // env set below
      {"TargetNotUtf8",
       [](Workspace& w) { edit(w.tree_file("example/worker.py"), "toy tokenizer", "toy tok\xc3\x28nizer"); }, 2,
       "example/worker.py", "not valid UTF-8"},
      {"TargetCrlf",
       [](Workspace& w) { edit(w.tree_file("example/worker.py"), "class Worker:\n", "class Worker:\r\n"); }, 2,
       "example/worker.py", "CRLF"},
      {"OverlappingEditsInOneOverlay",
       [](Workspace& w) {
         edit(cache(w), "[[new_files]]",
              "  [[files.edits]]\n  id = \"remember-twice\"\n  scope = \"class Worker/def run\"\n"
              "  anchor = \"        tokens = [hash(word) % self.vocab_size for word in prompt.split()]\"\n"
              "  action = \"insert_before\"\n  fragment = \"worker_import.py\"\n\n[[new_files]]");
       },
       2, "example/worker.py", "both anchor on line 9; overlapping edits are not allowed"},
      {"TwoOverlaysEditTheSameAnchor",
       [](Workspace& w) {
         edit(stats(w), "[[new_files]]",
              "  [[files.edits]]\n  id = \"same-anchor\"\n  anchor = \"from example.worker import Worker\"\n"
              "  action = \"insert_after\"\n  fragment = \"stats_import.py\"\n\n[[new_files]]");
       },
       2, "example/scheduler.py", "example-cache/import-cache and example-cache-stats/same-anchor both anchor on line 5"},
      {"SentinelInPristineFile",
       [](Workspace& w) {
         edit(w.tree_file("example/worker.py"), "class Worker:\n",
              "# >>> overlay example-cache/remember sha256=0123456789abcdef\nclass Worker:\n");
         edit(cache(w), "decf892c294e627cbfa98f297cf8d7579ba8c0e5fc3f7ddc9d52602f42de0399",
              sha256_file(w.tree_file("example/worker.py")));
       },
       2, "example/worker.py", "sentinel-looking line 4"},
      {"ReadOnlyTree", [](Workspace&) {}, 6, "example/scheduler.py", "Read-only file system", {"apply"}, true},
      {"DiskFull", [](Workspace&) {}, 6, "example/worker.py", "No space left on device", {"apply"}, true},
      {"OverlayNameMismatch", [](Workspace& w) { edit(cache(w), "overlay = \"example-cache\"", "overlay = \"other\""); },
       2, "example-cache.toml", "line 4: overlay = \"other\" does not match the file name"},
      {"AfterNamesUnknownOverlay",
       [](Workspace& w) { edit(stats(w), "after = [\"example-cache\"]", "after = [\"nope\"]"); }, 2,
       "example-cache-stats.toml", "line 7: \"after\" names unknown overlay \"nope\""},
      {"AfterCycle",
       [](Workspace& w) {
         fs::remove(w.manifests + "/ORDER");
         edit(cache(w), "after = []", "after = [\"example-cache-stats\"]");
       },
       2, "example-cache", "forms a cycle"},
      {"OrderContradictsAfter", [](Workspace& w) { write_file(w.manifests + "/ORDER", "example-cache-stats\nexample-cache\n"); },
       2, "ORDER", "puts \"example-cache-stats\" before \"example-cache\""},
      {"BadShaPin", [](Workspace& w) { edit(cache(w), "sha256 = \"decf892c", "sha256 = \"zz\"\n#"); }, 2,
       "example-cache.toml", "64 lowercase hex"},
      {"PinsDisagreeAcrossOverlays",
       [](Workspace& w) { edit(stats(w), "sha256 = \"cbfa95d6", "sha256 = \"0bfa95d6"); }, 2,
       "example-cache-stats.toml", "differs from the one in"},
      {"UnknownOverlayRequested", [](Workspace&) {}, 2, "example-1.0", "\"nope\", which has no manifest",
       {"apply", "--overlays", "nope"}},
      {"EmptyAnchor", [](Workspace& w) { edit(cache(w), kImportAnchor, "  anchor = \"\"\n"); }, 2,
       "example-cache.toml", "anchor of edit \"import-cache\" is empty"},
      {"AnchorWithCarriageReturn",
       [](Workspace& w) { edit(cache(w), kImportAnchor, "  anchor = \"from example.worker import Worker\\r\"\n"); }, 2,
       "example-cache.toml", "CRLF"},
      {"UnsupportedFormat", [](Workspace& w) { edit(cache(w), "format = 1", "format = 2"); }, 2, "example-cache.toml",
       "unsupported format"},
      {"OccurrencesZero", [](Workspace& w) { edit(cache(w), kImportAnchor, kImportAnchor + "  occurrences = 0\n"); },
       2, "example-cache.toml", "occurrences of edit \"import-cache\" must be 1..1000"},
      {"EngineVersionsDisagree",
       [](Workspace& w) { edit(stats(w), "engine_version = \"1.0\"", "engine_version = \"2.0\""); }, 2,
       "example-cache-stats.toml", "differs from"},
      {"NewFileIsAnotherOverlaysTarget",
       [](Workspace& w) { edit(stats(w), "path = \"example/cache_stats.py\"", "path = \"example/worker.py\""); }, 2,
       "example-cache-stats.toml", "is an edited target of"},
      {"NewFilePathTakenByForeignFile",
       [](Workspace& w) { write_file(w.tree_file("example/cache_hooks.py"), "# someone else's module\n"); }, 4,
       "example/cache_hooks.py", "not created by overlay example-cache"},
      {"BadScopeSyntax",
       [](Workspace& w) { edit(cache(w), "scope = \"class Worker/def run\"", "scope = \"Worker.run\""); }, 2,
       "example-cache.toml", "scope \"Worker.run\" of edit \"remember\" must be"},
      {"UnknownCliFlag", [](Workspace&) {}, 2, "--colour", "usage", {"apply", "--colour"}},
      // Opening a FIFO for reading blocks until a writer comes; /dev/zero never ends.
      {"ManifestIsAFifo", [](Workspace& w) { ::mkfifo((w.manifests + "/x.toml").c_str(), 0644); }, 2, "x.toml",
       "not a regular file"},
      {"ManifestLinksToADevice",
       [](Workspace& w) { fs::create_symlink("/dev/zero", w.manifests + "/x.toml"); }, 2, "x.toml",
       "not a regular file"},
      {"ManifestIsAFolder", [](Workspace& w) { fs::create_directory(w.manifests + "/x.toml"); }, 2, "x.toml",
       "not a regular file"},
  };
}

class BadInput : public ::testing::TestWithParam<Case> {};

TEST_P(BadInput, OneLineErrorDocumentedCodeNoWrite) {
  const Case& c = GetParam();
  Workspace w;
  c.setup(w);
  std::map<std::string, std::string> env;
  if (c.name == "TargetUnreadable") env["OVERLAY_FAULT"] = "EACCES@read-target:2";
  if (c.name == "ReadOnlyTree") env["OVERLAY_FAULT"] = "EROFS@temp-create:1";
  if (c.name == "DiskFull") env["OVERLAY_FAULT"] = "ENOSPC@temp-write:2";
  auto before = snapshot(w.tree);
  auto r = w.run(c.args, env);
  EXPECT_EQ(r.code, c.code) << r.err;
  std::string first = r.err.substr(0, r.err.find('\n'));
  EXPECT_THAT(first, ::testing::HasSubstr(c.file)) << r.err;
  EXPECT_THAT(first, ::testing::HasSubstr(c.problem)) << r.err;
  if (c.code == 2) {
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;  // exactly one line
  }
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree), !c.io), "");
}

INSTANTIATE_TEST_SUITE_P(Catalogue, BadInput, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(BadInputCatalogue, HasAtLeast25DistinctCases) {
  std::set<std::string> names;
  for (const auto& c : cases()) names.insert(c.name);
  EXPECT_GE(names.size(), 25u);
  EXPECT_EQ(names.size(), cases().size());
}

// The same failures without the fault hook, where the OS can produce them.
TEST(BadInputReal, ReadOnlyDirectory) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  Workspace w;
  chmod((w.tree + "/example").c_str(), 0555);
  auto before = snapshot(w.tree);
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 6);
  EXPECT_THAT(r.err, ::testing::HasSubstr("Permission denied"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
}

TEST(BadInputReal, UnreadableTarget) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads anything";
  Workspace w;
  chmod(w.tree_file("example/worker.py").c_str(), 0);
  auto before = snapshot(w.tree);
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 6);
  EXPECT_THAT(r.err, ::testing::HasSubstr("example/worker.py"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
}

}  // namespace
}  // namespace patcher::testing
