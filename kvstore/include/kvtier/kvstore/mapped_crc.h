// CRC-32 of a file range read through mmap: the checksum runs straight on the
// page cache, with no copy into a buffer (verify's hot loop). A file that
// shrinks while mapped raises SIGBUS; a thread-local recovery point turns it
// into an error instead of a crash.
#pragma once

#include <cstdint>

#include "kvtier/kvstore/error.h"

namespace kvstore {

// CRC-32 (zlib's) of bytes [from, size) of `fd`, chained onto `crc`.
// Errors: the mapping failed (caller may fall back to read()), or the file
// shrank while being read.
Result<uint32_t> crc_mapped(int fd, uint64_t size, uint64_t from, uint32_t crc);

}  // namespace kvstore
