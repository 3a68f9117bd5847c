// CRC-32 as zlib computes it (checksum algorithm id 1 in format v1).
// Chaining follows zlib: crc32(b, crc32(a)) == crc32(a || b), starting at 0.
// Through ISA-L when the build found it, else a slice-by-8 table fallback;
// both give identical results (crc32_test.cpp checks it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvformat {

std::uint32_t crc32(std::span<const std::uint8_t> data, std::uint32_t previous = 0);

// The table-driven implementation, always built (used when ISA-L is absent).
std::uint32_t crc32_portable(std::span<const std::uint8_t> data,
                             std::uint32_t previous = 0);

// True when crc32() runs on ISA-L.
bool crc32_uses_isal();

// Streaming form for large files: feed blocks in order, read value() at the end.
class Crc32 {
 public:
  void update(std::span<const std::uint8_t> data) { value_ = crc32(data, value_); }
  std::uint32_t value() const { return value_; }

 private:
  std::uint32_t value_ = 0;
};

}  // namespace kvformat
