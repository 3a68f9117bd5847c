#include "kvtier/format/sealed_chunk.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "kvtier/format/chunk_verifier.h"
#include "kvtier/format/crc32.h"

namespace kvformat {
namespace {

Error read_error() { return make_error(Reason::IoError, std::string("read: ") + std::strerror(errno)); }

}  // namespace

bool is_sealed_fd(int fd) {
  std::array<std::uint8_t, 12> first{};  // magic, version and the flags
  return ::pread(fd, first.data(), first.size(), 0) == static_cast<ssize_t>(first.size()) &&
         is_sealed(first);
}

Result<ChunkHeader> read_sealed_header_fd(int fd, std::uint64_t file_size) {
  auto head = read_head_fd(fd, file_size);
  if (!head) return head.error();
  return parse_sealed_header(*head, file_size);
}

Result<ChunkHeader> verify_sealed_payload_fd(int fd, const ChunkHeader& header,
                                             std::span<std::uint8_t> buffer) {
  std::uint32_t crc = 0;
  const std::uint64_t end = header.header_length() + header.payload_length;
  for (std::uint64_t at = header.header_length(); at < end;) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), end - at));
    const ssize_t n = ::pread(fd, buffer.data(), want, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return read_error();
    if (n == 0) return make_error(Reason::Truncated, "file shrank while read");
    crc = crc32(buffer.first(static_cast<std::size_t>(n)), crc);
    at += static_cast<std::uint64_t>(n);
  }
  if (auto r = check_payload_checksum(header, crc); !r) return r.error();
  return header;
}

}  // namespace kvformat
