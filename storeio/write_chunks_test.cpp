#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "kvtier/format/crc32.h"
#include "kvtier/format/header.h"
#include "kvtier/store_abi.h"
#include "test_chunk_builder.h"
#include "test_files.h"

namespace {

using kvformat::testing::pattern_bytes;
using kvformat::testing::state_header;
using storeio::testing::abi_segments;
using storeio::testing::read_file;
using storeio::testing::ScratchDir;

struct Fixture {
  ScratchDir dir;
  kvformat::ChunkHeader header = state_header(3000);
  std::vector<std::uint8_t> payload = pattern_bytes(header.payload_length, 11);
  std::vector<kvtier_segment> segments = abi_segments(header.segments);
  std::vector<kvtier_run> runs;
  std::string path = dir.file("chunk.bin");

  Fixture() {
    // Two runs: the payload as two slices of a capture row.
    runs = {{reinterpret_cast<std::uint64_t>(payload.data()), 10},
            {reinterpret_cast<std::uint64_t>(payload.data() + 10), payload.size() - 10}};
  }

  kvtier_write_item item(const std::string& p) {
    kvtier_write_item it{};
    it.path = p.c_str();
    it.group = header.group;
    it.namespace_hash = header.namespace_hash.data();
    it.key_hash = header.key_hash.data();
    it.key_hash_length = static_cast<std::uint32_t>(header.key_hash.size());
    it.boundary = header.boundary;
    it.payload_length = payload.size();
    it.num_segments = static_cast<std::uint32_t>(segments.size());
    it.segments = segments.data();
    it.num_runs = static_cast<std::uint32_t>(runs.size());
    it.runs = runs.data();
    return it;
  }
};

struct ClearFault {
  ~ClearFault() { kvtier_store_test_fault(KVTIER_FAULT_NONE, 0, 0, 0); }
};

TEST(WriteChunks, WritesAChunkTheCodecVerifies) {
  Fixture f;
  auto it = f.item(f.path);
  EXPECT_EQ(kvtier_write_chunks(&it, 1, 1, 0), 0);
  ASSERT_EQ(it.status, KVTIER_OK) << it.message;
  const auto bytes = read_file(f.path);
  auto parsed = kvformat::verify_chunk(bytes);
  ASSERT_TRUE(parsed) << parsed.error().message;
  auto want = f.header;
  want.payload_checksum = kvformat::crc32(f.payload);
  EXPECT_EQ(*parsed, want);
  EXPECT_EQ(it.payload_checksum, want.payload_checksum);
  EXPECT_EQ(it.header_length, want.header_length());
  EXPECT_EQ(it.file_size, bytes.size());
  EXPECT_EQ(std::vector<std::uint8_t>(bytes.begin() + it.header_length, bytes.end()), f.payload);
  EXPECT_EQ(f.dir.names(), std::vector<std::string>{"chunk.bin"}) << "no temp left";
  struct stat st {};
  ASSERT_EQ(::stat(f.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "private to the serving user";
}

// Whatever the umask: the mode is set on the descriptor, never widened.
TEST(WriteChunks, ModeIsPrivateOrGroupReadWhateverTheUmask) {
  for (const mode_t mask : {mode_t{0}, mode_t{077}, mode_t{0277}}) {
    for (const std::uint32_t flags : {0u, std::uint32_t{KVTIER_WRITE_GROUP_READ}}) {
      Fixture f;
      auto it = f.item(f.path);
      const mode_t old = ::umask(mask);
      const auto bad = kvtier_write_chunks(&it, 1, 1, flags);
      ::umask(old);
      ASSERT_EQ(bad, 0) << it.message;
      struct stat st {};
      ASSERT_EQ(::stat(f.path.c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 07777, flags ? 0640u : 0600u) << "umask " << mask;
    }
  }
}

TEST(WriteChunks, WhatIsWrittenReadsBack) {
  Fixture f;
  auto w = f.item(f.path);
  ASSERT_EQ(kvtier_write_chunks(&w, 1, 1, 0), 0);
  std::vector<std::uint8_t> dest(f.payload.size());
  kvtier_run run{reinterpret_cast<std::uint64_t>(dest.data()), dest.size()};
  kvtier_read_item r{};
  r.path = f.path.c_str();
  r.fd = -1;
  r.group = w.group;
  r.namespace_hash = w.namespace_hash;
  r.key_hash = w.key_hash;
  r.key_hash_length = w.key_hash_length;
  r.boundary = w.boundary;
  r.payload_length = w.payload_length;
  r.payload_checksum = w.payload_checksum;
  r.num_segments = w.num_segments;
  r.segments = w.segments;
  r.num_runs = 1;
  r.runs = &run;
  EXPECT_EQ(kvtier_read_chunks(&r, 1, 1, 0), 0) << r.reason;
  EXPECT_EQ(dest, f.payload);
}

TEST(WriteChunks, AnExistingFileIsReplacedWhole) {
  Fixture f;
  storeio::testing::write_file(f.path, std::vector<std::uint8_t>(100000, 0xEE));
  auto it = f.item(f.path);
  ASSERT_EQ(kvtier_write_chunks(&it, 1, 1, 0), 0);
  EXPECT_TRUE(kvformat::verify_chunk(read_file(f.path)));
}

TEST(WriteChunks, AFullDiskIsItsOwnStatusAndLeavesNothing) {
  ClearFault clear;
  for (const auto op : {KVTIER_FAULT_WRITE, KVTIER_FAULT_SYNC}) {
    Fixture f;
    kvtier_store_test_fault(op, ENOSPC, 0, 1);
    auto it = f.item(f.path);
    EXPECT_EQ(kvtier_write_chunks(&it, 1, 1, 0), 1);
    EXPECT_EQ(it.status, KVTIER_E_NO_SPACE) << op;
    EXPECT_STREQ(it.reason, "no_space");
    EXPECT_EQ(it.sys_errno, ENOSPC);
    EXPECT_TRUE(f.dir.names().empty()) << "temp removed, nothing renamed";
  }
}

TEST(WriteChunks, OtherFailuresAreIoErrorsAndLeaveNothing) {
  ClearFault clear;
  for (const auto op : {KVTIER_FAULT_SYNC, KVTIER_FAULT_RENAME, KVTIER_FAULT_DIR_SYNC}) {
    Fixture f;
    kvtier_store_test_fault(op, EIO, 0, 1);
    auto it = f.item(f.path);
    EXPECT_EQ(kvtier_write_chunks(&it, 1, 1, 0), 1);
    EXPECT_EQ(it.status, KVTIER_E_IO) << op;
    EXPECT_STREQ(it.reason, "io_error");
    EXPECT_EQ(it.sys_errno, EIO);
    EXPECT_EQ(it.file_size, 0u);
    EXPECT_TRUE(f.dir.names().empty()) << op;
  }
}

TEST(WriteChunks, AMissingFolderIsAnIoError) {
  Fixture f;
  const std::string p = f.dir.file("no/such.bin");
  auto it = f.item(p);
  EXPECT_EQ(kvtier_write_chunks(&it, 1, 1, 0), 1);
  EXPECT_STREQ(it.reason, "io_error");
  EXPECT_EQ(it.sys_errno, ENOENT);
}

// Issue 45: a chunk folder swapped for a link to elsewhere got the chunk
// (and a manifest then named it). Nothing is written through a link.
TEST(WriteChunks, AFolderOnThePathThatIsASymlinkIsRefused) {
  Fixture f;
  const std::string elsewhere = f.dir.file("elsewhere");
  ASSERT_EQ(::mkdir(elsewhere.c_str(), 0700), 0);
  const std::string link = f.dir.file("leaf");
  ASSERT_EQ(::symlink(elsewhere.c_str(), link.c_str()), 0);
  const std::string p = link + "/chunk.bin";
  auto it = f.item(p);
  EXPECT_EQ(kvtier_write_chunks(&it, 1, 1, 0), 1);
  EXPECT_EQ(it.status, KVTIER_E_IO);
  EXPECT_STREQ(it.reason, "io_error");
  EXPECT_EQ(it.sys_errno, ELOOP);
  EXPECT_NE(std::string(it.message).find("symlink"), std::string::npos) << it.message;
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere)) << "nothing written through the link";
}

TEST(WriteChunks, BadFieldsAreRefusedBeforeAnyFile) {
  {
    Fixture f;
    auto it = f.item(f.path);
    it.payload_length += 1;
    EXPECT_EQ(kvtier_write_chunks(&it, 1, 1, 0), 1);
    EXPECT_EQ(it.status, KVTIER_E_ARGUMENT);
  }
  {
    Fixture f;
    f.segments[0].kind = 9;
    auto it = f.item(f.path);
    EXPECT_EQ(kvtier_write_chunks(&it, 1, 1, 0), 1);
    EXPECT_STREQ(it.reason, "bad_argument");
    EXPECT_TRUE(f.dir.names().empty());
  }
}

TEST(WriteChunks, ManyItemsOnManyThreadsOneFullDisk) {
  ClearFault clear;
  Fixture f;
  constexpr std::size_t kItems = 16;
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < kItems; ++i) paths.push_back(f.dir.file("c" + std::to_string(i)));
  std::vector<kvtier_write_item> items;
  for (const auto& p : paths) items.push_back(f.item(p));
  kvtier_store_test_fault(KVTIER_FAULT_SYNC, ENOSPC, 5, 1);
  EXPECT_EQ(kvtier_write_chunks(items.data(), kItems, 4, 0), 1);
  std::size_t full = 0;
  for (std::size_t i = 0; i < kItems; ++i) {
    if (items[i].status == KVTIER_E_NO_SPACE) {
      ++full;
      EXPECT_FALSE(std::filesystem::exists(paths[i]));
    } else {
      EXPECT_EQ(items[i].status, KVTIER_OK) << items[i].message;
      EXPECT_TRUE(kvformat::verify_chunk(read_file(paths[i]))) << i;
    }
  }
  EXPECT_EQ(full, 1u);
  EXPECT_EQ(f.dir.names().size(), kItems - 1) << "no temp left";
}

}  // namespace
