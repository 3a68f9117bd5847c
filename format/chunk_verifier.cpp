#include "kvtier/format/chunk_verifier.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvformat {

ChunkVerifier::ChunkVerifier(std::uint64_t file_size) : file_size_(file_size) {}

Result<void> ChunkVerifier::try_parse_header() {
  // The header is parseable once we hold min(file size, max header) bytes.
  const std::uint64_t need = std::min<std::uint64_t>(file_size_, kMaxHeaderLength);
  if (head_.size() < need) {
    // Enough for a verdict earlier? Once the fixed part is in, header_length
    // tells how much is really needed.
    if (head_.size() < kFixedHeaderSize) return {};
    const std::uint64_t header_length = *declared_header_length(head_);
    if (header_length > kMaxHeaderLength || head_.size() < std::min(header_length, need))
      return {};
  }
  auto parsed = parse_header(head_);
  if (!parsed) return parsed.error();
  if (auto r = check_file_size(*parsed, file_size_); !r) return r;
  header_ = std::move(parsed.value());
  // Bytes past the header that are already buffered belong to the payload.
  crc_.update(std::span<const std::uint8_t>(head_).subspan(header_->header_length()));
  head_.clear();
  head_.shrink_to_fit();
  return {};
}

Result<void> ChunkVerifier::update(std::span<const std::uint8_t> data) {
  if (failed_) return *failed_;
  fed_ += data.size();
  if (fed_ > file_size_) {
    failed_ = make_error(Reason::IoError, "file grew while being read");
    return *failed_;
  }
  if (header_) {
    crc_.update(data);
    return {};
  }
  head_.insert(head_.end(), data.begin(), data.end());
  if (auto r = try_parse_header(); !r) {
    failed_ = r.error();
    return r;
  }
  return {};
}

Result<ChunkHeader> ChunkVerifier::finish() {
  if (failed_) return *failed_;
  if (fed_ != file_size_) return make_error(Reason::IoError, "file shrank while being read");
  if (!header_) {
    // Fewer bytes than a header needs: let parse_header name the verdict.
    auto parsed = parse_header(head_);
    if (!parsed) return parsed.error();
    if (auto r = check_file_size(*parsed, file_size_); !r) return r.error();
    return make_error(Reason::Truncated, "incomplete header");
  }
  if (auto r = check_payload_checksum(*header_, crc_.value()); !r) return r.error();
  return *header_;
}

namespace {

Error io_error(const char* what) {
  return make_error(Reason::IoError, std::string(what) + ": " + std::strerror(errno));
}

}  // namespace

Result<ChunkHeader> verify_chunk_fd(int fd, std::span<std::uint8_t> buffer) {
  struct stat st;
  if (fstat(fd, &st) != 0) return io_error("fstat");
  const auto size = static_cast<std::uint64_t>(st.st_size);
#ifdef POSIX_FADV_SEQUENTIAL
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  ChunkVerifier verifier(size);
  std::uint64_t offset = 0;
  while (offset < size) {
    const std::size_t want = static_cast<std::size_t>(
        std::min<std::uint64_t>(buffer.size(), size - offset));
    const ssize_t got = pread(fd, buffer.data(), want, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return io_error("read");
    }
    if (got == 0) break;  // shrank; finish() reports it
    offset += static_cast<std::uint64_t>(got);
    if (auto r = verifier.update(buffer.first(static_cast<std::size_t>(got))); !r)
      return r.error();
  }
  return verifier.finish();
}

Result<std::vector<std::uint8_t>> read_head_fd(int fd, std::uint64_t file_size) {
  // A first read this long covers a header of up to about 540 segments;
  // only a longer one takes a second read, sized by its declared length
  // (bounded first), so a short or lying file gets the verdict a read of
  // kMaxHeaderLength bytes would give it.
  constexpr std::uint64_t kFirstRead = std::uint64_t{64} << 10;
  std::vector<std::uint8_t> head;
  const auto read_to = [&](std::uint64_t want) -> Result<void> {
    std::size_t have = head.size();
    head.resize(static_cast<std::size_t>(want));
    while (have < head.size()) {
      const ssize_t got = pread(fd, head.data() + have, head.size() - have,
                                static_cast<off_t>(have));
      if (got < 0) {
        if (errno == EINTR) continue;
        return io_error("read");
      }
      if (got == 0) break;  // shrank: the parser names the verdict
      have += static_cast<std::size_t>(got);
    }
    head.resize(have);
    return {};
  };
  if (auto r = read_to(std::min(file_size, kFirstRead)); !r) return r.error();
  const auto declared = declared_header_length(head);
  if (declared && head.size() < *declared && *declared <= kMaxHeaderLength)
    if (auto r = read_to(std::min<std::uint64_t>(file_size, *declared)); !r) return r.error();
  return head;
}

Result<ChunkHeader> read_chunk_header_fd(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return io_error("fstat");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  auto head = read_head_fd(fd, size);
  if (!head) return head.error();
  auto parsed = parse_header(*head);
  if (!parsed) return parsed;
  if (auto r = check_file_size(*parsed, size); !r) return r.error();
  return parsed;
}

}  // namespace kvformat
