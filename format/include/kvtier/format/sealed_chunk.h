// A keyed store's chunk (FORMAT.md 3.6) read from an open file by a reader
// without the key (kvstore inspect): the plain header it seals and its
// payload's CRC-32. The MAC itself is kvformat_mac's to check (mac.h); the
// plain file's counterparts are in chunk_verifier.h. Descriptors are read with
// pread, their offset is not used.
#pragma once

#include <cstdint>
#include <span>

#include "kvtier/format/format_error.h"
#include "kvtier/format/header.h"

namespace kvformat {

// Whether the file's first bytes carry the MAC flag (is_sealed). False when
// the 12 bytes that hold the flags cannot be read: the plain reader then
// names what is wrong with the file.
bool is_sealed_fd(int fd);

// The header of a sealed file of `file_size` bytes (from fstat), as the plain
// one it seals, checked against that size less the MAC (parse_sealed_header).
// I/O failures are IoError.
Result<ChunkHeader> read_sealed_header_fd(int fd, std::uint64_t file_size);

// The payload's CRC-32 (the bytes between the header and the MAC), read in
// `buffer`-sized pieces, checked against `header` (from read_sealed_header_fd).
// Returns `header`; payload_checksum_mismatch, IoError, or Truncated when the
// file shrank under the read.
Result<ChunkHeader> verify_sealed_payload_fd(int fd, const ChunkHeader& header,
                                             std::span<std::uint8_t> buffer);

}  // namespace kvformat
