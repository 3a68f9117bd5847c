#include "kvtier/kvstore/lock.h"

#include <gtest/gtest.h>

#include "test_tmpdir.h"

namespace kvstore {
namespace {

using std::chrono::milliseconds;

TEST(StoreLock, ExclusiveWaitsForSharedHolderThenTimesOut) {
  testing::TmpDir t;
  auto root = open_root(t.path());
  ASSERT_TRUE(root);
  auto writer = lock_shared(root->get(), milliseconds(100));
  ASSERT_TRUE(writer);
  auto second_writer = lock_shared(root->get(), milliseconds(100));
  EXPECT_TRUE(second_writer);  // writers share
  auto gc = lock_exclusive(root->get(), milliseconds(30));
  ASSERT_FALSE(gc);
  EXPECT_EQ(gc.error().kind, ErrorKind::kRefused);
  EXPECT_TRUE(t.exists(".lock"));
}

TEST(StoreLock, ExclusiveSucceedsOnceWritersRelease) {
  testing::TmpDir t;
  auto root = open_root(t.path());
  {
    auto writer = lock_shared(root->get(), milliseconds(100));
    ASSERT_TRUE(writer);
  }
  auto gc = lock_exclusive(root->get(), milliseconds(100));
  ASSERT_TRUE(gc);
  auto writer = lock_shared(root->get(), milliseconds(20));
  EXPECT_FALSE(writer);  // and a writer waits for the sweep
}

}  // namespace
}  // namespace kvstore
