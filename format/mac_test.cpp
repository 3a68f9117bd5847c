// The keyed-store vectors of tests/python/test_kv_mac.py, byte for byte: the
// C++ MAC agrees with the Python codec's.
#include "kvtier/format/mac.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

namespace {

std::vector<std::uint8_t> from_hex(const std::string& hex) {
  std::vector<std::uint8_t> out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<std::uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (auto b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

std::vector<std::uint8_t> key(std::uint8_t first) {
  std::vector<std::uint8_t> k(32);
  std::iota(k.begin(), k.end(), first);
  return k;
}

// test_kv_mac.py's _chunk(): one 16-byte uint8 segment.
const std::vector<std::uint8_t> kPlain = from_hex(
    "4b56544348554e4b020000000c010000011001000000000010000000000000001000000000000000b1dac69c000000009359f3bb2efa7aabd0264fb67fb1d99f91871778e9b887179d6b2debaa251ec6abababababababababababababababab0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001010100000000000000000010000000000000001000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000100000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000003a9673ce01020304010203040102030401020304");

TEST(Mac, KeyIdIsPythonsVector) {
  EXPECT_EQ(kvformat::mac_key_id(key(0)), "3f03aa1bf45caef5");
  EXPECT_NE(kvformat::mac_key_id(key(1)), "3f03aa1bf45caef5");
}

TEST(Mac, SealedChunkIsPythonsVector) {
  const auto sealed = kvformat::seal_chunk(key(0), kPlain);
  ASSERT_EQ(sealed.size(), kPlain.size() + kvformat::kMacSize);
  EXPECT_EQ(to_hex(std::span(sealed).last(kvformat::kMacSize)),
            "14e8b1ff016a611f6c9b2fdc46e4df103af368d39640feaaa1ae574f06fffe19");
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), sealed), kvformat::MacVerdict::Ok);
}

TEST(Mac, ForgedChunksAreRefused) {
  // A plain chunk with a valid CRC and namespace hash: no MAC.
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kPlain), kvformat::MacVerdict::Missing);
  // Sealed with another key.
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kvformat::seal_chunk(key(1), kPlain)),
            kvformat::MacVerdict::Mismatch);
  // A payload byte changed after sealing.
  auto sealed = kvformat::seal_chunk(key(0), kPlain);
  sealed[sealed.size() - kvformat::kMacSize - 1] ^= 1;
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), sealed), kvformat::MacVerdict::Mismatch);
}

}  // namespace
