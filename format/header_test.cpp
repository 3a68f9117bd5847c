#include "kvtier/format/header.h"

#include <gtest/gtest.h>

#include "test_chunk_builder.h"

namespace kvformat {
namespace {

using testing::make_chunk;
using testing::pattern_bytes;
using testing::state_header;

std::string verdict(std::span<const std::uint8_t> data) {
  auto r = verify_chunk(data);
  return r ? "ok" : std::string(reason_name(r.error().reason));
}

TEST(Header, RoundTrip) {
  const auto payload = pattern_bytes(44, 1);
  const auto file = make_chunk(state_header(), payload);
  ASSERT_EQ(file.size(), header_length_for(2) + 44);
  auto h = verify_chunk(file);
  ASSERT_TRUE(h) << h.error().message;
  ChunkHeader want = state_header();
  want.payload_checksum = crc32(payload);
  EXPECT_EQ(*h, want);
  EXPECT_EQ(h->segments[0].kind, SegmentKind::Conv);
  EXPECT_EQ(h->segments[1].offset, 12u);
  EXPECT_EQ(h->segments[1].length, 32u);
  EXPECT_EQ(h->key_hex().size(), 64u);
}

TEST(Header, LayoutIsLittleEndianAtDocumentedOffsets) {
  const auto file = make_chunk(state_header(), pattern_bytes(44, 1));
  EXPECT_EQ(std::string(file.begin(), file.begin() + 8), "KVTCHUNK");
  EXPECT_EQ(file[8], 2);   // version (encoders write v2)
  EXPECT_EQ(file[12], header_length_for(2) & 0xFF);
  EXPECT_EQ(file[16], 1);  // CRC-32
  EXPECT_EQ(file[17], 32);  // key length
  EXPECT_EQ(file[18], 2);   // segments
  EXPECT_EQ(file[20], 2);   // group
  EXPECT_EQ(file[24] | file[25] << 8, 3584);
  EXPECT_EQ(file[32], 44);  // payload length
  EXPECT_EQ(file[48], 0xA0);  // namespace hash
  EXPECT_EQ(file[144 + 4], 2);  // segment 0 kind conv
  EXPECT_EQ(file[144 + 5], 4);  // bf16
  EXPECT_EQ(file[144 + 6], 2);  // ndim
}

TEST(Header, DeclaredLengthIsReadFromTheFirstSixteenBytes) {
  auto file = make_chunk(state_header(), pattern_bytes(44, 1));
  EXPECT_EQ(declared_header_length(std::span(file).first(16)), header_length_for(2));
  EXPECT_EQ(declared_header_length(std::span(file).first(15)), std::nullopt);
  file[15] = 0x7F;  // unchecked: a lying length comes back as written
  EXPECT_EQ(declared_header_length(file), header_length_for(2) | 0x7F000000u);
}

TEST(Header, EveryTruncationIsTruncated) {
  const auto file = make_chunk(state_header(), pattern_bytes(44, 1));
  for (std::size_t n = 0; n < file.size(); ++n)
    ASSERT_EQ(verdict(std::span(file).first(n)), "truncated") << n;
}

// Every single-bit flip anywhere in the file gets the verdict FORMAT.md 3.5
// predicts from the flipped field alone.
TEST(Header, EverySingleBitFlipGetsThePredictedVerdict) {
  const auto file = make_chunk(state_header(), pattern_bytes(44, 1));
  const std::size_t hl = header_length_for(2);
  for (std::size_t byte = 0; byte < file.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      auto copy = file;
      copy[byte] ^= static_cast<std::uint8_t>(1u << bit);
      std::string want = "header_checksum_mismatch";
      if (byte < 8) want = "bad_magic";
      else if (byte < 10) want = "unsupported_version";
      else if (byte >= 12 && byte < 16) want = "bad_header_length";
      else if (byte == 16) want = "unsupported_checksum_algorithm";
      else if (byte >= hl) want = "payload_checksum_mismatch";
      ASSERT_EQ(verdict(copy), want) << "byte " << byte << " bit " << bit;
    }
  }
}

TEST(Header, TrailingBytes) {
  auto file = make_chunk(state_header(), pattern_bytes(44, 1));
  file.push_back(0);
  EXPECT_EQ(verdict(file), "trailing_bytes");
}

TEST(Header, EncodeRefusesWhatWouldNotParse) {
  auto reason = [](const ChunkHeader& h) {
    auto r = encode_header(h);
    return r ? std::string("ok") : std::string(reason_name(r.error().reason));
  };
  ChunkHeader h = state_header();
  EXPECT_EQ(reason(h), "ok");
  auto bad = h;
  bad.key_hash.resize(7);
  EXPECT_EQ(reason(bad), "bad_key_hash");
  bad = h;
  bad.group = 1024;
  EXPECT_EQ(reason(bad), "field_out_of_range");
  bad = h;
  bad.boundary = 0;
  EXPECT_EQ(reason(bad), "field_out_of_range");
  bad = h;
  bad.payload_length = 45;
  EXPECT_EQ(reason(bad), "bad_segment_table");
  bad = h;
  bad.checksum_algorithm = kChecksumCrc32c;
  EXPECT_EQ(reason(bad), "unsupported_checksum_algorithm");
  bad = h;
  std::swap(bad.segments[0], bad.segments[1]);
  EXPECT_EQ(reason(bad), "bad_segment_table");
  bad = h;
  bad.segments[0].shape = {2, 4};
  EXPECT_EQ(reason(bad), "bad_segment_table");
  bad = h;
  bad.segments.clear();
  EXPECT_EQ(reason(bad), "bad_segment_table");
}

// v2: a KDA-style layer's conv state as one segment per part, each with its
// own dtype and shape; the part is byte 7 of the entry.
ChunkHeader kda_header() {
  std::vector<SegmentSpec> specs = {
      {12, SegmentKind::Conv, DType::BFloat16, {2, 3}, {3, 1}, 0},
      {12, SegmentKind::Conv, DType::BFloat16, {2, 3}, {3, 1}, 1},
      {12, SegmentKind::Conv, DType::Float32, {3, 1}, {1, 1}, 2},
      {12, SegmentKind::Temporal, DType::Float32, {2, 2, 2}, {4, 2, 1}, 0},
  };
  ChunkHeader h = state_header();
  h.segments = make_segments(specs);
  h.payload_length = 68;
  return h;
}

TEST(Header, V2PartsRoundTripAndSitInByteSeven) {
  const auto file = make_chunk(kda_header(), pattern_bytes(68, 2));
  auto h = verify_chunk(file);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->format_version, 2);
  ASSERT_EQ(h->segments.size(), 4u);
  EXPECT_EQ(h->segments[1].part, 1);
  EXPECT_EQ(h->segments[2].part, 2);
  EXPECT_EQ(h->segments[2].dtype, DType::Float32);
  EXPECT_EQ(h->segments[2].offset, 24u);
  EXPECT_EQ(h->segments[3].part, 0);
  EXPECT_EQ(file[144 + 120 * 2 + 7], 2);
}

TEST(Header, V2OrderIsLayerKindPart) {
  auto reason = [](const ChunkHeader& h) {
    auto r = encode_header(h);
    return r ? std::string("ok") : std::string(reason_name(r.error().reason));
  };
  ChunkHeader h = kda_header();
  std::swap(h.segments[0].part, h.segments[1].part);  // part 1 before part 0
  EXPECT_EQ(reason(h), "bad_segment_table");
  h = kda_header();
  h.segments[1].part = 0;  // (12, conv, 0) twice
  EXPECT_EQ(reason(h), "bad_segment_table");
  h = kda_header();
  h.segments[2].part = 255;  // parts need only ascend
  EXPECT_EQ(reason(h), "ok");
}

TEST(Header, V1StillReadsAndHasNoPart) {
  ChunkHeader h = state_header();
  h.format_version = 1;
  auto file = make_chunk(h, pattern_bytes(44, 1));
  EXPECT_EQ(file[8], 1);
  auto parsed = verify_chunk(file);
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->format_version, 1);
  // A v1 encoder cannot write a part; a v1 file whose reserved byte is set
  // (the same header relabelled) is reserved_nonzero, never a part.
  ChunkHeader kda = kda_header();
  kda.format_version = 1;
  auto r = encode_header(kda);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().reason, Reason::ReservedNonzero);
  auto v2 = make_chunk(kda_header(), pattern_bytes(68, 2));
  v2[8] = 1;
  const std::size_t hl = header_length_for(4);
  const std::uint32_t crc = crc32(std::span(v2).first(hl - 4));
  for (int i = 0; i < 4; ++i) v2[hl - 4 + i] = static_cast<std::uint8_t>(crc >> (8 * i));
  EXPECT_EQ(verdict(v2), "reserved_nonzero");
  ChunkHeader v3 = state_header();
  v3.format_version = 3;
  EXPECT_FALSE(encode_header(v3));
}

TEST(Header, MaximumSegmentsRoundTrip) {
  std::vector<SegmentSpec> specs;
  for (std::uint32_t layer = 0; layer < kMaxSegments; ++layer)
    specs.push_back({layer, SegmentKind::Kv, DType::Float16, {1}, {1}});
  ChunkHeader h = state_header();
  h.segments = make_segments(specs);
  const auto file = make_chunk(h, pattern_bytes(2 * kMaxSegments, 5));
  ASSERT_EQ(header_length_for(kMaxSegments), kMaxHeaderLength);
  EXPECT_EQ(verdict(file), "ok");
  specs.push_back({kMaxSegments, SegmentKind::Kv, DType::Float16, {1}, {1}});
  h.segments = make_segments(specs);
  h.payload_length += 2;
  EXPECT_FALSE(encode_header(h));
}

// A keyed store's file (FORMAT.md 3.6) read without the key: the flag, the
// header as the plain one it seals, the size less the 32-byte MAC.
TEST(Header, SealedHeaderParsesAsThePlainOneItSeals) {
  const auto payload = pattern_bytes(44, 1);
  const auto plain = make_chunk(state_header(), payload);
  auto sealed = plain;
  ASSERT_TRUE(set_chunk_flags(sealed, kFlagMac));
  sealed.resize(sealed.size() + kMacSize, 0xAB);  // the MAC's bytes, not checked here
  EXPECT_TRUE(is_sealed(sealed));
  EXPECT_FALSE(is_sealed(plain));
  EXPECT_EQ(verdict(sealed), "reserved_nonzero");  // a plain reader refuses it
  auto h = parse_sealed_header(sealed, sealed.size());
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(*h, *verify_chunk(plain));
  auto shorter = parse_sealed_header(sealed, sealed.size() - 1);
  ASSERT_FALSE(shorter);
  EXPECT_EQ(shorter.error().reason, Reason::Truncated);
  auto tiny = parse_sealed_header(sealed, 150);
  ASSERT_FALSE(tiny);
  EXPECT_EQ(tiny.error().reason, Reason::Truncated);
  auto flipped = sealed;
  flipped[20] ^= 1;  // a header byte: the (sealed) header checksum fails
  auto bad = parse_sealed_header(flipped, flipped.size());
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().reason, Reason::HeaderChecksumMismatch);
  ASSERT_TRUE(set_chunk_flags(sealed, 0));
  sealed.resize(plain.size());
  EXPECT_EQ(sealed, plain) << "clearing the flag gives the plain chunk back";
}

}  // namespace
}  // namespace kvformat
