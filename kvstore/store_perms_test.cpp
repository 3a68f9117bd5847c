#include "kvtier/kvstore/store_perms.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "kvtier/kvstore/lock.h"
#include "kvtier/kvstore/walk.h"
#include "test_tmpdir.h"

namespace kvstore {
namespace {

// mkdtemp's folder is 0700 and owned by us; /tmp above is root's 1777.
TEST(StorePerms, APrivateStoreUnderASharedStickyFolderIsSafe) {
  testing::TmpDir t;
  t.mkdir("kv");
  ASSERT_EQ(::chmod((t / "kv").c_str(), 0700), 0);
  EXPECT_EQ(unsafe_store_folder(t / "kv", ::geteuid()), std::nullopt);
  EXPECT_EQ(unsafe_store_folder(t / "kv/not-made-yet", ::geteuid()), std::nullopt);
}

TEST(StorePerms, AWritableStoreFolderIsNamedWithItsMode) {
  testing::TmpDir t;
  t.mkdir("kv");
  for (const mode_t mode : {0777, 0770, 0703, 01777}) {
    ASSERT_EQ(::chmod((t / "kv").c_str(), mode), 0);
    const auto p = unsafe_store_folder(t / "kv", ::geteuid());
    ASSERT_TRUE(p) << std::oct << mode;
    EXPECT_NE(p->find(t / "kv" + " (mode "), std::string::npos) << *p;
    EXPECT_NE(p->find("-writable"), std::string::npos) << *p;
  }
}

TEST(StorePerms, AWritableFolderAboveIsRefusedUnlessRootsAndSticky) {
  testing::TmpDir t;
  t.mkdir("up/kv");
  ASSERT_EQ(::chmod((t / "up").c_str(), 0777), 0);
  const auto p = unsafe_store_folder(t / "up/kv", ::geteuid());
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, t / "up" + " (mode 0777, uid " + std::to_string(::geteuid()) + ") is group- and world-writable");
  if (::geteuid() == 0) {  // root-owned and sticky: like /tmp
    ASSERT_EQ(::chmod((t / "up").c_str(), 01777), 0);
    EXPECT_EQ(unsafe_store_folder(t / "up/kv", 0), std::nullopt);
  }
}

TEST(StorePerms, ASymlinkOnTheWayAndAnotherOwnerAreRefused) {
  testing::TmpDir t;
  t.mkdir("real/kv");
  ASSERT_EQ(::symlink((t / "real").c_str(), (t / "link").c_str()), 0);
  const auto p = unsafe_store_folder(t / "link/kv", ::geteuid());
  ASSERT_TRUE(p);
  EXPECT_EQ(*p, t / "link" + " is a symlink");
  if (::geteuid() != 0) GTEST_SKIP() << "chown needs root";
  ASSERT_EQ(::chmod((t / "real/kv").c_str(), 0700), 0);
  ASSERT_EQ(::chown((t / "real/kv").c_str(), 65534, 65534), 0);
  const auto other = unsafe_store_folder(t / "real/kv", 0);
  ASSERT_TRUE(other);
  EXPECT_EQ(*other, t / "real/kv" + " (mode 0700, uid 65534) is owned by another user");
}

TEST(StorePerms, TheLockFileIsCreatedPrivateWhateverTheUmask) {
  testing::TmpDir t;
  const mode_t old = ::umask(0);
  {
    auto root = open_root(t.path());
    ASSERT_TRUE(root);
    auto lock = lock_shared(root->get(), std::chrono::milliseconds(100));
    ASSERT_TRUE(lock);
  }
  ::umask(old);
  struct stat st;
  ASSERT_EQ(::stat((t / ".lock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

}  // namespace
}  // namespace kvstore
