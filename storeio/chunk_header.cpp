// The chunk-header calls of the C ABI (store_abi.h, ABI 5): a header read
// from a path (the writer's dedup), parsed from bytes, and a keyed chunk
// opened under its MAC, all through format/.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "abi_result.h"
#include "fd.h"
#include "kvtier/format/chunk_verifier.h"
#include "kvtier/format/header.h"
#if KVTIER_STORE_HAVE_MAC
#include "kvtier/format/mac.h"
#endif
#include "kvtier/store_abi.h"
#include "no_links.h"

namespace storeio {
namespace {

void fill(const kvformat::ChunkHeader& h, kvtier_chunk_header* header, kvtier_segment* segments,
          std::uint32_t capacity) {
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

std::int32_t io_failure(kvtier_result* out, int err, const char* path, const std::string& what) {
  return result_failure(out, KVTIER_E_IO, "io_error", err, path, what + ": " + std::strerror(err));
}

}  // namespace
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
    if (!path || !*path) return result_bad_argument(out, "no path");
    if (flags & ~KVTIER_HEADER_SEALED) return result_bad_argument(out, "unknown flags");
    // No symlink as the file or as a folder on its path (FORMAT.md 2).
    kvtier::Fd fd(storeio::open_no_links(path, O_RDONLY | O_NONBLOCK));
    if (!fd.valid()) {
      const int err = errno;
      if (err == ENOENT)
        return result_failure(out, KVTIER_E_MISSING, "missing_file", err, path, std::strerror(err));
      if (err == ELOOP)
        return result_failure(out, KVTIER_E_IO, "io_error", err, path,
                              "the file or a folder on its path is a symlink (the store follows none)");
      return storeio::io_failure(out, err, path, "open");
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return storeio::io_failure(out, errno, path, "fstat");
    // A FIFO or device where a chunk belongs: never read it (FORMAT.md 2).
    if (!S_ISREG(st.st_mode)) return storeio::io_failure(out, EINVAL, path, "not a regular file");
    const auto size = static_cast<std::uint64_t>(st.st_size);
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
    storeio::fill(*parsed, header, segments, capacity);
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
    storeio::fill(*parsed, header, segments, capacity);
    return result_ok(out, {});
  });
}

int32_t kvtier_open_chunk(const uint8_t* file, size_t length, const uint8_t* mac_key,
                          uint32_t mac_key_length, uint32_t mac_rank, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (!file && length) return result_bad_argument(out, "input is NULL with a nonzero length");
    if (!mac_key || !mac_key_length) return result_bad_argument(out, "no key");
#if KVTIER_STORE_HAVE_MAC
    using kvformat::Reason;
    const std::span<const std::uint8_t> bytes(file, length);
    switch (kvformat::check_chunk_mac({mac_key, mac_key_length}, mac_rank, bytes)) {
      case kvformat::MacVerdict::Ok:
        break;
      case kvformat::MacVerdict::Missing:
        return result_error(out, kvformat::make_error(Reason::MacMissing,
                                                      "chunk has no MAC; the store is keyed"));
      case kvformat::MacVerdict::Truncated:
        return result_error(out, kvformat::make_error(Reason::Truncated,
                                                      std::to_string(length) +
                                                          " bytes, too short for a MAC"));
      case kvformat::MacVerdict::Mismatch: {
        const auto version = kvformat::raw_version(bytes);
        if (version != kvformat::kSealedVersion && !kvformat::readable_version(version))
          return result_error(out, kvformat::make_error(
                                       Reason::MacMismatch,
                                       "sealed chunk of format version " + std::to_string(version) +
                                           ": no MAC this reader knows"));
        return result_error(out, kvformat::make_error(Reason::MacMismatch, "chunk MAC differs"));
      }
    }
    std::vector<std::uint8_t> plain(bytes.begin(), bytes.end() - kvformat::kMacSize);
    if (!kvformat::unseal_header(plain))
      return result_error(out, kvformat::make_error(Reason::BadHeaderLength, "header length"));
    return result_ok(out, {reinterpret_cast<const char*>(plain.data()), plain.size()});
#else
    (void)mac_rank;
    return result_bad_argument(out, "a keyed store, and this library was built without OpenSSL");
#endif
  });
}

}  // extern "C"
