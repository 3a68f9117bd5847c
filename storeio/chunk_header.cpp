// The chunk-header calls of the C ABI (store_abi.h, ABI 5): a header read
// from a path (the writer's dedup), parsed from bytes or encoded from its
// fields, and a whole chunk verified in memory or from a path, all through
// format/ (the keyed ones' MAC: chunk_seal.cpp).
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <span>
#include <variant>
#include <vector>

#include <unistd.h>

#include "abi_result.h"
#include "chunk_abi.h"
#include "fd.h"
#include "kvtier/format/chunk_verifier.h"
#include "kvtier/format/header.h"
#if KVTIER_STORE_HAVE_MAC
#include "kvtier/format/mac.h"
#endif
#include "kvtier/store_abi.h"
#include "no_links.h"
#include "segments.h"

namespace storeio {

void fill_header(const kvformat::ChunkHeader& h, kvtier_chunk_header* header,
                 kvtier_segment* segments, std::uint32_t capacity) {
  *header = kvtier_chunk_header{};
  header->format_version = h.format_version;
  header->checksum_algorithm = h.checksum_algorithm;
  header->key_hash_length = static_cast<std::uint8_t>(h.key_hash.size());
  header->group = h.group;
  header->boundary = h.boundary;
  header->payload_length = h.payload_length;
  header->payload_checksum = h.payload_checksum;
  header->header_length = h.header_length();
  header->num_segments = static_cast<std::uint32_t>(h.segments.size());
  std::memcpy(header->namespace_hash, h.namespace_hash.data(), sizeof header->namespace_hash);
  std::copy(h.key_hash.begin(), h.key_hash.end(), header->key_hash);
  const std::size_t n = std::min<std::size_t>(capacity, h.segments.size());
  for (std::size_t i = 0; i < n; ++i) {
    const kvformat::Segment& s = h.segments[i];
    kvtier_segment& e = segments[i];
    e = kvtier_segment{};
    e.layer = s.layer;
    e.kind = static_cast<std::uint8_t>(s.kind);
    e.dtype = static_cast<std::uint8_t>(s.dtype);
    e.ndim = static_cast<std::uint8_t>(s.shape.size());
    e.part = s.part;
    e.offset = s.offset;
    e.length = s.length;
    std::copy(s.shape.begin(), s.shape.end(), e.shape);
    std::copy(s.stride.begin(), s.stride.end(), e.stride);
  }
}

std::optional<std::int32_t> bad_outputs(kvtier_result* out, const kvtier_chunk_header* header,
                                        const kvtier_segment* segments, std::uint32_t capacity) {
  if (!header) return result_bad_argument(out, "no header to fill");
  if (!segments && capacity) return result_bad_argument(out, "no segments with a nonzero capacity");
  return std::nullopt;
}

std::variant<kvtier::Fd, std::int32_t> open_store_file(const char* path, kvtier_result* out,
                                                       std::uint64_t* size) {
  const auto io_failure = [&](int err, const char* what) {
    return result_failure(out, KVTIER_E_IO, "io_error", err, path,
                          std::string(what) + ": " + std::strerror(err));
  };
  if (!path || !*path) return result_bad_argument(out, "no path");
  // No symlink as the file or as a folder on its path (FORMAT.md 2).
  kvtier::Fd fd(open_no_links(path, O_RDONLY | O_NONBLOCK));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENOENT)
      return result_failure(out, KVTIER_E_MISSING, "missing_file", err, path, std::strerror(err));
    if (err == ELOOP)
      return result_failure(out, KVTIER_E_IO, "io_error", err, path,
                            "the file or a folder on its path is a symlink (the store follows none)");
    return io_failure(err, "open");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return io_failure(errno, "fstat");
  // A FIFO or device where a chunk belongs: never read it (FORMAT.md 2).
  if (!S_ISREG(st.st_mode)) return io_failure(EINVAL, "not a regular file");
  *size = static_cast<std::uint64_t>(st.st_size);
  return fd;
}

}  // namespace storeio

using storeio::result_bad_argument;
using storeio::result_error;
using storeio::result_failure;
using storeio::result_ok;
using storeio::run_call;

extern "C" {

int32_t kvtier_read_chunk_header(const char* path, uint32_t flags, kvtier_chunk_header* header,
                                 kvtier_segment* segments, uint32_t capacity, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::bad_outputs(out, header, segments, capacity)) return *r;
    if (flags & ~KVTIER_HEADER_SEALED) return result_bad_argument(out, "unknown flags");
    std::uint64_t size = 0;
    auto opened = storeio::open_store_file(path, out, &size);
    if (auto* status = std::get_if<std::int32_t>(&opened)) return *status;
    const kvtier::Fd fd = std::move(std::get<kvtier::Fd>(opened));
    auto head = kvformat::read_head_fd(fd.get(), size);
    if (!head) return result_error(out, head.error(), path, errno);
    kvformat::Result<kvformat::ChunkHeader> parsed = kvformat::Error{};
    if (flags & KVTIER_HEADER_SEALED) {
      if (!kvformat::is_sealed(*head))
        return result_error(out,
                            kvformat::make_error(kvformat::Reason::MacMissing,
                                                 "chunk has no MAC; the store is keyed"),
                            path);
      parsed = kvformat::parse_sealed_header(*head, size);
    } else {
      parsed = kvformat::parse_header(*head);
      if (parsed) {
        if (auto r = kvformat::check_file_size(*parsed, size); !r) parsed = r.error();
      }
    }
    if (!parsed) return result_error(out, parsed.error(), path);
    storeio::fill_header(*parsed, header, segments, capacity);
    return result_ok(out, {});
  });
}

int32_t kvtier_parse_chunk_header(const uint8_t* bytes, size_t length, kvtier_chunk_header* header,
                                  kvtier_segment* segments, uint32_t capacity, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::bad_outputs(out, header, segments, capacity)) return *r;
    if (!bytes && length) return result_bad_argument(out, "input is NULL with a nonzero length");
    auto parsed = kvformat::parse_header({bytes, length});
    if (!parsed) return result_error(out, parsed.error());
    storeio::fill_header(*parsed, header, segments, capacity);
    return result_ok(out, {});
  });
}

int32_t kvtier_encode_chunk_header(const kvtier_chunk_header* header,
                                   const kvtier_segment* segments, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (!header) return result_bad_argument(out, "no header");
    if (!segments && header->num_segments) return result_bad_argument(out, "no segments");
    if (header->key_hash_length > sizeof header->key_hash)
      return result_error(out, kvformat::make_error(kvformat::Reason::BadKeyHash,
                                                    "key hash " + std::to_string(header->key_hash_length) + " B"));
    auto table = storeio::to_segments(segments, header->num_segments);
    if (!table)
      return result_error(out, kvformat::make_error(kvformat::Reason::BadSegmentTable, "ndim > 6"));
    kvformat::ChunkHeader h;
    std::memcpy(h.namespace_hash.data(), header->namespace_hash, h.namespace_hash.size());
    h.group = header->group;
    h.key_hash.assign(header->key_hash, header->key_hash + header->key_hash_length);
    h.boundary = header->boundary;
    h.segments = std::move(*table);
    h.payload_length = header->payload_length;
    h.payload_checksum = header->payload_checksum;
    h.checksum_algorithm = header->checksum_algorithm;
    h.format_version = header->format_version;
    auto bytes = kvformat::encode_header(h);
    if (!bytes) return result_error(out, bytes.error());
    return result_ok(out, {reinterpret_cast<const char*>(bytes->data()), bytes->size()});
  });
}

int32_t kvtier_verify_chunk(const uint8_t* file, size_t length, const uint8_t* mac_key,
                            uint32_t mac_key_length, uint32_t mac_rank, kvtier_chunk_header* header,
                            kvtier_segment* segments, uint32_t capacity, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::bad_outputs(out, header, segments, capacity)) return *r;
    if (!file && length) return result_bad_argument(out, "input is NULL with a nonzero length");
    std::span<const std::uint8_t> bytes(file, length);
    std::vector<std::uint8_t> plain;
    if (mac_key) {
#if KVTIER_STORE_HAVE_MAC
      if (!mac_key_length) return result_bad_argument(out, "an empty key");
      auto opened = storeio::open_sealed(bytes, {mac_key, mac_key_length}, mac_rank, out, nullptr);
      if (auto* status = std::get_if<std::int32_t>(&opened)) return *status;
      plain = std::move(std::get<std::vector<std::uint8_t>>(opened));
      bytes = plain;
#else
      (void)mac_rank;
      return result_bad_argument(out, "a keyed store, and this library was built without OpenSSL");
#endif
    }
    auto verified = kvformat::verify_chunk(bytes);
    if (!verified) return result_error(out, verified.error());
    storeio::fill_header(*verified, header, segments, capacity);
    return result_ok(out, {});
  });
}

int32_t kvtier_verify_chunk_file(const char* path, uint64_t block_size, const uint8_t* mac_key,
                                 uint32_t mac_key_length, uint32_t mac_rank,
                                 kvtier_chunk_header* header, kvtier_segment* segments,
                                 uint32_t capacity, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::bad_outputs(out, header, segments, capacity)) return *r;
    if (mac_key && !mac_key_length) return result_bad_argument(out, "an empty key");
    std::uint64_t size = 0;
    auto opened = storeio::open_store_file(path, out, &size);
    if (auto* status = std::get_if<std::int32_t>(&opened)) return *status;
    const kvtier::Fd fd = std::move(std::get<kvtier::Fd>(opened));
    kvformat::Result<kvformat::ChunkHeader> verified = kvformat::Error{};
    if (mac_key) {
#if KVTIER_STORE_HAVE_MAC
      // Whole: the MAC comes first and covers every byte (FORMAT.md 3.6).
      std::vector<std::uint8_t> file(static_cast<std::size_t>(size));
      std::size_t have = 0;
      while (have < file.size()) {
        const ssize_t n = ::pread(fd.get(), file.data() + have, file.size() - have,
                                  static_cast<off_t>(have));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
          return result_failure(out, KVTIER_E_IO, "io_error", errno, path,
                                std::string("read: ") + std::strerror(errno));
        if (n == 0) break;
        have += static_cast<std::size_t>(n);
      }
      file.resize(have);
      auto plain = storeio::open_sealed(file, {mac_key, mac_key_length}, mac_rank, out, path);
      if (auto* status = std::get_if<std::int32_t>(&plain)) return *status;
      verified = kvformat::verify_chunk(std::get<std::vector<std::uint8_t>>(plain));
#else
      (void)mac_rank;
      return result_bad_argument(out, "a keyed store, and this library was built without OpenSSL");
#endif
    } else {
      std::vector<std::uint8_t> buffer(static_cast<std::size_t>(
          std::clamp<std::uint64_t>(block_size ? block_size : std::uint64_t{8} << 20, 1,
                                    std::uint64_t{64} << 20)));
      verified = kvformat::verify_chunk_fd(fd.get(), buffer);
    }
    if (!verified) return result_error(out, verified.error(), path, errno);
    storeio::fill_header(*verified, header, segments, capacity);
    return result_ok(out, {});
  });
}

}  // extern "C"
