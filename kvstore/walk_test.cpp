#include "kvtier/kvstore/walk.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include <gtest/gtest.h>

#include "test_tmpdir.h"

namespace kvstore {
namespace {

std::vector<std::string> rels(const std::vector<WalkEntry>& es) {
  std::vector<std::string> out;
  for (const auto& e : es) out.push_back(e.rel);
  std::sort(out.begin(), out.end());
  return out;
}

// a/b/one.bin, a/c/two.bin, d/three.bin
void write_three_folders(testing::TmpDir& t) {
  t.write("a/b/one.bin", "1");
  t.write("a/c/two.bin", "2");
  t.write("d/three.bin", "3");
}

TEST(Walk, ReportsEveryDirectoryListed) {
  testing::TmpDir t;
  write_three_folders(t);
  auto root = open_root(t.path());
  ASSERT_TRUE(root);
  for (unsigned threads : {1u, 3u}) {
    std::atomic<int> dirs{0};
    WalkOptions opt;
    opt.threads = threads;
    opt.on_dir = [&] { dirs++; };
    auto w = walk(root->get(), opt);
    EXPECT_EQ(dirs.load(), 5) << threads;  // the root, a, a/b, a/c, d
    EXPECT_EQ(w.files.size(), 3u);
  }
}

TEST(Walk, KeepDirLeavesDirectoriesOutButStillEntersThem) {
  testing::TmpDir t;
  write_three_folders(t);
  auto root = open_root(t.path());
  ASSERT_TRUE(root);
  for (unsigned threads : {1u, 3u}) {
    WalkOptions opt;
    opt.threads = threads;
    opt.keep_dir = [](std::string_view rel) { return rel != "a" && rel != "a/b"; };
    auto w = walk(root->get(), opt);
    EXPECT_EQ(rels(w.dirs), (std::vector<std::string>{"a/c", "d"})) << threads;
    EXPECT_EQ(rels(w.files), (std::vector<std::string>{"a/b/one.bin", "a/c/two.bin", "d/three.bin"})) << threads;
  }
}

TEST(Walk, OnFileNamesAWorkerBelowTheThreadCount) {
  testing::TmpDir t;
  for (int d = 0; d < 12; ++d)
    for (int f = 0; f < 5; ++f) t.write("d" + std::to_string(d) + "/sub/f" + std::to_string(f), "x");
  t.write("top", "x");
  auto root = open_root(t.path());
  ASSERT_TRUE(root);
  for (unsigned threads : {1u, 3u}) {
    // Each worker writes only its own slot, as the scan gathers its chunk
    // records per worker without a lock.
    std::vector<std::vector<std::string>> seen(threads);
    std::atomic<bool> out_of_range{false};
    WalkOptions opt;
    opt.threads = threads;
    opt.on_file = [&](unsigned worker, int, const char*, WalkEntry& e) {
      if (worker >= threads) {
        out_of_range = true;
        return true;
      }
      seen[worker].push_back(e.rel);
      return false;
    };
    auto w = walk(root->get(), opt);
    EXPECT_FALSE(out_of_range.load()) << threads;
    EXPECT_TRUE(w.files.empty());  // every file was taken over
    std::vector<std::string> all;
    for (auto& s : seen) all.insert(all.end(), s.begin(), s.end());
    EXPECT_EQ(all.size(), 61u) << threads;
    std::sort(all.begin(), all.end());
    EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "a file handed out twice";
  }
}

TEST(Walk, ListsFilesDirsAndSizes) {
  testing::TmpDir t;
  t.write("a/b/one.bin", "12345");
  t.write("a/two.bin", "");
  t.write("top", "x");
  auto root = open_root(t.path());
  ASSERT_TRUE(root);
  auto w = walk(root->get());
  EXPECT_EQ(rels(w.files), (std::vector<std::string>{"a/b/one.bin", "a/two.bin", "top"}));
  EXPECT_EQ(rels(w.dirs), (std::vector<std::string>{"a", "a/b"}));
  for (const auto& f : w.files) {
    if (f.rel == "a/b/one.bin") {
      EXPECT_EQ(f.st.size, 5u);
    }
  }
  EXPECT_TRUE(w.problems.empty());
}

TEST(Walk, ReportsSymlinksWithoutFollowing) {
  testing::TmpDir outside;
  outside.write("secret/file.bin", "outside");
  testing::TmpDir t;
  t.write("a/real.bin", "x");
  ASSERT_EQ(::symlink(outside.path().c_str(), (t / "a/escape").c_str()), 0);
  ASSERT_EQ(::symlink("real.bin", (t / "a/alias.bin").c_str()), 0);
  auto root = open_root(t.path());
  ASSERT_TRUE(root);
  auto w = walk(root->get());
  EXPECT_EQ(rels(w.files), (std::vector<std::string>{"a/real.bin"}));
  EXPECT_EQ(rels(w.links), (std::vector<std::string>{"a/alias.bin", "a/escape"}));
}

TEST(Walk, ReportsFifosAsOthers) {
  testing::TmpDir t;
  t.mkdir("d");
  ASSERT_EQ(::mkfifo((t / "d/pipe").c_str(), 0600), 0);
  auto root = open_root(t.path());
  auto w = walk(root->get());
  EXPECT_EQ(rels(w.others), (std::vector<std::string>{"d/pipe"}));
}

TEST(Walk, RootThatIsASymlinkIsRefused) {
  testing::TmpDir t;
  t.mkdir("real");
  ASSERT_EQ(::symlink((t / "real").c_str(), (t / "link").c_str()), 0);
  auto r = open_root(t / "link");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().line().find("symlink"), std::string::npos);
  auto missing = open_root(t / "nope");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().err, ENOENT);
}

TEST(Walk, DepthLimitIsReported) {
  testing::TmpDir t;
  t.write("a/b/c/d/f", "x");
  auto root = open_root(t.path());
  WalkOptions opt;
  opt.max_depth = 2;
  auto w = walk(root->get(), opt);
  ASSERT_EQ(w.problems.size(), 1u);
  EXPECT_EQ(w.problems[0].rel, "a/b/c");
  EXPECT_TRUE(w.files.empty());
}

TEST(OpenBeneath, RefusesEscapesAndSymlinks) {
  testing::TmpDir outside;
  outside.write("f", "outside");
  testing::TmpDir t;
  t.write("d/f", "inside");
  ASSERT_EQ(::symlink(outside.path().c_str(), (t / "out").c_str()), 0);
  ASSERT_EQ(::symlink("f", (t / "d/lnk").c_str()), 0);
  auto root = open_root(t.path());
  EXPECT_TRUE(open_file_beneath(root->get(), "d/f"));
  EXPECT_FALSE(open_file_beneath(root->get(), "../x"));
  EXPECT_FALSE(open_file_beneath(root->get(), "d/../../x"));
  EXPECT_FALSE(open_file_beneath(root->get(), "/etc/passwd"));
  EXPECT_FALSE(open_file_beneath(root->get(), "out/f"));
  EXPECT_FALSE(open_file_beneath(root->get(), "d/lnk"));
  EXPECT_FALSE(open_file_beneath(root->get(), "d"));  // not a regular file
}

TEST(StatBeneath, DoesNotFollowTheLastComponent) {
  testing::TmpDir t;
  t.write("d/f", "abc");
  ASSERT_EQ(::symlink("f", (t / "d/lnk").c_str()), 0);
  auto root = open_root(t.path());
  auto s = stat_beneath(root->get(), "d/lnk");
  ASSERT_TRUE(s);
  EXPECT_TRUE(S_ISLNK(s->mode));
  auto f = stat_beneath(root->get(), "d/f");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->size, 3u);
}

}  // namespace
}  // namespace kvstore
