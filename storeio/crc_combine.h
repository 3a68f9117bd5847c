// CRC-32 (zlib's) of a concatenation from the CRCs of its parts, so one
// file's payload can be read and checksummed in pieces on several threads.
#pragma once

#include <cstdint>

namespace storeio {

// crc32(a || b) from crc32(a), crc32(b) and the length of b.
std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t length_b);

}  // namespace storeio
