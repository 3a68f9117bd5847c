// Keyed stores through the C ABI (FORMAT.md 3.6): the writer seals (v3), the
// reader refuses a file whose MAC is missing or wrong before any other
// verdict, reads the v2 seals older stores hold, and both agree with
// format/'s seal_chunk byte for byte.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvtier/format/crc32.h"
#include "kvtier/format/header.h"
#include "kvtier/format/mac.h"
#include "kvtier/store_abi.h"
#include "test_chunk_builder.h"
#include "test_files.h"
#include "test_read_fixture.h"

namespace {

using kvformat::testing::make_chunk;
using kvformat::testing::pattern_bytes;
using kvformat::testing::state_header;
using storeio::testing::abi_segments;
using storeio::testing::read_file;
using storeio::testing::ScratchDir;
using storeio::testing::write_file;

const std::vector<std::uint8_t> kKey(32, 0x5a);
const std::vector<std::uint8_t> kOtherKey(32, 0xa5);
constexpr std::uint32_t kRank = 5;

// The salt a sealed file carries: the first half of its trailer.
kvformat::Salt salt_of(const std::vector<std::uint8_t>& file) {
  kvformat::Salt salt{};
  std::copy(file.end() - kvformat::kMacSize, file.end() - kvformat::kMacSize + kvformat::kSaltSize,
            salt.begin());
  return salt;
}

struct Keyed {
  ScratchDir dir;
  kvformat::ChunkHeader header = state_header(6000);
  std::vector<std::uint8_t> payload = pattern_bytes(header.payload_length, 9);
  std::vector<kvtier_segment> segments = abi_segments(header.segments);
  std::string path = dir.file("chunk.bin");
  std::vector<std::uint8_t> dest = std::vector<std::uint8_t>(payload.size(), 0);
  kvtier_run src{reinterpret_cast<std::uint64_t>(payload.data()), payload.size()};
  kvtier_run dst{reinterpret_cast<std::uint64_t>(dest.data()), dest.size()};

  Keyed() { header.payload_checksum = kvformat::crc32(payload); }

  // Writes the chunk through the ABI with `key` (empty: plain).
  kvtier_write_item write(const std::vector<std::uint8_t>& key) {
    kvtier_write_item it{};
    it.path = path.c_str();
    it.group = header.group;
    it.namespace_hash = header.namespace_hash.data();
    it.key_hash = header.key_hash.data();
    it.key_hash_length = static_cast<std::uint32_t>(header.key_hash.size());
    it.boundary = header.boundary;
    it.payload_length = payload.size();
    it.num_segments = static_cast<std::uint32_t>(segments.size());
    it.segments = segments.data();
    it.num_runs = 1;
    it.runs = &src;
    it.mac_key = key.empty() ? nullptr : key.data();
    it.mac_key_length = static_cast<std::uint32_t>(key.size());
    it.mac_rank = kRank;
    EXPECT_EQ(kvtier_write_chunks(&it, 1, 1, 0), 0) << it.message;
    return it;
  }

  // Reads it back with `key`; the reason ("" when OK).
  std::string read(const std::vector<std::uint8_t>& key, std::uint32_t threads = 1,
                   std::uint32_t rank = kRank) {
    kvtier_read_item it = storeio::testing::read_item(header, segments, path.c_str(), &dst, 1);
    it.mac_key = key.empty() ? nullptr : key.data();
    it.mac_key_length = static_cast<std::uint32_t>(key.size());
    it.mac_rank = rank;
    kvtier_read_chunks(&it, 1, threads, 0);
    return it.reason;
  }
};

TEST(KeyedChunks, WriterSealsAsTheCodecDoes) {
  Keyed k;
  const auto it = k.write(kKey);
  const auto bytes = read_file(k.path);
  EXPECT_EQ(it.file_size, bytes.size());
  EXPECT_EQ(kvformat::raw_version(bytes), kvformat::kSealedVersion);
  EXPECT_EQ(bytes, kvformat::seal_chunk(kKey, kRank, salt_of(bytes), make_chunk(k.header, k.payload)));
  EXPECT_EQ(kvformat::check_chunk_mac(kKey, kRank, bytes), kvformat::MacVerdict::Ok);
  // A fresh salt each write: no subkey (hence no GMAC key and IV) is used twice.
  k.write(kKey);
  EXPECT_NE(salt_of(read_file(k.path)), salt_of(bytes));
}

TEST(KeyedChunks, V2SealedChunkOfAnOlderStoreIsStillRead) {
  Keyed k;
  write_file(k.path, kvformat::seal_chunk_v2(kKey, make_chunk(k.header, k.payload)));
  EXPECT_EQ(k.read(kKey), "");
  EXPECT_EQ(k.dest, k.payload);
  std::fill(k.dest.begin(), k.dest.end(), 0);
  EXPECT_EQ(k.read(kKey, 4), "") << "split across threads";
  EXPECT_EQ(k.dest, k.payload);
  write_file(k.path, kvformat::seal_chunk_v2(kOtherKey, make_chunk(k.header, k.payload)));
  EXPECT_EQ(k.read(kKey), "mac_mismatch");
}

TEST(KeyedChunks, AnotherRanksChunkIsMacMismatch) {
  Keyed k;
  k.write(kKey);
  // Rank 5's genuine file, copied under the same name into rank 6's store.
  EXPECT_EQ(k.read(kKey, 1, kRank + 1), "mac_mismatch");
  EXPECT_EQ(k.read(kKey, 4, kRank + 1), "mac_mismatch");
  EXPECT_EQ(k.read(kKey), "");
}

TEST(KeyedChunks, TamperedSaltOrDowngradeIsMacMismatch) {
  Keyed k;
  k.write(kKey);
  const auto good = read_file(k.path);
  auto salted = good;
  salted[salted.size() - kvformat::kMacSize + 3] ^= 1;
  write_file(k.path, salted);
  EXPECT_EQ(k.read(kKey), "mac_mismatch");
  // Version 3 -> 2 with the header CRC redone: read as a v2 seal, whose
  // HMAC the trailer is not.
  auto downgraded = good;
  downgraded[8] = 2;
  ASSERT_TRUE(kvformat::set_chunk_flags(downgraded, kvformat::kFlagMac));
  write_file(k.path, downgraded);
  EXPECT_EQ(k.read(kKey), "mac_mismatch");
  auto unknown = good;
  unknown[8] = 7;
  ASSERT_TRUE(kvformat::set_chunk_flags(unknown, kvformat::kFlagMac));
  write_file(k.path, unknown);
  EXPECT_EQ(k.read(kKey), "mac_mismatch");
  // Extended by a byte: the last 32 are no longer the trailer.
  auto longer = good;
  longer.push_back(0);
  write_file(k.path, longer);
  EXPECT_EQ(k.read(kKey), "mac_mismatch");
}

TEST(KeyedChunks, RoundTripLandsThePayload) {
  Keyed k;
  k.write(kKey);
  EXPECT_EQ(k.read(kKey), "");
  EXPECT_EQ(k.dest, k.payload);
  std::fill(k.dest.begin(), k.dest.end(), 0);
  EXPECT_EQ(k.read(kKey, 4), "") << "split across threads, MAC'd in order";
  EXPECT_EQ(k.dest, k.payload);
}

TEST(KeyedChunks, AForgedPlainChunkWithValidCrcIsMacMissing) {
  Keyed k;
  write_file(k.path, make_chunk(k.header, k.payload));  // what anyone can compute
  EXPECT_EQ(k.read({}), "") << "a keyless reader takes it";
  EXPECT_EQ(k.read(kKey), "mac_missing");
}

TEST(KeyedChunks, PayloadSwappedWithCrcFixedIsMacMismatch) {
  Keyed k;
  k.write(kKey);
  // The attacker rewrites payload and header CRCs consistently but cannot MAC.
  auto forged_payload = k.payload;
  forged_payload[100] ^= 0xff;
  auto h = k.header;
  h.payload_checksum = kvformat::crc32(forged_payload);
  auto forged = kvformat::seal_chunk(kOtherKey, kRank, {}, make_chunk(h, forged_payload));
  write_file(k.path, forged);
  EXPECT_EQ(k.read(kKey), "mac_mismatch");
  // Even though the manifest's checksum disagrees too: the MAC comes first.
  auto genuine_other = kvformat::seal_chunk(kOtherKey, kRank, {}, make_chunk(k.header, k.payload));
  write_file(k.path, genuine_other);
  EXPECT_EQ(k.read(kKey), "mac_mismatch") << "another key's file";
}

TEST(KeyedChunks, KeyedFileReadWithoutKeyIsRefused) {
  Keyed k;
  k.write(kKey);
  EXPECT_EQ(k.read({}), "unsupported_version") << "a v3 seal: version 3, before its flag";
  write_file(k.path, kvformat::seal_chunk_v2(kKey, make_chunk(k.header, k.payload)));
  EXPECT_EQ(k.read({}), "reserved_nonzero") << "a v2 seal: its flag";
}

TEST(KeyedChunks, BadTagOrTruncationIsRefused) {
  Keyed k;
  k.write(kKey);
  auto bytes = read_file(k.path);
  bytes.back() ^= 1;
  write_file(k.path, bytes);
  EXPECT_EQ(k.read(kKey), "mac_mismatch");
  bytes.back() ^= 1;
  bytes.resize(100);
  write_file(k.path, bytes);
  EXPECT_EQ(k.read(kKey), "truncated");
}

TEST(KeyedChunks, AuthenticFileOfAnotherLayoutKeepsItsVerdict) {
  Keyed k;
  k.write(kKey);
  // A genuine sealed chunk that is not what the manifest names: the MAC
  // holds, so the plain verdict stands (read from disk, slow path).
  auto other = k.header;
  other.boundary += 1;
  write_file(k.path, kvformat::seal_chunk(kKey, kRank, {}, make_chunk(other, k.payload)));
  EXPECT_EQ(k.read(kKey), "wrong_boundary");
  write_file(k.path, kvformat::seal_chunk_v2(kKey, make_chunk(other, k.payload)));
  EXPECT_EQ(k.read(kKey), "wrong_boundary") << "a v2 seal's too";
}

TEST(KeyedChunks, V3TagStandsForThePayloadCrcV2DoesNot) {
  // Only the key's holder can make this file: a header whose CRC is not its
  // payload's, sealed. Under a v3 tag the reader does not CRC the payload
  // again (the tag covers every byte: FORMAT.md 3.6); a v2 seal's reader
  // still does.
  Keyed k;
  k.header.payload_checksum ^= 1;  // the manifest says the same
  auto plain = *kvformat::encode_header(k.header);
  plain.insert(plain.end(), k.payload.begin(), k.payload.end());
  write_file(k.path, kvformat::seal_chunk(kKey, kRank, {}, plain));
  EXPECT_EQ(k.read(kKey), "");
  write_file(k.path, kvformat::seal_chunk_v2(kKey, plain));
  EXPECT_EQ(k.read(kKey), "payload_checksum_mismatch");
}

}  // namespace
