#include "kvtier/kvstore/scan.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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
  std::snprintf(buf, sizeof buf, "%02x%030x", (0x10 + i) & 0xff, i);
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

// now_ns defaults to "everything is older than the grace period".
Scanned scan(const TmpDir& tier, bool payloads = false, bool stat_chunks = true, int64_t now_ns = INT64_MAX / 2) {
  auto root = open_root(tier.path());
  EXPECT_TRUE(root.ok());
  ScanOptions o;
  o.payloads = payloads;
  o.stat_chunks = stat_chunks;
  o.threads = 2;
  o.now_ns = now_ns;
  auto inv = scan_rank(root->get(), kRank, kRank, o);
  EXPECT_TRUE(inv.ok());
  return {std::move(*inv)};
}

std::string in_rank(const std::string& rel) { return std::string(kRank) + "/" + rel; }

TEST(Scan, ChunksComeSortedByPathWithTheirOwnFields) {
  TmpDir tier;
  std::vector<std::string> rels;
  uint64_t bytes = 0;
  // More than two walkers' batches of 256, so records cross hand-overs.
  for (int i = 0; i < 700; ++i) {
    const auto k = key_hex((i * 37) % 700);  // written out of order, in many folders
    const uint32_t group = static_cast<uint32_t>(i % 3);
    const auto data = chunk_bytes(k, group, 10 + i);
    tier.write(in_rank(chunk_rel(k, group)), data);
    rels.push_back(in_rank(chunk_rel(k, group)));
    bytes += data.size();
  }
  auto s = scan(tier, true);
  std::sort(rels.begin(), rels.end());
  ASSERT_EQ(s.inv.chunks.size(), rels.size());
  EXPECT_EQ(s.inv.bytes_total, bytes);
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

TEST(Scan, ReportsForeignFoldersAtEveryDepthOfTheFanOut) {
  TmpDir tier;
  const auto k = key_hex(1);
  const std::string chunk = chunk_rel(k, 0);
  const std::string leaf = chunk.substr(0, chunk.rfind('/'));
  const std::string top = leaf.substr(0, leaf.find('/'));
  tier.write(in_rank(chunk), chunk_bytes(k, 0, 100));
  tier.write(in_rank("xyz/a"), "x");             // not a top folder
  tier.write(in_rank(top + "/zz/a"), "x");       // not a leaf folder
  tier.write(in_rank(leaf + "/deeper/a"), "x");  // nothing nests in a leaf
  auto s = scan(tier);
  ASSERT_EQ(s.inv.chunks.size(), 1u);
  std::vector<std::string> foreign;
  for (const auto& f : s.inv.findings)
    if (f.kind == FindingKind::kForeign) foreign.push_back(f.rel);
  std::sort(foreign.begin(), foreign.end());
  std::vector<std::string> want{in_rank(leaf + "/deeper"), in_rank(top + "/zz"), in_rank("xyz")};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(foreign, want);
}

TEST(Scan, ManifestsFolderThatIsASymlinkMakesTheRankUnreadable) {
  TmpDir tier;
  const auto k = key_hex(1);
  tier.write(in_rank(chunk_rel(k, 0)), chunk_bytes(k, 0, 100));
  tier.mkdir("elsewhere");
  std::filesystem::create_directory_symlink(tier / "elsewhere", tier / in_rank("manifests"));
  auto s = scan(tier);
  EXPECT_FALSE(s.inv.manifests_readable);
  // Where a store folder belongs a link is an unsafe folder (issue 45).
  EXPECT_TRUE(s.has(FindingKind::kUnsafeFolder, in_rank("manifests")));
  EXPECT_TRUE(s.has(FindingKind::kUnreadable, in_rank("manifests")));
}

// Issue 45: the unsafe-folder check stopped at ROOT. Every folder of a rank
// base (the base, manifests/, pending/, each chunk folder) that others
// could change, or that is a symlink, is an unsafe-folder finding.
TEST(Scan, EveryFolderOfTheRankIsCheckedLikeTheStoreFolder) {
  const auto k = key_hex(1);
  const std::string leaf = chunk_rel(k, 0).substr(0, chunk_rel(k, 0).rfind('/'));
  const std::string top = leaf.substr(0, leaf.find('/'));
  for (const std::string& folder : {std::string(""), std::string("manifests"), std::string("pending"), top, leaf}) {
    TmpDir tier;
    tier.write(in_rank(chunk_rel(k, 0)), chunk_bytes(k, 0, 100));
    tier.mkdir(in_rank("manifests"));
    tier.mkdir(in_rank("pending"));
    const std::string rel = folder.empty() ? std::string(kRank) : in_rank(folder);
    ASSERT_EQ(::chmod((tier / rel).c_str(), 0777), 0) << rel;
    auto s = scan(tier);
    EXPECT_TRUE(s.has(FindingKind::kUnsafeFolder, rel)) << rel;
    size_t unsafe = 0;
    for (const auto& f : s.inv.findings)
      if (f.kind == FindingKind::kUnsafeFolder) {
        ++unsafe;
        EXPECT_NE(f.detail.find("group- and world-writable"), std::string::npos) << f.detail;
      }
    EXPECT_EQ(unsafe, 1u) << rel;
  }
  {  // a chunk folder that is a link to a folder holding the chunk
    TmpDir tier;
    tier.write("elsewhere/" + chunk_rel(k, 0).substr(leaf.size() + 1), chunk_bytes(k, 0, 100));
    tier.mkdir(in_rank(top));
    std::filesystem::create_directory_symlink(tier / "elsewhere", tier / in_rank(leaf));
    auto s = scan(tier);
    EXPECT_TRUE(s.has(FindingKind::kUnsafeFolder, in_rank(leaf)));
    EXPECT_TRUE(s.inv.chunks.empty()) << "nothing read through the link";
  }
  {  // modes the writer makes are fine
    TmpDir tier;
    tier.write(in_rank(chunk_rel(k, 0)), chunk_bytes(k, 0, 100));
    for (const std::string& f : {std::string(""), top, leaf})
      ::chmod((tier / (f.empty() ? std::string(kRank) : in_rank(f))).c_str(), f.empty() ? 0700 : 02750);
    auto s = scan(tier);
    for (const auto& f : s.inv.findings) EXPECT_NE(f.kind, FindingKind::kUnsafeFolder) << f.rel << ": " << f.detail;
  }
}

// A live writer's pending records could be behind it: gc must not plan
// from a scan that could not read them.
TEST(Scan, PendingFolderThatIsASymlinkOrAFileMakesTheRankUnreadable) {
  for (bool as_file : {false, true}) {
    TmpDir tier;
    const auto k = key_hex(2);
    tier.write(in_rank(chunk_rel(k, 0)), chunk_bytes(k, 0, 100));
    if (as_file) {
      tier.write(in_rank("pending"), "x");
    } else {
      tier.mkdir("elsewhere");
      std::filesystem::create_directory_symlink(tier / "elsewhere", tier / in_rank("pending"));
    }
    auto s = scan(tier);
    EXPECT_TRUE(s.has(FindingKind::kUnreadable, in_rank("pending"))) << as_file;
    EXPECT_TRUE(s.inv.manifests_readable);
  }
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
  for (bool stat_chunks : {true, false})
  for (uint64_t payload : {uint64_t{1000}, uint64_t{3} << 20}) {
    SCOPED_TRACE(stat_chunks ? "stat_chunks" : "sizes from the read");
    TmpDir tier;
    const auto good = key_hex(4), bad = key_hex(5);
    tier.write(in_rank(chunk_rel(good, 0)), chunk_bytes(good, 0, payload));
    auto bytes = chunk_bytes(bad, 0, payload);
    bytes[bytes.size() - 7] ^= 0x10;
    tier.write(in_rank(chunk_rel(bad, 0)), bytes);
    auto s = scan(tier, true, stat_chunks);
    ASSERT_EQ(s.inv.chunks.size(), 2u) << payload;
    EXPECT_FALSE(s.has(FindingKind::kCorrupt, in_rank(chunk_rel(good, 0)))) << payload;
    EXPECT_TRUE(s.has(FindingKind::kCorrupt, in_rank(chunk_rel(bad, 0)))) << payload;
    for (const auto& c : s.inv.chunks) EXPECT_EQ(c.payload_ok, c.key == good) << payload;
  }
}

// verify spares the fstat of a chunk one read returns whole: its size comes
// from the read, and its age is read only when no manifest names it.
TEST(Scan, VerifyWithoutChunkStatsJudgesSizesAndAgesAsWithThem) {
  TmpDir tier;
  const auto orphan = key_hex(6), cut = key_hex(7), longer = key_hex(8), big = key_hex(9);
  tier.write(in_rank(chunk_rel(orphan, 0)), chunk_bytes(orphan, 0, 1000));
  auto bytes = chunk_bytes(cut, 0, 1000);
  tier.write(in_rank(chunk_rel(cut, 0)), bytes.substr(0, bytes.size() - 10));
  tier.write(in_rank(chunk_rel(longer, 0)), chunk_bytes(longer, 0, 1000) + "tail");
  tier.write(in_rank(chunk_rel(big, 0)), chunk_bytes(big, 0, uint64_t{1} << 20));

  auto both = [&](int64_t now_ns) { return std::pair{scan(tier, true, true, now_ns), scan(tier, true, false, now_ns)}; };
  auto [with, without] = both(INT64_MAX / 2);
  EXPECT_EQ(without.inv.findings, with.inv.findings);
  EXPECT_TRUE(without.has(FindingKind::kOrphan, in_rank(chunk_rel(orphan, 0))));
  EXPECT_TRUE(without.has(FindingKind::kTruncated, in_rank(chunk_rel(cut, 0))));
  EXPECT_TRUE(std::any_of(without.inv.findings.begin(), without.inv.findings.end(),
                          [&](const Finding& f) { return f.rel == in_rank(chunk_rel(longer, 0)); }));
  ASSERT_EQ(without.inv.chunks.size(), 4u);
  for (const auto& c : without.inv.chunks) {
    const auto& w = *std::find_if(with.inv.chunks.begin(), with.inv.chunks.end(), [&](const ChunkRec& x) { return x.rel == c.rel; });
    EXPECT_EQ(c.st.size, w.st.size) << c.rel;
    if (c.key == big) {
      EXPECT_EQ(c.st, w.st);  // more than one read's worth: stat'ed as before
      EXPECT_TRUE(c.payload_ok);
    }
    if (c.key == orphan) {
      EXPECT_EQ(c.st.mtime_ns, w.st.mtime_ns);  // read for the orphan check
    }
  }

  // Just written: younger than the grace period, so not yet an orphan either way.
  auto [with_now, without_now] = both(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  EXPECT_FALSE(with_now.has(FindingKind::kOrphan, in_rank(chunk_rel(orphan, 0))));
  EXPECT_EQ(without_now.inv.findings, with_now.inv.findings);
}

}  // namespace
}  // namespace kvstore
