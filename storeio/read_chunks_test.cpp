#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "fcntl.h"
#include "kvtier/format/crc32.h"
#include "kvtier/store_abi.h"
#include "test_chunk_builder.h"
#include "test_files.h"
#include "test_read_fixture.h"

namespace {

using kvformat::testing::make_chunk;
using kvformat::testing::pattern_bytes;
using kvformat::testing::state_header;
using storeio::testing::abi_segments;
using storeio::testing::ScratchDir;
using storeio::testing::Fixture;
using storeio::testing::read_item;
using storeio::testing::write_file;

TEST(ReadChunks, GoodFileLandsInTheRuns) {
  Fixture f;
  EXPECT_EQ(kvtier_read_chunks(&f.item, 1, 1, 0), 0);
  EXPECT_EQ(f.item.status, KVTIER_OK);
  EXPECT_STREQ(f.item.reason, "");
  EXPECT_EQ(f.item.bytes_read, f.payload.size());
  EXPECT_EQ(f.landed(), f.payload);
}

TEST(ReadChunks, TheReadaheadHintChangesNoVerdict) {
  Fixture f;
  EXPECT_EQ(kvtier_read_chunks(&f.item, 1, 1, KVTIER_READ_WILLNEED), 0);
  EXPECT_EQ(f.landed(), f.payload);
  f.file[f.file.size() - 1] ^= 1;
  storeio::testing::write_file(f.path, f.file);
  EXPECT_EQ(kvtier_read_chunks(&f.item, 1, 1, KVTIER_READ_WILLNEED), 1);
  EXPECT_STREQ(f.item.reason, "payload_checksum_mismatch");
}

TEST(ReadChunks, AnOpenDescriptorIsReadAndKeptOpen) {
  Fixture f;
  const int fd = ::open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  f.item.path = nullptr;
  f.item.fd = fd;
  EXPECT_EQ(f.read(), "");
  EXPECT_EQ(f.landed(), f.payload);
  EXPECT_EQ(::fcntl(fd, F_GETFD), 0) << "the caller's descriptor must stay open";
  ::close(fd);
}

TEST(ReadChunks, EachExpectationHasItsReason) {
  {
    Fixture f;
    std::vector<std::uint8_t> other(f.header.namespace_hash.begin(), f.header.namespace_hash.end());
    other[31] ^= 1;
    f.item.namespace_hash = other.data();
    EXPECT_EQ(f.read(), "foreign_namespace");
    EXPECT_EQ(f.item.status, KVTIER_E_MISMATCH);
  }
  {
    Fixture f;
    f.item.group += 1;
    EXPECT_EQ(f.read(), "wrong_group");
  }
  {
    Fixture f;
    std::vector<std::uint8_t> key = f.header.key_hash;
    key[0] ^= 1;
    f.item.key_hash = key.data();
    EXPECT_EQ(f.read(), "wrong_key");
  }
  {
    Fixture f;  // a prefix of the right key is another key
    f.item.key_hash_length -= 1;
    EXPECT_EQ(f.read(), "wrong_key");
  }
  {
    Fixture f;
    f.item.boundary += 512;
    EXPECT_EQ(f.read(), "wrong_boundary");
  }
  {
    Fixture f;
    f.item.payload_checksum ^= 1;
    EXPECT_EQ(f.read(), "manifest_mismatch");
  }
  {
    Fixture f;  // the manifest claims a shorter payload (runs to match)
    f.item.payload_length -= 1;
    f.runs[2].length -= 1;
    EXPECT_EQ(f.read(), "manifest_mismatch");
  }
  {
    Fixture f;
    f.segments[0].stride[0] += 1;
    EXPECT_EQ(f.read(), "layout_mismatch");
  }
  {
    Fixture f;  // one segment fewer than the file's table
    f.item.num_segments -= 1;
    EXPECT_EQ(f.read(), "layout_mismatch");
  }
}

TEST(ReadChunks, BadHeadersGetTheCodecsReason) {
  {
    Fixture f;
    f.file[0] = 'X';
    write_file(f.path, f.file);
    EXPECT_EQ(f.read(), "bad_magic");
    EXPECT_EQ(f.item.status, KVTIER_E_FORMAT);
  }
  {
    Fixture f;
    f.file[20] ^= 0x40;  // inside the namespace hash: the header CRC catches it
    write_file(f.path, f.file);
    EXPECT_EQ(f.read(), "header_checksum_mismatch");
  }
  {
    Fixture f;
    write_file(f.path, std::vector<std::uint8_t>(f.file.begin(), f.file.begin() + 100));
    EXPECT_EQ(f.read(), "truncated");
  }
}

TEST(ReadChunks, WrongSizesAreRefused) {
  {
    Fixture f;
    f.file.pop_back();
    write_file(f.path, f.file);
    EXPECT_EQ(f.read(), "truncated");
  }
  {
    Fixture f;
    f.file.push_back(0);
    write_file(f.path, f.file);
    EXPECT_EQ(f.read(), "trailing_bytes");
  }
}

TEST(ReadChunks, AFlippedPayloadByteIsAChecksumMismatch) {
  Fixture f;
  f.file[f.file.size() - 2000] ^= 0x01;
  write_file(f.path, f.file);
  EXPECT_EQ(f.read(4), "payload_checksum_mismatch");
  EXPECT_EQ(f.item.status, KVTIER_E_FORMAT);
}

TEST(ReadChunks, MissingSymlinkAndFifoAreRefused) {
  {
    Fixture f;
    ::unlink(f.path.c_str());
    EXPECT_EQ(f.read(), "missing_file");
    EXPECT_EQ(f.item.status, KVTIER_E_MISSING);
    EXPECT_NE(std::string(f.item.message).find(f.path), std::string::npos);
  }
  {
    Fixture f;  // a link to a good chunk is still never followed
    const std::string link = f.dir.file("link.bin");
    ASSERT_EQ(::symlink(f.path.c_str(), link.c_str()), 0);
    f.item.path = link.c_str();
    EXPECT_EQ(f.read(), "io_error");
    EXPECT_EQ(f.item.sys_errno, ELOOP);
    EXPECT_EQ(f.item.bytes_read, 0u);
  }
  {
    Fixture f;  // a FIFO must not hang the call
    const std::string fifo = f.dir.file("fifo.bin");
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    f.item.path = fifo.c_str();
    EXPECT_EQ(f.read(), "io_error");
    EXPECT_EQ(f.item.sys_errno, EINVAL);
  }
}

// Issue 45: a folder on the path swapped for a link to a folder holding a
// good chunk (a chunk folder, manifests/, the rank folder) was followed.
TEST(ReadChunks, AFolderOnThePathThatIsASymlinkIsRefused) {
  Fixture f;
  const std::string real = f.dir.file("real");
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::rename(f.path.c_str(), (real + "/chunk.bin").c_str()), 0);
  const std::string link = f.dir.file("leaf");
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  const std::string through = link + "/chunk.bin";
  f.item.path = through.c_str();
  EXPECT_EQ(f.read(), "io_error");
  EXPECT_EQ(f.item.status, KVTIER_E_IO);
  EXPECT_EQ(f.item.sys_errno, ELOOP);
  EXPECT_NE(std::string(f.item.message).find("symlink"), std::string::npos) << f.item.message;
  EXPECT_EQ(f.item.bytes_read, 0u);
  EXPECT_EQ(f.landed(), std::vector<std::uint8_t>(f.payload.size(), 0)) << "nothing read";
  // The same file by its real path reads fine.
  const std::string direct = real + "/chunk.bin";
  f.item.path = direct.c_str();
  EXPECT_EQ(f.read(), "");
}

// Issue 45 and 47: the restore asks the library to check a chunk file's two
// folders (<hhh>/<hh>_g<g>/) in the read call, off the GIL.
TEST(ReadChunks, SafeFoldersRefusesAChunkFolderOthersCouldChange) {
  Fixture f;
  const std::string top = f.dir.file("abc"), leaf = top + "/de_g0";
  ASSERT_EQ(::mkdir(top.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir(leaf.c_str(), 0700), 0);
  const std::string path = leaf + "/chunk.bin";
  ASSERT_EQ(::rename(f.path.c_str(), path.c_str()), 0);
  f.item.path = path.c_str();
  auto read = [&](std::uint32_t flags) {
    std::fill(f.dest_a.begin(), f.dest_a.end(), 0);
    std::fill(f.dest_b.begin(), f.dest_b.end(), 0);
    std::fill(f.dest_c.begin(), f.dest_c.end(), 0);
    kvtier_read_chunks(&f.item, 1, 1, flags);
    return std::string(f.item.reason);
  };
  EXPECT_EQ(read(KVTIER_READ_SAFE_FOLDERS), "");
  EXPECT_EQ(f.landed(), f.payload);
  for (const auto& [folder, mode, shown, says] :
       {std::tuple{leaf, 0777, " (mode 0777", "group- and world-writable"},
        std::tuple{top, 0720, " (mode 0720", "group-writable"},
        std::tuple{top, 0702, " (mode 0702", "world-writable"}}) {
    ASSERT_EQ(::chmod(folder.c_str(), mode), 0);
    EXPECT_EQ(read(KVTIER_READ_SAFE_FOLDERS), "unsafe_folder") << folder;
    EXPECT_EQ(f.item.status, KVTIER_E_UNSAFE);
    const std::string message = f.item.message;
    EXPECT_NE(message.find(folder + shown), std::string::npos) << message;
    EXPECT_NE(message.find(says), std::string::npos) << message;
    EXPECT_EQ(f.landed(), std::vector<std::uint8_t>(f.payload.size(), 0)) << "nothing read";
    EXPECT_EQ(read(0), "") << "the check is the flag's";
    ASSERT_EQ(::chmod(folder.c_str(), 0700), 0);
  }
  // A chunk folder swapped for a link: named as a link before any open.
  const std::string real = f.dir.file("real");
  ASSERT_EQ(::rename(leaf.c_str(), real.c_str()), 0);
  ASSERT_EQ(::symlink(real.c_str(), leaf.c_str()), 0);
  EXPECT_EQ(read(KVTIER_READ_SAFE_FOLDERS), "unsafe_folder");
  EXPECT_NE(std::string(f.item.message).find(leaf + " is a symlink"), std::string::npos)
      << f.item.message;
  // A folder not made yet is the open's to report.
  ASSERT_EQ(::unlink(leaf.c_str()), 0);
  EXPECT_EQ(read(KVTIER_READ_SAFE_FOLDERS), "missing_file");
}

TEST(ReadChunks, AnUnknownFlagRefusesTheCall) {
  Fixture f;
  EXPECT_EQ(kvtier_read_chunks(&f.item, 1, 1, 1u << 7), -1);
  EXPECT_EQ(kvtier_read_chunks(nullptr, 0, 1, 1u << 7), -1);
  EXPECT_EQ(f.landed(), std::vector<std::uint8_t>(f.payload.size(), 0)) << "nothing read";
}

TEST(ReadChunks, RunsThatDoNotHoldThePayloadAreABadArgument) {
  Fixture f;
  f.runs[1].length += 1;
  EXPECT_EQ(f.read(), "bad_argument");
  EXPECT_EQ(f.item.status, KVTIER_E_ARGUMENT);
}

TEST(ReadChunks, AReadErrorIsAnIoError) {
  Fixture f;
  kvtier_store_test_fault(KVTIER_FAULT_READ, EIO, 0, 1);
  EXPECT_EQ(f.read(), "io_error");
  kvtier_store_test_fault(KVTIER_FAULT_NONE, 0, 0, 0);
  EXPECT_EQ(f.item.sys_errno, EIO);
  EXPECT_EQ(f.read(), "") << "the fault was used up";
}

TEST(ReadChunks, APacedReadTakesItsBytesOverThePace) {
  // The slow store of the GPU suite's guard stage: the payload cannot arrive
  // faster than the pace, and the bytes are the same.
  Fixture f;
  const std::uint64_t pace = f.payload.size() * 4;  // a quarter second's worth
  kvtier_store_test_pace_reads(pace);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string verdict = f.read();  // "" when the item is OK
  const auto took = std::chrono::steady_clock::now() - t0;
  kvtier_store_test_pace_reads(0);
  EXPECT_EQ(verdict, "");
  EXPECT_GE(took, std::chrono::milliseconds(240));
  EXPECT_EQ(std::memcmp(f.dest_b.data(), f.payload.data() + 7, f.dest_b.size()), 0);
}

TEST(ReadChunks, ManyItemsOnManyThreadsEachGetTheirOwnVerdict) {
  // 24 copies of the fixture's chunk, every third one with a flipped byte.
  Fixture f;
  constexpr std::size_t kItems = 24;
  std::vector<std::string> paths;
  std::vector<std::vector<std::uint8_t>> dest(kItems);
  std::vector<std::vector<kvtier_run>> runs(kItems);
  std::vector<kvtier_read_item> items;
  for (std::size_t i = 0; i < kItems; ++i) {
    paths.push_back(f.dir.file("c" + std::to_string(i) + ".bin"));
    auto bytes = f.file;
    if (i % 3 == 2) bytes[bytes.size() - 1 - i] ^= 0x80;
    write_file(paths.back(), bytes);
  }
  for (std::size_t i = 0; i < kItems; ++i) {
    dest[i].assign(f.payload.size(), 0);
    runs[i] = {{reinterpret_cast<std::uint64_t>(dest[i].data()), dest[i].size()}};
    kvtier_read_item it = f.expect(paths[i].c_str());
    it.runs = runs[i].data();
    it.num_runs = 1;
    items.push_back(it);
  }
  EXPECT_EQ(kvtier_read_chunks(items.data(), kItems, 4, 0), 8);
  for (std::size_t i = 0; i < kItems; ++i) {
    if (i % 3 == 2) {
      EXPECT_STREQ(items[i].reason, "payload_checksum_mismatch") << i;
    } else {
      EXPECT_EQ(items[i].status, KVTIER_OK) << i;
      EXPECT_EQ(dest[i], f.payload) << i;
    }
  }
  // Stop on failure, one thread: the first bad one ends the call.
  EXPECT_EQ(kvtier_read_chunks(items.data(), kItems, 1, KVTIER_READ_STOP_ON_FAILURE), 22);
  EXPECT_EQ(items[1].status, KVTIER_OK);
  EXPECT_STREQ(items[2].reason, "payload_checksum_mismatch");
  EXPECT_STREQ(items[3].reason, "skipped");
  EXPECT_EQ(items[3].status, KVTIER_E_SKIPPED);
}

TEST(ReadChunks, OneBigFileIsSplitAcrossTheThreadsAndStillVerified) {
  // 13 MiB over runs that cross the 4 MiB part boundaries at odd places.
  ScratchDir dir;
  kvformat::ChunkHeader header = state_header((13 << 20) - 44);
  const auto payload = pattern_bytes(header.payload_length, 21);
  header.payload_checksum = kvformat::crc32(payload);
  auto file = make_chunk(header, payload);
  const std::string path = dir.file("big.bin");
  write_file(path, file);
  const auto segments = abi_segments(header.segments);
  std::vector<std::uint8_t> dest(payload.size());
  const auto base = reinterpret_cast<std::uint64_t>(dest.data());
  const std::uint64_t cuts[] = {0, 7, (4 << 20) + 3, (9 << 20) - 1, payload.size()};
  std::vector<kvtier_run> runs;
  for (int i = 0; i < 4; ++i) runs.push_back({base + cuts[i], cuts[i + 1] - cuts[i]});
  kvtier_read_item item = read_item(header, segments, path.c_str(), runs.data(),
                                    static_cast<std::uint32_t>(runs.size()));
  EXPECT_EQ(kvtier_read_chunks(&item, 1, 4, 0), 0) << item.message;
  EXPECT_EQ(item.bytes_read, payload.size());
  EXPECT_EQ(dest, payload);
  // A flipped byte in each part is still found.
  for (const std::uint64_t at : {std::uint64_t{5}, std::uint64_t{(6 << 20)}, payload.size() - 1}) {
    auto bad = file;
    bad[file.size() - payload.size() + at] ^= 0x10;
    write_file(path, bad);
    EXPECT_EQ(kvtier_read_chunks(&item, 1, 4, 0), 1) << at;
    EXPECT_STREQ(item.reason, "payload_checksum_mismatch") << at;
  }
  // A read error in one part fails the file.
  write_file(path, file);
  kvtier_store_test_fault(KVTIER_FAULT_READ, EIO, 2, 1);
  EXPECT_EQ(kvtier_read_chunks(&item, 1, 4, 0), 1);
  kvtier_store_test_fault(KVTIER_FAULT_NONE, 0, 0, 0);
  EXPECT_STREQ(item.reason, "io_error");
}

TEST(ReadChunks, NoItemsIsNothingAndNullItemsAreRefused) {
  EXPECT_EQ(kvtier_read_chunks(nullptr, 0, 1, 0), 0);
  EXPECT_EQ(kvtier_read_chunks(nullptr, 3, 1, 0), -1);
}

TEST(StoreAbi, VersionsAreTheBuildsOwn) {
  EXPECT_EQ(kvtier_store_abi_version(), KVTIER_STORE_ABI_VERSION);
  EXPECT_STRNE(kvtier_store_library_version(), "");
}

}  // namespace
