// Streaming verification of one chunk file: feed its bytes in order, in blocks
// of any size, then finish(). The header is parsed as soon as enough bytes have
// arrived; the payload is checksummed as it streams, so a 27 MiB chunk is
// verified in one sequential read without holding it in memory.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kvtier/format/crc32.h"
#include "kvtier/format/format_error.h"
#include "kvtier/format/header.h"

namespace kvformat {

class ChunkVerifier {
 public:
  // `file_size` is the size from fstat; it bounds what the header may claim.
  explicit ChunkVerifier(std::uint64_t file_size);

  // Feed the next bytes of the file. Fails early (bad header, wrong size).
  Result<void> update(std::span<const std::uint8_t> data);

  // After the whole file was fed: the header, or the first failure.
  Result<ChunkHeader> finish();

  // The header once parsed (after enough update() calls), else nullptr.
  const ChunkHeader* header() const { return header_ ? &*header_ : nullptr; }

 private:
  Result<void> try_parse_header();

  std::uint64_t file_size_;
  std::uint64_t fed_ = 0;
  std::vector<std::uint8_t> head_;  // bytes buffered until the header parses
  std::optional<ChunkHeader> header_;
  std::optional<Error> failed_;
  Crc32 crc_;
};

// Reads an open file descriptor from offset 0 to the end with `buffer`-sized
// reads and verifies it (header, size, payload checksum). I/O failures are
// IoError. The descriptor's offset is not used (pread).
Result<ChunkHeader> verify_chunk_fd(int fd, std::span<std::uint8_t> buffer);

// The first bytes of an open file of `file_size` bytes, enough for its header:
// 64 KiB, or the header_length the bytes declare when that is more (and at
// most kMaxHeaderLength); fewer when the file is shorter or shrank. Parsing
// them gives the verdict the longest header's read would. I/O failures are
// IoError. Shared by the plain and the sealed header readers.
Result<std::vector<std::uint8_t>> read_head_fd(int fd, std::uint64_t file_size);

// Reads and parses only the header of an open chunk file and checks its size.
Result<ChunkHeader> read_chunk_header_fd(int fd);

}  // namespace kvformat
