#include "kvtier/format/crc32.h"

#include <array>
#include <cstring>

#ifdef KVFORMAT_HAVE_ISAL
#include <isa-l/crc.h>
#endif

namespace kvformat {
namespace {

// Slice-by-8 tables for the reflected polynomial 0xEDB88320, built at compile time.
using Tables = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t s = 1; s < 8; ++s)
    for (std::size_t i = 0; i < 256; ++i)
      t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  return t;
}

constexpr Tables kTables = make_tables();

}  // namespace

std::uint32_t crc32_portable(std::span<const std::uint8_t> data, std::uint32_t previous) {
  std::uint32_t c = ~previous;
  const std::uint8_t* p = data.data();
  std::size_t n = data.size();
  while (n >= 8) {
    std::uint32_t lo, hi;
    std::memcpy(&lo, p, 4);  // the tables assume little-endian words
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^
        kTables[5][(lo >> 16) & 0xFF] ^ kTables[4][lo >> 24] ^ kTables[3][hi & 0xFF] ^
        kTables[2][(hi >> 8) & 0xFF] ^ kTables[1][(hi >> 16) & 0xFF] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = kTables[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

#ifdef KVFORMAT_HAVE_ISAL
std::uint32_t crc32(std::span<const std::uint8_t> data, std::uint32_t previous) {
  // crc32_gzip_refl takes and returns the un-inverted value like zlib's crc32,
  // so chaining works the same way. Its length is 64-bit; no splitting needed.
  return crc32_gzip_refl(previous, data.data(), data.size());
}
bool crc32_uses_isal() { return true; }
#else
std::uint32_t crc32(std::span<const std::uint8_t> data, std::uint32_t previous) {
  return crc32_portable(data, previous);
}
bool crc32_uses_isal() { return false; }
#endif

}  // namespace kvformat
