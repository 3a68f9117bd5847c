// Chunk file header, format v2 (FORMAT.md section 3): encode, parse, verify.
// Readers accept v1 (no segment part: the byte is reserved, 0) and v2.
// Parsing never trusts a length or count: every field is bounded before use and
// the check order (FORMAT.md 3.5) is fixed, so both codecs give one verdict.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/format/format_error.h"

namespace kvformat {

inline constexpr std::uint16_t kFormatVersion = 2;  // what encoders write
inline constexpr std::uint16_t kMinReadableVersion = 1;   // readers take 1..2
inline constexpr std::uint16_t kPendingFormatVersion = 1;  // 9.1: unchanged in v2
inline constexpr bool readable_version(std::uint64_t v) {
  return v >= kMinReadableVersion && v <= kFormatVersion;
}
inline constexpr std::array<std::uint8_t, 8> kMagic = {'K', 'V', 'T', 'C',
                                                       'H', 'U', 'N', 'K'};
inline constexpr std::uint8_t kChecksumCrc32 = 1;   // zlib's CRC-32
inline constexpr std::uint8_t kChecksumCrc32c = 2;  // reserved; v1/v2 reject it

inline constexpr std::size_t kFixedHeaderSize = 144;
inline constexpr std::size_t kSegmentEntrySize = 120;
inline constexpr std::size_t kHeaderChecksumSize = 4;
inline constexpr std::size_t kMaxSegments = 4096;
inline constexpr std::size_t kMinHeaderLength =
    kFixedHeaderSize + kSegmentEntrySize + kHeaderChecksumSize;
inline constexpr std::size_t kMaxHeaderLength =
    kFixedHeaderSize + kMaxSegments * kSegmentEntrySize + kHeaderChecksumSize;
inline constexpr std::size_t kMinKeyHashBytes = 8;
inline constexpr std::size_t kMaxKeyHashBytes = 64;
inline constexpr std::uint32_t kMaxGroupIndex = 1023;
inline constexpr std::uint32_t kMaxLayerIndex = 65535;
inline constexpr std::uint64_t kMaxTokenIndex = std::uint64_t{1} << 40;
inline constexpr std::uint64_t kMaxPayloadLength = std::uint64_t{1} << 34;
inline constexpr std::size_t kMaxNdim = 6;

enum class SegmentKind : std::uint8_t { Kv = 1, Conv = 2, Temporal = 3 };

enum class DType : std::uint8_t {
  Uint8 = 1,
  Int8 = 2,
  Float16 = 3,
  BFloat16 = 4,
  Float32 = 5,
  Float8E4M3Fn = 6,
  Float8E5M2 = 7,
  Int32 = 8,
  Float64 = 9,
};

// 0 for a value outside the enum.
std::size_t dtype_itemsize(DType dtype);
std::string_view dtype_name(DType dtype);              // "bfloat16", ...
std::string_view segment_kind_name(SegmentKind kind);  // "kv", "conv", "temporal"

struct Segment {
  std::uint32_t layer = 0;
  SegmentKind kind = SegmentKind::Kv;
  DType dtype = DType::Uint8;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::vector<std::uint64_t> shape;   // ndim = shape.size() (<= 6)
  std::vector<std::uint64_t> stride;  // same size as shape, in elements
  // v2: which tensor of this (layer, kind), e.g. KDA conv q/k/v = 0/1/2.
  // Always 0 in v1, where the byte is reserved.
  std::uint8_t part = 0;
  bool operator==(const Segment&) const = default;
};

struct ChunkHeader {
  std::array<std::uint8_t, 32> namespace_hash{};
  std::uint32_t group = 0;  // ORIGINAL group index
  std::vector<std::uint8_t> key_hash;
  std::uint64_t boundary = 0;
  std::vector<Segment> segments;
  std::uint64_t payload_length = 0;
  std::uint32_t payload_checksum = 0;
  std::uint8_t checksum_algorithm = kChecksumCrc32;
  std::uint16_t format_version = kFormatVersion;  // 1 or 2

  std::uint32_t header_length() const;
  std::uint64_t file_size() const { return header_length() + payload_length; }
  std::string key_hex() const;
  bool operator==(const ChunkHeader&) const = default;
};

std::uint32_t header_length_for(std::size_t num_segments);

// Serializes a header (checksum included). Fails if the result would not parse.
Result<std::vector<std::uint8_t>> encode_header(const ChunkHeader& header);

// header_length as a file's first bytes declare it, unchecked (parse_header
// checks it); nullopt with fewer than 16 bytes. Readers size the rest of
// their header read with it, after bounding it by kMaxHeaderLength.
std::optional<std::uint32_t> declared_header_length(std::span<const std::uint8_t> prefix);

// Parses the header at the start of a chunk file. `prefix` must hold the first
// min(file size, kMaxHeaderLength) bytes of the file (more is fine). The payload
// is not looked at: follow with check_file_size and check_payload_checksum.
Result<ChunkHeader> parse_header(std::span<const std::uint8_t> prefix);

// truncated / trailing_bytes when the size is not header_length + payload_length.
Result<void> check_file_size(const ChunkHeader& header, std::uint64_t file_size);

// payload_checksum_mismatch when `computed` differs from the header's.
Result<void> check_payload_checksum(const ChunkHeader& header, std::uint32_t computed);

// All checks on a whole chunk file held in memory.
Result<ChunkHeader> verify_chunk(std::span<const std::uint8_t> file);

// Keyed stores (FORMAT.md 3.6): flags bit 0 says a 32-byte MAC follows the
// payload (checked in kvformat_mac, mac.h; the key is not needed to parse).
inline constexpr std::uint16_t kFlagMac = 0x0001;
inline constexpr std::size_t kMacSize = 32;  // the trailer: v2 HMAC, v3 salt || GMAC tag
// A sealed chunk's format_version says which MAC its trailer holds: 3 for
// the v3 seal (per-chunk subkey, AES-GMAC), 1 or 2 for the v2 seal
// (HMAC-SHA256). Only sealed chunks carry 3; the plain header a v3 chunk
// seals is version 2.
inline constexpr std::uint16_t kSealedVersion = 3;
// The version field of a file's first bytes (0 if there are fewer than 10).
std::uint16_t raw_version(std::span<const std::uint8_t> prefix);
// A plain header made the v3 sealed header in place: version 3, the MAC
// flag, the header checksum redone. False as set_chunk_flags.
bool seal_header_v3(std::span<std::uint8_t> header);
// A sealed header made the plain header it seals in place: the flag
// cleared, version 3 back to 2 (v1/v2 seals keep theirs), checksum redone.
bool unseal_header(std::span<std::uint8_t> header);
// Whether a file's first bytes carry the MAC flag (no other check).
bool is_sealed(std::span<const std::uint8_t> prefix);
// The header's flags field set to `flags` and its header checksum redone in
// place: how a sealed header is made from a plain one and read back as the
// plain header it seals. False if `header` is shorter than its header_length.
bool set_chunk_flags(std::span<std::uint8_t> header, std::uint16_t flags);
// A sealed file's prefix (flag set) as the plain header it seals, parsed,
// and checked against the file's size less its MAC: what a reader without
// the key (gc, stat) knows of it. `truncated` if there is no room for a MAC,
// bad_header_length if the bytes cannot hold their header.
Result<ChunkHeader> parse_sealed_header(std::span<const std::uint8_t> prefix,
                                        std::uint64_t file_size);

// Segments laid out back to back from offset 0, lengths from shape and dtype.
struct SegmentSpec {
  std::uint32_t layer;
  SegmentKind kind;
  DType dtype;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint64_t> stride;
  std::uint8_t part = 0;
};
std::vector<Segment> make_segments(std::span<const SegmentSpec> specs);

}  // namespace kvformat
