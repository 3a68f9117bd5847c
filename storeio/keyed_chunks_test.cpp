// Keyed stores through the C ABI (FORMAT.md 3.6): the writer seals, the
// reader refuses a file whose MAC is missing or wrong before any other
// verdict, and both agree with format/'s seal_chunk byte for byte.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvtier/format/crc32.h"
#include "kvtier/format/header.h"
#include "kvtier/format/mac.h"
#include "kvtier/store_abi.h"
#include "test_chunk_builder.h"
#include "test_files.h"

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
    EXPECT_EQ(kvtier_write_chunks(&it, 1, 1, 0), 0) << it.message;
    return it;
  }

  // Reads it back with `key`; the reason ("" when OK).
  std::string read(const std::vector<std::uint8_t>& key, std::uint32_t threads = 1) {
    kvtier_read_item it{};
    it.path = path.c_str();
    it.fd = -1;
    it.group = header.group;
    it.namespace_hash = header.namespace_hash.data();
    it.key_hash = header.key_hash.data();
    it.key_hash_length = static_cast<std::uint32_t>(header.key_hash.size());
    it.num_segments = static_cast<std::uint32_t>(segments.size());
    it.segments = segments.data();
    it.boundary = header.boundary;
    it.payload_length = header.payload_length;
    it.payload_checksum = header.payload_checksum;
    it.num_runs = 1;
    it.runs = &dst;
    it.mac_key = key.empty() ? nullptr : key.data();
    it.mac_key_length = static_cast<std::uint32_t>(key.size());
    kvtier_read_chunks(&it, 1, threads, 0);
    return it.reason;
  }
};

TEST(KeyedChunks, WriterSealsAsTheCodecDoes) {
  Keyed k;
  const auto it = k.write(kKey);
  const auto bytes = read_file(k.path);
  EXPECT_EQ(it.file_size, bytes.size());
  EXPECT_EQ(bytes, kvformat::seal_chunk(kKey, make_chunk(k.header, k.payload)));
  EXPECT_EQ(kvformat::check_chunk_mac(kKey, bytes), kvformat::MacVerdict::Ok);
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
  auto forged = kvformat::seal_chunk(kOtherKey, make_chunk(h, forged_payload));
  write_file(k.path, forged);
  EXPECT_EQ(k.read(kKey), "mac_mismatch");
  // Even though the manifest's checksum disagrees too: the MAC comes first.
  auto genuine_other = kvformat::seal_chunk(kOtherKey, make_chunk(k.header, k.payload));
  write_file(k.path, genuine_other);
  EXPECT_EQ(k.read(kKey), "mac_mismatch") << "another key's file";
}

TEST(KeyedChunks, KeyedFileReadWithoutKeyIsRefused) {
  Keyed k;
  k.write(kKey);
  EXPECT_EQ(k.read({}), "reserved_nonzero");
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
  write_file(k.path, kvformat::seal_chunk(kKey, make_chunk(other, k.payload)));
  EXPECT_EQ(k.read(kKey), "wrong_boundary");
}

}  // namespace
