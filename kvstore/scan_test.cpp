#include "kvtier/kvstore/scan.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <gtest/gtest.h>

#include "kvtier/format/crc32.h"
#include "kvtier/format/header.h"
#include "kvtier/format/layout.h"
#include "kvtier/format/pending_record.h"
#include "test_tmpdir.h"

namespace kvstore {
namespace {

using testing::TmpDir;

constexpr const char* kRank = "glm53kv_m_0123456789abcdef_r0";

std::string key_hex(int i) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%02x%030x", 0x10 + i, i);
  return buf;
}

// One valid full-group chunk of `payload_bytes`, as the writer lays it out.
std::string chunk_bytes(const std::string& key, uint32_t group, uint64_t payload_bytes) {
  std::vector<kvformat::SegmentSpec> specs = {{0, kvformat::SegmentKind::Kv, kvformat::DType::Uint8, {payload_bytes}, {1}}};
  kvformat::ChunkHeader h;
  h.group = group;
  h.key_hash = kvformat::from_hex(key).value();
  h.boundary = 64;
  h.segments = kvformat::make_segments(specs);
  std::vector<uint8_t> payload(payload_bytes);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 31 + 7);
  h.payload_length = payload.size();
  h.payload_checksum = kvformat::crc32(payload);
  auto bytes = kvformat::encode_header(h).value();
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return std::string(bytes.begin(), bytes.end());
}

std::string chunk_rel(const std::string& key, uint32_t group) { return kvformat::chunk_rel_path(key, group).value(); }

struct Scanned {
  RankInventory inv;
  bool has(FindingKind kind, const std::string& rel) const {
    return std::any_of(inv.findings.begin(), inv.findings.end(),
                       [&](const Finding& f) { return f.kind == kind && f.rel == rel; });
  }
};

Scanned scan(const TmpDir& tier, bool payloads = false) {
  auto root = open_root(tier.path());
  EXPECT_TRUE(root.ok());
  ScanOptions o;
  o.payloads = payloads;
  o.threads = 2;
  o.now_ns = INT64_MAX / 2;  // everything is older than the grace period
  auto inv = scan_rank(root->get(), kRank, kRank, o);
  EXPECT_TRUE(inv.ok());
  return {std::move(*inv)};
}

std::string in_rank(const std::string& rel) { return std::string(kRank) + "/" + rel; }

TEST(Scan, ChunksComeSortedByPathWithTheirOwnFields) {
  TmpDir tier;
  std::vector<std::string> rels;
  for (int i = 0; i < 150; ++i) {
    const auto k = key_hex((i * 37) % 150);  // written out of order, in many folders
    const uint32_t group = static_cast<uint32_t>(i % 3);
    tier.write(in_rank(chunk_rel(k, group)), chunk_bytes(k, group, 10 + i));
    rels.push_back(in_rank(chunk_rel(k, group)));
  }
  auto s = scan(tier, true);
  std::sort(rels.begin(), rels.end());
  ASSERT_EQ(s.inv.chunks.size(), rels.size());
  for (size_t i = 0; i < rels.size(); ++i) {
    const ChunkRec& c = s.inv.chunks[i];
    EXPECT_EQ(c.rel, rels[i]);
    // Each record still carries its own file's facts after the reorder.
    EXPECT_EQ(in_rank(chunk_rel(c.key, c.group)), c.rel);
    EXPECT_EQ(c.st.size, c.header_length + c.payload_len);
    EXPECT_TRUE(c.payload_ok) << c.rel;
  }
}

TEST(Scan, ClassifiesChunksTempsAndForeignFiles) {
  TmpDir tier;
  const auto k = key_hex(1);
  tier.write(in_rank(chunk_rel(k, 0)), chunk_bytes(k, 0, 100));
  tier.write(in_rank(chunk_rel(k, 0) + ".tmp.12.34"), "partial");
  tier.write(in_rank("notes.txt"), "x");
  // A valid chunk name under another key's fan-out folders: foreign, not moved or guessed.
  const auto other = key_hex(2);
  std::string wrong = chunk_rel(other, 0);
  wrong = wrong.substr(0, wrong.rfind('/') + 1) + k + ".bin";
  tier.write(in_rank(wrong), chunk_bytes(k, 0, 100));
  auto s = scan(tier);
  ASSERT_EQ(s.inv.chunks.size(), 1u);
  EXPECT_EQ(s.inv.chunks[0].key, k);
  EXPECT_TRUE(s.inv.chunks[0].header_ok);
  EXPECT_EQ(s.inv.chunks[0].boundary, 64u);
  EXPECT_EQ(s.inv.temps.size(), 1u);
  EXPECT_TRUE(s.has(FindingKind::kForeign, in_rank("notes.txt")));
  EXPECT_TRUE(s.has(FindingKind::kForeign, in_rank(wrong)));
  EXPECT_TRUE(s.has(FindingKind::kOrphan, in_rank(chunk_rel(k, 0))));
  EXPECT_TRUE(s.inv.manifests_readable);
}

TEST(Scan, ManifestsFolderThatIsASymlinkMakesTheRankUnreadable) {
  TmpDir tier;
  const auto k = key_hex(1);
  tier.write(in_rank(chunk_rel(k, 0)), chunk_bytes(k, 0, 100));
  tier.mkdir("elsewhere");
  std::filesystem::create_directory_symlink(tier / "elsewhere", tier / in_rank("manifests"));
  auto s = scan(tier);
  EXPECT_FALSE(s.inv.manifests_readable);
  EXPECT_TRUE(s.has(FindingKind::kSymlink, in_rank("manifests")));
  EXPECT_TRUE(s.has(FindingKind::kUnreadable, in_rank("manifests")));
}

TEST(Scan, PendingRecordProtectsChunksOnlyWhileItsWriterHoldsIt) {
  TmpDir tier;
  const auto k = key_hex(3);
  tier.write(in_rank(chunk_rel(k, 0)), chunk_bytes(k, 0, 100));
  tier.write(in_rank("pending/41.42.json"), kvformat::encode_pending_record({{0, k}}).value());
  int fd = ::open((tier / in_rank("pending/41.42.json")).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH), 0);  // the writer is alive
  auto live = scan(tier);
  ASSERT_EQ(live.inv.pendings.size(), 1u);
  EXPECT_TRUE(live.inv.pendings[0].live);
  ASSERT_EQ(live.inv.chunks.size(), 1u);
  EXPECT_TRUE(live.inv.chunks[0].pending);
  EXPECT_FALSE(live.has(FindingKind::kOrphan, in_rank(chunk_rel(k, 0))));
  ::close(fd);  // the writer exits
  auto dead = scan(tier);
  ASSERT_EQ(dead.inv.pendings.size(), 1u);
  EXPECT_FALSE(dead.inv.pendings[0].live);
  EXPECT_FALSE(dead.inv.chunks[0].pending);
  EXPECT_TRUE(dead.has(FindingKind::kOrphan, in_rank(chunk_rel(k, 0))));
  EXPECT_TRUE(dead.has(FindingKind::kStaleTemp, in_rank("pending/41.42.json")));
}

TEST(Scan, LiveWritersUnparsablePendingRecordIsReported) {
  TmpDir tier;
  tier.write(in_rank("pending/5.6.json"), "{\"chunks\":");
  int fd = ::open((tier / in_rank("pending/5.6.json")).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH), 0);
  auto s = scan(tier);
  EXPECT_TRUE(s.has(FindingKind::kBadPending, in_rank("pending/5.6.json")));
  ::close(fd);
}

// verify's payload check, for a chunk read whole with its header and for one
// that needs the separate pass (payload beyond the first 512 KiB read).
TEST(Scan, PayloadPassFindsAFlippedByteInSmallAndLargeChunks) {
  for (uint64_t payload : {uint64_t{1000}, uint64_t{3} << 20}) {
    TmpDir tier;
    const auto good = key_hex(4), bad = key_hex(5);
    tier.write(in_rank(chunk_rel(good, 0)), chunk_bytes(good, 0, payload));
    auto bytes = chunk_bytes(bad, 0, payload);
    bytes[bytes.size() - 7] ^= 0x10;
    tier.write(in_rank(chunk_rel(bad, 0)), bytes);
    auto s = scan(tier, true);
    ASSERT_EQ(s.inv.chunks.size(), 2u) << payload;
    EXPECT_FALSE(s.has(FindingKind::kCorrupt, in_rank(chunk_rel(good, 0)))) << payload;
    EXPECT_TRUE(s.has(FindingKind::kCorrupt, in_rank(chunk_rel(bad, 0)))) << payload;
    for (const auto& c : s.inv.chunks) EXPECT_EQ(c.payload_ok, c.key == good) << payload;
  }
}

}  // namespace
}  // namespace kvstore
