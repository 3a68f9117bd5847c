#include "kvtier/kvstore/atomic_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "test_tmpdir.h"

namespace kvstore {
namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(AtomicFile, ReplacesContentAndLeavesNoTemp) {
  testing::TmpDir t;
  t.write("kvstore.prom", "old\n");
  ASSERT_TRUE(write_file_atomic(t / "kvstore.prom", "new\n"));
  EXPECT_EQ(slurp(t / "kvstore.prom"), "new\n");
  size_t n = 0;
  for (auto& e : std::filesystem::directory_iterator(t.path())) {
    (void)e;
    ++n;
  }
  EXPECT_EQ(n, 1u);
}

TEST(AtomicFile, MissingDirectoryIsAnIoError) {
  testing::TmpDir t;
  auto r = write_file_atomic(t / "no/such/dir/x.prom", "x");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().kind, ErrorKind::kIo);
  EXPECT_EQ(r.error().err, ENOENT);
}

}  // namespace
}  // namespace kvstore
