// Issue 48: what a bake installs in a folder the overlay created (the store
// library beside native.py, recorded in `.overlay-installed`) goes with the
// folder on revert; a folder the overlay made that outlived its files is a
// leftover `check --expect pristine` refuses; `revert --new-files-only`
// removes what the overlays added from a tree whose engine files drifted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "sha256.h"
#include "test_util.h"

namespace patcher::testing {
namespace {

using ::testing::HasSubstr;

// example-cache gains example/plugins/cache/store.py (two new folders).
void add_package(const Workspace& w) {
  std::string toml = read_file(w.manifests + "/example-cache.toml");
  toml += R"(
[[new_files]]
path = "example/plugins/cache/store.py"
source = "pkg_store.py"
)";
  write_file(w.manifests + "/example-cache.toml", toml);
  write_file(w.overlays + "/example-cache/pkg_store.py", "class Store:\n    pass\n");
}

bool exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

// What docker/bake.sh does beside native.py: copy a library, record it.
void bake_install(const Workspace& w, const std::string& name, const std::string& bytes) {
  const std::string dir = w.tree_file("example/plugins/cache");
  write_file(dir + "/" + name, bytes);
  write_file(dir + "/.overlay-installed", kvtier::sha256_hex(bytes) + "  " + name + "\n");
}

TEST(Installed, RevertRemovesWhatTheBakeRecordedWithTheFolder) {
  Workspace w;
  add_package(w);
  auto before = snapshot(w.tree);
  ASSERT_EQ(w.run({"apply"}).code, 0);
  bake_install(w, "libstore.so", "\x7f" "ELF a library\n");
  EXPECT_EQ(w.run({"check"}).code, 0);  // applied: the installed files are no stray
  auto plan = w.run({"plan", "--revert"});
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("with the files a bake installed in it, as its record lists them: libstore.so, "
                                  ".overlay-installed"));
  auto r = w.run({"revert"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(exists(w.tree_file("example/plugins")));
  EXPECT_EQ(diff_bytes(before, snapshot(w.tree)), "");
  EXPECT_EQ(w.run({"check", "--expect", "pristine"}).code, 0);
}

TEST(Installed, AFileTheRecordDoesNotVouchForKeepsTheFolderAndPristineFails) {
  Workspace w;
  add_package(w);
  ASSERT_EQ(w.run({"apply"}).code, 0);
  bake_install(w, "libstore.so", "library bytes\n");
  write_file(w.tree_file("example/plugins/cache/libstore.so"), "changed since the bake\n");
  ASSERT_EQ(w.run({"revert"}).code, 0);
  EXPECT_TRUE(exists(w.tree_file("example/plugins/cache/libstore.so")));
  EXPECT_TRUE(exists(w.tree_file("example/plugins/cache/.overlay-dir")));
  // Before issue 48 this said "ok: pristine": a check that can be wrong.
  auto c = w.run({"check", "--expect", "pristine"});
  EXPECT_EQ(c.code, 1) << c.out;
  EXPECT_THAT(c.err, HasSubstr("example/plugins/cache is a leftover overlay folder"));
  auto st = w.run({"status"});
  EXPECT_THAT(st.out, HasSubstr("leftover overlay folder example/plugins/cache:"));
  // Removed by hand, the next revert (nothing else to do) takes the folders.
  ASSERT_EQ(::unlink(w.tree_file("example/plugins/cache/libstore.so").c_str()), 0);
  auto again = w.run({"revert"});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_THAT(again.out, HasSubstr("did rmdir example/plugins/cache"));
  EXPECT_FALSE(exists(w.tree_file("example/plugins")));
  EXPECT_EQ(w.run({"check", "--expect", "pristine"}).code, 0);
}

TEST(Installed, ARecordNamingAPathIsIgnored) {
  Workspace w;
  add_package(w);
  ASSERT_EQ(w.run({"apply"}).code, 0);
  write_file(w.tree_file("example/notes.txt"), "mine\n");
  write_file(w.tree_file("example/plugins/cache/.overlay-installed"),
             kvtier::sha256_hex("mine\n") + "  ../../notes.txt\n");
  ASSERT_EQ(w.run({"revert"}).code, 0);
  EXPECT_EQ(read_file(w.tree_file("example/notes.txt")), "mine\n");
  EXPECT_TRUE(exists(w.tree_file("example/plugins/cache/.overlay-installed")));
}

TEST(Installed, NewFilesOnlyRevertLeavesADriftedEngineAlone) {
  Workspace w;
  add_package(w);
  ASSERT_EQ(w.run({"apply"}).code, 0);
  bake_install(w, "libstore.so", "library bytes\n");
  // The engine upgraded under the overlay: its file is someone else's now.
  const std::string target = w.tree_file("example/scheduler.py");
  write_file(target, "# the next release's scheduler\n");
  EXPECT_EQ(w.run({"revert"}).code, 3);  // drift: a plain revert refuses
  auto r = w.run({"revert", "--new-files-only"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("did delete example/plugins/cache/store.py"));
  EXPECT_EQ(read_file(target), "# the next release's scheduler\n");
  EXPECT_FALSE(exists(w.tree_file("example/plugins")));
  auto misuse = w.run({"apply", "--new-files-only"});
  EXPECT_EQ(misuse.code, 2);
  EXPECT_THAT(misuse.err, HasSubstr("it belongs to 'plan', 'revert'"));
  auto plan = w.run({"plan", "--new-files-only"});  // without --revert
  EXPECT_EQ(plan.code, 2);
  EXPECT_THAT(plan.err, HasSubstr("--new-files-only is for revert"));
}

}  // namespace
}  // namespace patcher::testing
