// The keyed-store vectors of tests/python/store/test_kv_mac.py, byte for byte: the
// C++ MAC agrees with the Python codec's, for the v3 seal writers write and
// the v2 seal older stores hold.
#include "kvtier/format/mac.h"

#include <gtest/gtest.h>

#include <numeric>

#include "kvtier/format/boundary_manifest.h"
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

const kvformat::Salt kSalt = {0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7,
                               0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf};
constexpr std::uint32_t kRank = 3;

TEST(Mac, KeyIdIsPythonsVector) {
  EXPECT_EQ(kvformat::mac_key_id(key(0)), "3f03aa1bf45caef5");
  EXPECT_NE(kvformat::mac_key_id(key(1)), "3f03aa1bf45caef5");
}

TEST(Mac, SubkeyIsPythonsVector) {
  EXPECT_EQ(to_hex(kvformat::chunk_subkey(key(0), kSalt, kRank)),
            "5063a0944cbae323c83fe9e81496f2eeadabaf0860ede35085074a56e1ac9474");
  EXPECT_NE(kvformat::chunk_subkey(key(0), kSalt, kRank),
            kvformat::chunk_subkey(key(0), kSalt, kRank + 1));
}

TEST(Mac, SealedChunkIsPythonsVector) {
  const auto sealed = kvformat::seal_chunk(key(0), kRank, kSalt, kPlain);
  ASSERT_EQ(sealed.size(), kPlain.size() + kvformat::kMacSize);
  EXPECT_EQ(kvformat::raw_version(sealed), 3);
  EXPECT_EQ(to_hex(std::span(sealed).last(kvformat::kMacSize)),
            "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"   // the salt
            "c114d29f2be869b8cf4cf9eda8517931");  // the GMAC tag
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank, sealed), kvformat::MacVerdict::Ok);
  // Without the key, it reads as the plain v2 chunk it seals.
  auto header = kvformat::parse_sealed_header(sealed, sealed.size());
  ASSERT_TRUE(header) << header.error().message;
  EXPECT_EQ(header->format_version, 2);
}

TEST(Mac, V2SealedChunkIsPythonsVectorAndStillReads) {
  const auto sealed = kvformat::seal_chunk_v2(key(0), kPlain);
  ASSERT_EQ(sealed.size(), kPlain.size() + kvformat::kMacSize);
  EXPECT_EQ(kvformat::raw_version(sealed), 2);
  EXPECT_EQ(to_hex(std::span(sealed).last(kvformat::kMacSize)),
            "14e8b1ff016a611f6c9b2fdc46e4df103af368d39640feaaa1ae574f06fffe19");
  // The v2 seal covers no rank: any rank's reader takes it.
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank, sealed), kvformat::MacVerdict::Ok);
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), 0, sealed), kvformat::MacVerdict::Ok);
}

TEST(Mac, ForgedChunksAreRefused) {
  using kvformat::MacVerdict;
  const auto sealed = kvformat::seal_chunk(key(0), kRank, kSalt, kPlain);
  // A plain chunk with a valid CRC and namespace hash: no MAC.
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank, kPlain), MacVerdict::Missing);
  // Sealed with another key.
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank, kvformat::seal_chunk(key(1), kRank, kSalt, kPlain)),
            MacVerdict::Mismatch);
  // Another rank's genuine chunk copied here.
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank + 1, sealed), MacVerdict::Mismatch);
  // A payload byte changed after sealing.
  auto flipped = sealed;
  flipped[flipped.size() - kvformat::kMacSize - 1] ^= 1;
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank, flipped), MacVerdict::Mismatch);
  // The salt changed: another subkey, so the tag no longer holds.
  auto salted = sealed;
  salted[salted.size() - kvformat::kMacSize] ^= 1;
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank, salted), MacVerdict::Mismatch);
  // The tag changed.
  auto tagged = sealed;
  tagged.back() ^= 0x80;
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank, tagged), MacVerdict::Mismatch);
  // Cut or extended by a byte: the last 32 bytes are not the trailer of the rest.
  auto cut = sealed;
  cut.pop_back();
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank, cut), MacVerdict::Mismatch);
  auto longer = sealed;
  longer.push_back(0);
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank, longer), MacVerdict::Mismatch);
  // Downgraded: the version set back to 2 (the header CRC redone) names the
  // HMAC, which the GMAC trailer is not.
  auto downgraded = sealed;
  ASSERT_TRUE(kvformat::set_chunk_flags(downgraded, kvformat::kFlagMac));
  downgraded[8] = 2;
  ASSERT_TRUE(kvformat::set_chunk_flags(downgraded, kvformat::kFlagMac));
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank, downgraded), MacVerdict::Mismatch);
  // A version no seal has: nothing to check it with.
  auto unknown = sealed;
  unknown[8] = 9;
  EXPECT_EQ(kvformat::check_chunk_mac(key(0), kRank, unknown), MacVerdict::Mismatch);
}

TEST(Mac, StreamingCheckTakesAnySplit) {
  const auto sealed = kvformat::seal_chunk(key(0), kRank, kSalt, kPlain);
  kvformat::Trailer trailer{};
  std::copy(sealed.end() - kvformat::kMacSize, sealed.end(), trailer.begin());
  const auto body = std::span(sealed).first(sealed.size() - kvformat::kMacSize);
  for (std::size_t cut : {std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{148}, body.size() - 1}) {
    kvformat::ChunkMacCheck check(key(0), kRank, kvformat::raw_version(sealed), trailer);
    ASSERT_TRUE(check.known());
    check.update(body.first(cut));
    check.update(body.subspan(cut));
    EXPECT_TRUE(check.matches()) << "cut at " << cut;
  }
}

TEST(Mac, RandomSaltsDiffer) {
  const auto a = kvformat::random_salt(), b = kvformat::random_salt();
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
}

// test_kv_mac.py's manifest vector: the MAC of {"boundary":16,"format":2,"groups":[]}.
constexpr char kManifestMac[] = "73c0b7ac96107c9a0af4d3c718ddba263d019e13c3df93c5e1e2dfff3dd70a16";

TEST(Mac, SealedManifestIsPythonsVector) {
  const auto sealed = kvformat::seal_manifest(key(0), R"({"format": 2, "boundary": 16, "groups": []})");
  ASSERT_TRUE(sealed) << sealed.error().message;
  EXPECT_EQ(*sealed, std::string(R"({"boundary":16,"format":2,"groups":[],"mac":")") + kManifestMac + "\"}");
  // Sealing again replaces the mac; opening gives the canonical rest.
  const auto again = kvformat::seal_manifest(key(0), *sealed);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *sealed);
  const auto opened = kvformat::open_manifest(key(0), *sealed);
  ASSERT_TRUE(opened) << opened.error().message;
  EXPECT_EQ(*opened, R"({"boundary":16,"format":2,"groups":[]})");
}

TEST(Mac, OpenManifestVerdicts) {
  using kvformat::Reason;
  const auto sealed = *kvformat::seal_manifest(key(0), R"({"boundary":16,"format":2,"groups":[]})");
  const auto reason = [](const kvformat::Result<std::string>& r) {
    return r ? std::string("ok") : std::string(kvformat::reason_name(r.error().reason));
  };
  EXPECT_EQ(reason(kvformat::open_manifest(key(1), sealed)), "mac_mismatch");  // another key
  EXPECT_EQ(reason(kvformat::open_manifest(key(0), R"({"boundary":16})")), "mac_missing");
  EXPECT_EQ(reason(kvformat::open_manifest(key(0), "[1]")), "bad_field");
  EXPECT_EQ(reason(kvformat::open_manifest(key(0), "{")), "bad_json");
  EXPECT_EQ(reason(kvformat::open_manifest(key(0), sealed.substr(0, sealed.size() - 1))), "bad_json");
  // A field changed under the mac; a mac that is not 64 lowercase hex.
  auto changed = sealed;
  changed.replace(changed.find("16"), 2, "32");
  EXPECT_EQ(reason(kvformat::open_manifest(key(0), changed)), "mac_mismatch");
  for (const char* mac : {R"("mac":1)", R"("mac":"ab")", R"("mac":"73C0")"}) {
    EXPECT_EQ(reason(kvformat::open_manifest(key(0), std::string(R"({"boundary":16,)") + mac + "}")),
              "mac_mismatch")
        << mac;
  }
  auto upper = sealed;
  upper.replace(upper.find("73c0"), 4, "73C0");
  EXPECT_EQ(reason(kvformat::open_manifest(key(0), upper)), "mac_mismatch");
  // Oversize: past the manifest limit before anything is parsed.
  EXPECT_EQ(reason(kvformat::open_manifest(key(0), std::string(kvformat::kMaxManifestBytes + 1, ' '))),
            "bad_json");
  EXPECT_EQ(reason(kvformat::seal_manifest(key(0), "[1]")), "bad_json");
}

}  // namespace
