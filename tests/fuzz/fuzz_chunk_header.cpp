// Fuzzes the chunk header parser (kvtier/format/header.h) and the streaming
// verifier (kvtier/format/chunk_verifier.h) with whole chunk files.
//
// A random header almost never carries a correct CRC, which would stop every
// input at the checksum check. So each input is tried twice: as is, and with
// the payload and header checksums recomputed ("fixed up"), which lets the
// fuzzer reach the field checks behind the checksum.
//
// Properties checked besides "no crash, no UB, no leak":
//  - an accepted header re-encodes to exactly the bytes it was parsed from;
//  - verify_chunk and the streaming ChunkVerifier fed in random-sized blocks
//    give the same verdict (same reason);
//  - CRC-32 through ISA-L equals the portable fallback;
//  - a keyed store's view (FORMAT.md 3.6): the file with the MAC flag set and
//    32 bytes appended parses with parse_sealed_header exactly as the plain
//    file parses with parse_header + check_file_size, when its header
//    checksum holds (the fixed-up copy).
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kvtier/format/chunk_verifier.h"
#include "kvtier/format/crc32.h"
#include "fuzz_check.h"
#include "kvtier/format/header.h"

namespace {

using kvformat::Reason;
using kvformat::Result;

std::uint64_t get_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

void put_le32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// Same verdict: both ok with equal headers, or both failed for the same reason.
bool same_verdict(const Result<kvformat::ChunkHeader>& a, const Result<kvformat::ChunkHeader>& b) {
  if (a.ok() != b.ok()) return false;
  if (a.ok()) return *a == *b;
  return a.error().reason == b.error().reason;
}

// Streams `file` through ChunkVerifier in blocks whose sizes come from a small
// PRNG seeded by the file itself, so a given input always splits the same way.
Result<kvformat::ChunkHeader> verify_streaming(std::span<const std::uint8_t> file) {
  kvformat::ChunkVerifier v(file.size());
  std::uint32_t seed = kvformat::crc32_portable(file) | 1;
  std::size_t pos = 0;
  while (pos < file.size()) {
    seed ^= seed << 13;
    seed ^= seed >> 17;
    seed ^= seed << 5;
    std::size_t n = 1 + seed % 257;
    if (n > file.size() - pos) n = file.size() - pos;
    if (auto r = v.update(file.subspan(pos, n)); !r) {
      // A failure is sticky: finish() must report the same error.
      auto f = v.finish();
      FUZZ_CHECK(!f.ok() && f.error().reason == r.error().reason);
      return r.error();
    }
    pos += n;
  }
  return v.finish();
}

void check_file(std::span<const std::uint8_t> file) {
  auto header = kvformat::parse_header(file);
  if (header) {
    auto encoded = kvformat::encode_header(*header);
    FUZZ_CHECK(encoded.ok());
    FUZZ_CHECK(encoded->size() == header->header_length());
    FUZZ_CHECK(encoded->size() <= file.size());
    FUZZ_CHECK(std::memcmp(encoded->data(), file.data(), encoded->size()) == 0);
  }
  auto whole = kvformat::verify_chunk(file);
  if (whole) FUZZ_CHECK(header.ok() && whole->file_size() == file.size());
  FUZZ_CHECK(same_verdict(whole, verify_streaming(file)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::uint8_t> in(data, size);
  FUZZ_CHECK(kvformat::crc32(in) == kvformat::crc32_portable(in));
  check_file(in);

  // The fixed-up copy: payload checksum, then header checksum, recomputed
  // wherever the header length field points inside the input.
  if (size < kvformat::kFixedHeaderSize) return 0;
  const std::uint64_t header_length = get_le(data + 12, 4);
  if (header_length < kvformat::kFixedHeaderSize + 4 || header_length > size) return 0;
  std::vector<std::uint8_t> fixed(data, data + size);
  put_le32(fixed.data() + 40,
           kvformat::crc32(std::span<const std::uint8_t>(fixed).subspan(header_length)));
  put_le32(fixed.data() + header_length - 4,
           kvformat::crc32(std::span<const std::uint8_t>(fixed.data(), header_length - 4)));
  check_file(fixed);

  // Sealed: flag bit 0 set (checksum redone), a MAC's 32 bytes appended.
  auto plain = kvformat::parse_header(fixed);
  if (plain) {
    auto sized = kvformat::check_file_size(*plain, fixed.size());
    std::vector<std::uint8_t> sealed(fixed);
    FUZZ_CHECK(kvformat::set_chunk_flags(sealed, kvformat::kFlagMac));
    FUZZ_CHECK(kvformat::is_sealed(sealed));
    sealed.resize(sealed.size() + kvformat::kMacSize, 0);
    auto read = kvformat::parse_sealed_header(sealed, sealed.size());
    FUZZ_CHECK(read.ok() == sized.ok());
    if (read.ok()) FUZZ_CHECK(*read == *plain);
  }
  return 0;
}
