#include "kvtier/format/header.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "kvtier/format/crc32.h"
#include "kvtier/format/layout.h"

namespace kvformat {
namespace {

// Where the fixed header keeps header_length: after magic (8),
// format_version (2) and flags (2).
constexpr std::size_t kHeaderLengthAt = 12;

// Little-endian access independent of the host's byte order.
std::uint64_t get_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_le(std::vector<std::uint8_t>& out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

std::string num(std::uint64_t v) { return std::to_string(v); }

bool valid_kind(std::uint8_t k) { return k >= 1 && k <= 3; }
bool valid_dtype(std::uint8_t d) { return d >= 1 && d <= 9; }

Error segment_error(std::size_t index, const std::string& what) {
  return make_error(Reason::BadSegmentTable, "segment " + num(index) + ": " + what);
}

// FORMAT.md 3.2 table rules, shared by encode (writer bugs) and parse.
Result<void> check_segment_table(const std::vector<Segment>& segments,
                                 std::uint64_t payload_length) {
  std::uint64_t expected = 0;
  bool have_previous = false;
  std::uint64_t previous = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.layer > kMaxLayerIndex) return segment_error(i, "layer " + num(s.layer));
    // (layer, kind, part) as one number; v1 parts are all 0, so this is v1's
    // (layer, kind) rule there.
    const std::uint64_t order = (std::uint64_t{s.layer} << 16) |
                                (std::uint64_t{static_cast<std::uint8_t>(s.kind)} << 8) | s.part;
    if (have_previous && order <= previous)
      return segment_error(i, "not sorted by (layer, kind, part)");
    have_previous = true;
    previous = order;
    if ((s.kind == SegmentKind::Conv || s.kind == SegmentKind::Temporal) && s.shape.empty())
      return segment_error(i, "state needs shape");
    if (s.offset != expected)
      return segment_error(i, "offset " + num(s.offset) + ", expected " + num(expected));
    if (s.length == 0 || s.length > payload_length - expected)
      return segment_error(i, "length " + num(s.length));
    if (!s.shape.empty()) {
      // Checked multiplication: a hostile shape must not wrap around.
      unsigned __int128 elements = dtype_itemsize(s.dtype);
      for (std::uint64_t d : s.shape) {
        elements *= d;
        if (elements > payload_length) break;
      }
      if (elements != s.length) return segment_error(i, "shape does not match length");
    }
    expected += s.length;
  }
  if (expected != payload_length)
    return make_error(Reason::BadSegmentTable, "segments cover " + num(expected) + " of " +
                                                   num(payload_length) + " payload bytes");
  return {};
}

}  // namespace

std::size_t dtype_itemsize(DType dtype) {
  switch (dtype) {
    case DType::Uint8: case DType::Int8: case DType::Float8E4M3Fn: case DType::Float8E5M2:
      return 1;
    case DType::Float16: case DType::BFloat16: return 2;
    case DType::Float32: case DType::Int32: return 4;
    case DType::Float64: return 8;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Uint8: return "uint8";
    case DType::Int8: return "int8";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float8E4M3Fn: return "float8_e4m3fn";
    case DType::Float8E5M2: return "float8_e5m2";
    case DType::Int32: return "int32";
    case DType::Float64: return "float64";
  }
  return "unknown";
}

std::string_view segment_kind_name(SegmentKind kind) {
  switch (kind) {
    case SegmentKind::Kv: return "kv";
    case SegmentKind::Conv: return "conv";
    case SegmentKind::Temporal: return "temporal";
  }
  return "unknown";
}

std::uint32_t header_length_for(std::size_t num_segments) {
  return static_cast<std::uint32_t>(kFixedHeaderSize + num_segments * kSegmentEntrySize +
                                    kHeaderChecksumSize);
}

std::uint32_t ChunkHeader::header_length() const { return header_length_for(segments.size()); }

std::string ChunkHeader::key_hex() const { return to_hex(key_hash); }

Result<std::vector<std::uint8_t>> encode_header(const ChunkHeader& h) {
  if (!readable_version(h.format_version))
    return make_error(Reason::UnsupportedVersion, "format version " + num(h.format_version));
  if (h.checksum_algorithm != kChecksumCrc32)
    return make_error(Reason::UnsupportedChecksumAlgorithm,
                      "checksum algorithm " + num(h.checksum_algorithm));
  if (h.key_hash.size() < kMinKeyHashBytes || h.key_hash.size() > kMaxKeyHashBytes)
    return make_error(Reason::BadKeyHash, "key hash " + num(h.key_hash.size()) + " B");
  if (h.group > kMaxGroupIndex)
    return make_error(Reason::FieldOutOfRange, "group index " + num(h.group));
  if (h.boundary == 0 || h.boundary > kMaxTokenIndex)
    return make_error(Reason::FieldOutOfRange, "boundary " + num(h.boundary));
  if (h.payload_length == 0 || h.payload_length > kMaxPayloadLength)
    return make_error(Reason::FieldOutOfRange, "payload length " + num(h.payload_length));
  if (h.segments.empty() || h.segments.size() > kMaxSegments)
    return make_error(Reason::BadSegmentTable, num(h.segments.size()) + " segments");
  for (std::size_t i = 0; i < h.segments.size(); ++i) {
    const Segment& s = h.segments[i];
    if (s.shape.size() != s.stride.size() || s.shape.size() > kMaxNdim)
      return segment_error(i, "shape/stride rank");
    if (!valid_kind(static_cast<std::uint8_t>(s.kind))) return segment_error(i, "kind");
    if (!valid_dtype(static_cast<std::uint8_t>(s.dtype))) return segment_error(i, "dtype");
    if (h.format_version == 1 && s.part != 0)
      return make_error(Reason::ReservedNonzero, "segment " + num(i) + ": v1 has no part");
  }
  if (auto r = check_segment_table(h.segments, h.payload_length); !r) return r.error();

  std::vector<std::uint8_t> out;
  out.reserve(h.header_length());
  out.insert(out.end(), kMagic.begin(), kMagic.end());
  put_le(out, h.format_version, 2);
  put_le(out, 0, 2);  // flags
  put_le(out, h.header_length(), 4);
  put_le(out, h.checksum_algorithm, 1);
  put_le(out, h.key_hash.size(), 1);
  put_le(out, h.segments.size(), 2);
  put_le(out, h.group, 4);
  put_le(out, h.boundary, 8);
  put_le(out, h.payload_length, 8);
  put_le(out, h.payload_checksum, 4);
  put_le(out, 0, 4);  // reserved
  out.insert(out.end(), h.namespace_hash.begin(), h.namespace_hash.end());
  out.insert(out.end(), h.key_hash.begin(), h.key_hash.end());
  out.resize(kFixedHeaderSize, 0);  // key padding
  for (const Segment& s : h.segments) {
    put_le(out, s.layer, 4);
    put_le(out, static_cast<std::uint8_t>(s.kind), 1);
    put_le(out, static_cast<std::uint8_t>(s.dtype), 1);
    put_le(out, s.shape.size(), 1);
    put_le(out, s.part, 1);  // v1: the reserved byte, 0 (checked above)
    put_le(out, s.offset, 8);
    put_le(out, s.length, 8);
    for (std::size_t d = 0; d < kMaxNdim; ++d) put_le(out, d < s.shape.size() ? s.shape[d] : 0, 8);
    for (std::size_t d = 0; d < kMaxNdim; ++d)
      put_le(out, d < s.stride.size() ? s.stride[d] : 0, 8);
  }
  put_le(out, crc32(out), 4);
  return out;
}

std::optional<std::uint32_t> declared_header_length(std::span<const std::uint8_t> prefix) {
  if (prefix.size() < kHeaderLengthAt + 4) return std::nullopt;
  return static_cast<std::uint32_t>(get_le(prefix.data() + kHeaderLengthAt, 4));
}

Result<ChunkHeader> parse_header(std::span<const std::uint8_t> buf) {
  const std::size_t size = buf.size();
  const std::uint8_t* p = buf.data();
  if (size < 8) return make_error(Reason::Truncated, num(size) + " bytes, magic needs 8");
  if (std::memcmp(p, kMagic.data(), kMagic.size()) != 0)
    return make_error(Reason::BadMagic, "not a kvtier chunk (magic)");
  if (size < 10) return make_error(Reason::Truncated, num(size) + " bytes, version needs 10");
  const auto version = get_le(p + 8, 2);
  if (!readable_version(version))
    return make_error(Reason::UnsupportedVersion, "format version " + num(version));
  if (size < kFixedHeaderSize)
    return make_error(Reason::Truncated,
                      num(size) + " bytes, fixed header needs " + num(kFixedHeaderSize));
  const auto flags = get_le(p + 10, 2);
  const auto header_length = get_le(p + kHeaderLengthAt, 4);
  const auto algorithm = get_le(p + 16, 1);
  const auto key_len = get_le(p + 17, 1);
  const auto nseg = get_le(p + 18, 2);
  const auto group = get_le(p + 20, 4);
  const auto boundary = get_le(p + 24, 8);
  const auto payload_length = get_le(p + 32, 8);
  const auto payload_checksum = get_le(p + 40, 4);
  const auto reserved = get_le(p + 44, 4);
  if (header_length < kMinHeaderLength || header_length > kMaxHeaderLength ||
      (header_length - kFixedHeaderSize - kHeaderChecksumSize) % kSegmentEntrySize != 0)
    return make_error(Reason::BadHeaderLength, "header length " + num(header_length));
  if (algorithm != kChecksumCrc32)
    return make_error(Reason::UnsupportedChecksumAlgorithm,
                      "checksum algorithm " + num(algorithm));
  if (size < header_length)
    return make_error(Reason::Truncated,
                      num(size) + " bytes, header needs " + num(header_length));
  const auto stored = static_cast<std::uint32_t>(get_le(p + header_length - 4, 4));
  const std::uint32_t actual = crc32(buf.first(header_length - 4));
  if (stored != actual) {
    char msg[64];
    std::snprintf(msg, sizeof msg, "header checksum %08x, computed %08x", stored, actual);
    return make_error(Reason::HeaderChecksumMismatch, msg);
  }
  // The header is authentic from here on; what follows catches writer bugs.
  if (flags != 0 || reserved != 0)
    return make_error(Reason::ReservedNonzero, "flags/reserved must be 0");
  bool padding_zero = true;
  if (key_len <= kMaxKeyHashBytes)
    for (std::size_t i = 80 + key_len; i < kFixedHeaderSize; ++i) padding_zero &= p[i] == 0;
  if (key_len < kMinKeyHashBytes || key_len > kMaxKeyHashBytes || !padding_zero)
    return make_error(Reason::BadKeyHash, "key hash length " + num(key_len));
  if (group > kMaxGroupIndex)
    return make_error(Reason::FieldOutOfRange, "group index " + num(group));
  if (boundary == 0 || boundary > kMaxTokenIndex)
    return make_error(Reason::FieldOutOfRange, "boundary " + num(boundary));
  if (payload_length == 0 || payload_length > kMaxPayloadLength)
    return make_error(Reason::FieldOutOfRange, "payload length " + num(payload_length));
  if (nseg < 1 || header_length_for(nseg) != header_length)
    return make_error(Reason::BadSegmentTable, num(nseg) + " segments do not fill header length " +
                                                   num(header_length));

  ChunkHeader h;
  std::memcpy(h.namespace_hash.data(), p + 48, 32);
  h.group = static_cast<std::uint32_t>(group);
  h.key_hash.assign(p + 80, p + 80 + key_len);
  h.boundary = boundary;
  h.payload_length = payload_length;
  h.payload_checksum = static_cast<std::uint32_t>(payload_checksum);
  h.checksum_algorithm = static_cast<std::uint8_t>(algorithm);
  h.format_version = static_cast<std::uint16_t>(version);
  h.segments.reserve(nseg);
  for (std::size_t i = 0; i < nseg; ++i) {
    const std::uint8_t* e = p + kFixedHeaderSize + i * kSegmentEntrySize;
    const auto kind = e[4], dtype = e[5], ndim = e[6], part = e[7];
    if (version == 1 && part != 0)  // v1's reserved byte
      return make_error(Reason::ReservedNonzero, "segment " + num(i) + ": reserved byte");
    if (!valid_kind(kind)) return segment_error(i, "kind " + num(kind));
    if (!valid_dtype(dtype)) return segment_error(i, "dtype " + num(dtype));
    if (ndim > kMaxNdim) return segment_error(i, "ndim " + num(ndim));
    Segment s;
    s.layer = static_cast<std::uint32_t>(get_le(e, 4));
    s.kind = static_cast<SegmentKind>(kind);
    s.dtype = static_cast<DType>(dtype);
    s.offset = get_le(e + 8, 8);
    s.length = get_le(e + 16, 8);
    s.part = part;
    for (std::size_t d = 0; d < kMaxNdim; ++d) {
      const auto shape = get_le(e + 24 + 8 * d, 8), stride = get_le(e + 72 + 8 * d, 8);
      if (d < ndim) {
        s.shape.push_back(shape);
        s.stride.push_back(stride);
      } else if (shape != 0 || stride != 0) {
        return segment_error(i, "unused dims not 0");
      }
    }
    h.segments.push_back(std::move(s));
  }
  if (auto r = check_segment_table(h.segments, h.payload_length); !r) return r.error();
  return h;
}

Result<void> check_file_size(const ChunkHeader& header, std::uint64_t file_size) {
  const std::uint64_t expected = header.file_size();
  if (file_size < expected)
    return make_error(Reason::Truncated,
                      num(file_size) + " bytes, chunk needs " + num(expected));
  if (file_size > expected)
    return make_error(Reason::TrailingBytes, num(file_size) + " bytes, chunk is " + num(expected));
  return {};
}

Result<void> check_payload_checksum(const ChunkHeader& header, std::uint32_t computed) {
  if (computed == header.payload_checksum) return {};
  char msg[64];
  std::snprintf(msg, sizeof msg, "payload checksum %08x, computed %08x",
                header.payload_checksum, computed);
  return make_error(Reason::PayloadChecksumMismatch, msg);
}

Result<ChunkHeader> verify_chunk(std::span<const std::uint8_t> file) {
  auto header = parse_header(file);
  if (!header) return header;
  if (auto r = check_file_size(*header, file.size()); !r) return r.error();
  if (auto r = check_payload_checksum(*header, crc32(file.subspan(header->header_length())));
      !r)
    return r.error();
  return header;
}

std::vector<Segment> make_segments(std::span<const SegmentSpec> specs) {
  std::vector<Segment> out;
  std::uint64_t offset = 0;
  for (const SegmentSpec& spec : specs) {
    std::uint64_t length = dtype_itemsize(spec.dtype);
    for (std::uint64_t d : spec.shape) length *= d;
    out.push_back(Segment{spec.layer, spec.kind, spec.dtype, offset, length, spec.shape,
                          spec.stride, spec.part});
    offset += length;
  }
  return out;
}

bool is_sealed(std::span<const std::uint8_t> prefix) {
  return prefix.size() >= 12 && ((prefix[10] | prefix[11] << 8) & kFlagMac);
}

bool set_chunk_flags(std::span<std::uint8_t> header, std::uint16_t flags) {
  constexpr std::size_t kMinChunk = kFixedHeaderSize + kHeaderChecksumSize;
  if (header.size() < kMinChunk) return false;
  const std::uint32_t header_length = static_cast<std::uint32_t>(header[12]) |
                                      static_cast<std::uint32_t>(header[13]) << 8 |
                                      static_cast<std::uint32_t>(header[14]) << 16 |
                                      static_cast<std::uint32_t>(header[15]) << 24;
  if (header_length < kMinChunk || header_length > header.size()) return false;
  header[10] = static_cast<std::uint8_t>(flags & 0xff);
  header[11] = static_cast<std::uint8_t>(flags >> 8);
  const std::uint32_t crc = crc32(header.first(header_length - 4));
  for (int i = 0; i < 4; ++i)
    header[header_length - 4 + i] = static_cast<std::uint8_t>(crc >> (8 * i));
  return true;
}

std::uint16_t raw_version(std::span<const std::uint8_t> prefix) {
  return prefix.size() < 10 ? 0 : static_cast<std::uint16_t>(prefix[8] | prefix[9] << 8);
}

namespace {

bool set_version_and_flags(std::span<std::uint8_t> header, std::uint16_t version,
                           std::uint16_t flags) {
  if (header.size() < 10) return false;
  const std::uint8_t old[2] = {header[8], header[9]};
  header[8] = static_cast<std::uint8_t>(version & 0xff);
  header[9] = static_cast<std::uint8_t>(version >> 8);
  if (set_chunk_flags(header, flags)) return true;
  header[8] = old[0];
  header[9] = old[1];
  return false;
}

}  // namespace

bool seal_header_v3(std::span<std::uint8_t> header) {
  return set_version_and_flags(header, kSealedVersion, kFlagMac);
}

bool unseal_header(std::span<std::uint8_t> header) {
  const std::uint16_t v = raw_version(header);
  return set_version_and_flags(header, v == kSealedVersion ? kFormatVersion : v, 0);
}

Result<ChunkHeader> parse_sealed_header(std::span<const std::uint8_t> prefix,
                                        std::uint64_t file_size) {
  constexpr std::size_t kMinChunk = kFixedHeaderSize + kHeaderChecksumSize;
  if (file_size < kMinChunk + kMacSize)
    return make_error(Reason::Truncated, std::to_string(file_size) + " bytes, too short for a MAC");
  const std::uint64_t body = file_size - kMacSize;
  std::vector<std::uint8_t> plain(prefix.begin(),
                                  prefix.begin() + static_cast<std::ptrdiff_t>(
                                                       std::min<std::uint64_t>(prefix.size(), body)));
  // Without the key the header's own checksum (over the flag as set) is what
  // catches rot: a header that fails it gets the plain reader's verdict on
  // the bytes as they are (FORMAT.md 3.5, steps 1-7).
  if (const auto hl = declared_header_length(plain);
      hl && *hl >= kMinChunk && *hl <= plain.size() &&
      crc32(std::span<const std::uint8_t>(plain).first(*hl - 4)) !=
          (static_cast<std::uint32_t>(plain[*hl - 4]) | static_cast<std::uint32_t>(plain[*hl - 3]) << 8 |
           static_cast<std::uint32_t>(plain[*hl - 2]) << 16 | static_cast<std::uint32_t>(plain[*hl - 1]) << 24)) {
    // A v3 seal's version read as the 2 it seals, so the rot is named by
    // step 7 (its checksum), not step 2.
    if (raw_version(plain) == kSealedVersion) {
      plain[8] = static_cast<std::uint8_t>(kFormatVersion);
      plain[9] = 0;
    }
    auto h = parse_header(plain);
    if (!h) return h;
  }
  if (!unseal_header(plain)) return make_error(Reason::BadHeaderLength, "header length");
  auto header = parse_header(plain);
  if (!header) return header;
  if (auto r = check_file_size(*header, body); !r) return r.error();
  return header;
}

}  // namespace kvformat
