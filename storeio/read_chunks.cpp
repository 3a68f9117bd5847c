// kvtier_read_chunks (store_abi.h): one chunk file checked and read into
// memory runs, on as many threads as asked.
//
// The order of checks is the Python restore's (kv_restore_read.check_header,
// then the size, then the payload), so both name the same failure for the
// same file: codec header checks (FORMAT.md 3.5), then what the manifest
// entry and this boot expect, then the file size, then the payload CRC.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "crc_combine.h"
#include "fault.h"
#include "fd.h"
#include "item_status.h"
#include "kvtier/format/crc32.h"
#include "kvtier/format/header.h"
#if KVTIER_STORE_HAVE_MAC
#include "kvtier/format/mac.h"
#endif
#include "kvtier/store_abi.h"
#include "no_links.h"
#include "parallel.h"
#include "safe_folders.h"
#include "segments.h"

namespace storeio {
namespace {

constexpr std::size_t kHeadRead = 64 << 10;  // as kv_store_format.chunk's first read
// Bytes read per preadv: small enough that the CRC that follows finds them
// still in cache, large enough that the system-call cost does not show.
constexpr std::uint64_t kWindow = 1 << 20;
constexpr int kIovMax = 1024;
// A file is split across threads only in parts of at least this much.
constexpr std::uint64_t kMinPiece = 4 << 20;

#if KVTIER_STORE_HAVE_MAC
using MacFeed = kvformat::ChunkMacCheck;
#else
struct MacFeed {
  void update(std::span<const std::uint8_t>) {}
};
#endif

struct Failure {
  std::int32_t status;
  std::string reason;
  int err;
  std::string text;
};

Failure format_failure(const kvformat::Error& e) {
  return {KVTIER_E_FORMAT, std::string(kvformat::reason_name(e.reason)), 0, e.message};
}

Failure io_failure(int err, std::string what) {
  return {KVTIER_E_IO, "io_error", err, what + ": " + std::strerror(err)};
}

Failure mismatch(std::string reason, std::string text) {
  return {KVTIER_E_MISMATCH, std::move(reason), 0, std::move(text)};
}

// pread until `n` bytes or the end of the file; the bytes read, or -errno.
long long pread_full(int fd, std::uint8_t* dst, std::size_t n, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, dst + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  return static_cast<long long>(done);
}

// The first bytes of the file, enough for its header (kv_store_format.chunk
// read_header_bytes: the same reads, so the codec sees the same prefix).
std::optional<Failure> read_head(int fd, std::uint64_t size, std::vector<std::uint8_t>& head) {
  head.resize(std::min<std::uint64_t>(size, kHeadRead));
  long long n = pread_full(fd, head.data(), head.size(), 0);
  if (n < 0) return io_failure(static_cast<int>(-n), "reading the header");
  head.resize(static_cast<std::size_t>(n));
  const auto declared = kvformat::declared_header_length(head);
  if (declared && head.size() < *declared && *declared <= kvformat::kMaxHeaderLength) {
    const std::size_t have = head.size();
    head.resize(std::min<std::uint64_t>(size, *declared));
    n = pread_full(fd, head.data() + have, head.size() - have, have);
    if (n < 0) return io_failure(static_cast<int>(-n), "reading the header");
    head.resize(have + static_cast<std::size_t>(n));
  }
  return std::nullopt;
}

std::optional<Failure> check_expected(const kvformat::ChunkHeader& h, const kvtier_read_item& item,
                                      const std::vector<kvformat::Segment>& segments) {
  if (std::memcmp(h.namespace_hash.data(), item.namespace_hash, h.namespace_hash.size()) != 0)
    return mismatch("foreign_namespace", "chunk of another namespace");
  if (h.group != item.group)
    return mismatch("wrong_group",
                    "group " + std::to_string(h.group) + " != " + std::to_string(item.group));
  if (h.key_hash.size() != item.key_hash_length ||
      !std::equal(h.key_hash.begin(), h.key_hash.end(), item.key_hash))
    return mismatch("wrong_key", "key hash differs from the manifest");
  if (h.boundary != item.boundary)
    return mismatch("wrong_boundary", "boundary " + std::to_string(h.boundary) +
                                          " != " + std::to_string(item.boundary));
  if (h.payload_length != item.payload_length || h.payload_checksum != item.payload_checksum)
    return mismatch("manifest_mismatch", "payload length or checksum differs from the manifest");
  if (h.segments != segments)
    return mismatch("layout_mismatch", "segment table differs from this boot's layout");
  return std::nullopt;
}

// preadv `limit` payload bytes from file offset `offset` into the runs,
// starting at byte `in_run` of runs[run]; the CRC (unless `crc_implied`)
// and `mac`, when given, over each window right after it arrived, while it
// is still in cache. Fails `truncated` if the file ends early.
std::optional<Failure> read_range(int fd, std::uint64_t offset, const kvtier_run* runs,
                                  std::uint32_t num_runs, std::uint32_t run, std::uint64_t in_run,
                                  std::uint64_t limit, std::uint32_t& crc,
                                  std::uint64_t& bytes_read, MacFeed* mac, bool crc_implied) {
  std::vector<iovec> iov;
  iov.reserve(16);
  while (run < num_runs && limit > 0) {
    // The next window: up to kWindow bytes of the following runs.
    iov.clear();
    std::uint64_t want = 0;
    const std::uint64_t cap = std::min(kWindow, limit);
    for (std::uint32_t r = run; r < num_runs && want < cap && iov.size() < kIovMax; ++r) {
      const std::uint64_t start = r == run ? in_run : 0;
      const std::uint64_t take = std::min(runs[r].length - start, cap - want);
      if (take == 0) continue;
      iov.push_back({reinterpret_cast<void*>(runs[r].address + start), take});
      want += take;
    }
    if (want == 0) break;  // only empty runs left
    std::uint64_t got = 0;
    std::size_t first = 0;
    while (got < want) {
      ssize_t n;
      if (const int err = injected_fault(KVTIER_FAULT_READ)) {
        errno = err;
        n = -1;
      } else {
        n = ::preadv(fd, iov.data() + first, static_cast<int>(iov.size() - first),
                     static_cast<off_t>(offset + got));
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        return io_failure(errno, "reading the payload");
      }
      if (n == 0)
        return Failure{KVTIER_E_FORMAT, "truncated", 0, "file ended while reading"};
      pace_read(static_cast<std::uint64_t>(n));
      got += static_cast<std::uint64_t>(n);
      // Advance the iovecs past what arrived (a short read continues there).
      std::uint64_t left = static_cast<std::uint64_t>(n);
      while (left && first < iov.size()) {
        if (left >= iov[first].iov_len) {
          left -= iov[first].iov_len;
          ++first;
        } else {
          iov[first].iov_base = static_cast<std::uint8_t*>(iov[first].iov_base) + left;
          iov[first].iov_len -= left;
          left = 0;
        }
      }
    }
    // CRC the window over the destination bytes, in payload order.
    std::uint64_t left = want;
    while (left) {
      const std::uint64_t take = std::min(runs[run].length - in_run, left);
      const std::span<const std::uint8_t> landed(
          reinterpret_cast<const std::uint8_t*>(runs[run].address + in_run), take);
      if (!crc_implied) crc = kvformat::crc32(landed, crc);
      if (mac) mac->update(landed);
      in_run += take;
      left -= take;
      bytes_read += take;
      if (in_run == runs[run].length) {
        ++run;
        in_run = 0;
      }
    }
    offset += want;
    limit -= want;
  }
  return std::nullopt;
}

// The whole payload in `pieces` parts read at once on their own threads
// (a job of fewer files than threads still uses them all); the CRCs of the
// parts combined in payload order. `mac` is fed the payload in order: window
// by window in one part, or over the runs after the parts landed (a MAC
// takes its bytes in order; only a file split across threads pays that pass).
std::optional<Failure> read_payload(int fd, std::uint64_t offset, const kvtier_run* runs,
                                    std::uint32_t num_runs, std::uint64_t length,
                                    unsigned pieces, std::uint32_t& crc,
                                    std::uint64_t& bytes_read, MacFeed* mac,
                                    bool crc_implied) {
  const std::uint64_t piece =
      std::max<std::uint64_t>(kMinPiece, (length + pieces - 1) / std::max(1u, pieces));
  const std::size_t count = length == 0 ? 1 : static_cast<std::size_t>((length + piece - 1) / piece);
  if (count <= 1)
    return read_range(fd, offset, runs, num_runs, 0, 0, length, crc, bytes_read, mac,
                      crc_implied);
  struct Part {
    std::uint32_t run = 0;
    std::uint64_t in_run = 0;
    std::uint64_t start = 0;
    std::uint64_t length = 0;
    std::uint32_t crc = 0;
    std::uint64_t bytes = 0;
    std::optional<Failure> failure;
  };
  std::vector<Part> parts(count);
  std::uint32_t run = 0;
  std::uint64_t run_start = 0;  // payload offset of runs[run]
  for (std::size_t p = 0; p < count; ++p) {
    Part& part = parts[p];
    part.start = p * piece;
    part.length = std::min(piece, length - part.start);
    while (run < num_runs && run_start + runs[run].length <= part.start)
      run_start += runs[run++].length;
    part.run = run;
    part.in_run = part.start - run_start;
  }
  parallel_for(count, static_cast<unsigned>(count), [&](std::size_t p) {
    Part& part = parts[p];
    part.failure = read_range(fd, offset + part.start, runs, num_runs, part.run, part.in_run,
                              part.length, part.crc, part.bytes, nullptr, crc_implied);
  });
  for (const Part& part : parts) {
    if (part.failure) return part.failure;
    crc = crc32_combine(crc, part.crc, part.bytes);
    bytes_read += part.bytes;
  }
  if (mac)
    for (std::uint32_t r = 0; r < num_runs; ++r)
      mac->update({reinterpret_cast<const std::uint8_t*>(runs[r].address),
                   static_cast<std::size_t>(runs[r].length)});
  return std::nullopt;
}

#if KVTIER_STORE_HAVE_MAC
Failure mac_failure(kvformat::Reason reason, std::string text) {
  return {KVTIER_E_FORMAT, std::string(kvformat::reason_name(reason)), 0, std::move(text)};
}

// The 32 bytes after the body: the MAC the file claims (v3: salt || tag).
std::optional<Failure> read_tag(int fd, std::uint64_t at, kvformat::Trailer& tag) {
  const long long n = pread_full(fd, tag.data(), tag.size(), at);
  if (n < 0) return io_failure(static_cast<int>(-n), "reading the MAC");
  if (static_cast<std::size_t>(n) != tag.size())
    return Failure{KVTIER_E_FORMAT, "truncated", 0, "file ended before its MAC"};
  return std::nullopt;
}

// The MAC of the whole body read from the file (the slow path: only a file
// that fails some other check pays it, to know which verdict comes first).
std::optional<Failure> body_mac_differs(int fd, std::uint64_t size, const kvtier_read_item& item,
                                        std::uint16_t version, const kvformat::Trailer& tag) {
  kvformat::ChunkMacCheck mac({item.mac_key, item.mac_key_length}, item.mac_rank, version, tag);
  std::vector<std::uint8_t> buf(std::min<std::uint64_t>(kWindow, size));
  const std::uint64_t body = size - kvformat::kMacSize;
  for (std::uint64_t at = 0; at < body;) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), body - at));
    const long long n = pread_full(fd, buf.data(), want, at);
    if (n < 0) return io_failure(static_cast<int>(-n), "reading for the MAC");
    if (n == 0) return Failure{KVTIER_E_FORMAT, "truncated", 0, "file shrank while read"};
    mac.update({buf.data(), static_cast<std::size_t>(n)});
    at += static_cast<std::uint64_t>(n);
  }
  if (!mac.matches()) return mac_failure(kvformat::Reason::MacMismatch, "chunk MAC differs");
  return std::nullopt;
}
#endif

std::optional<Failure> check_arguments(const kvtier_read_item& item) {
  auto bad = [](std::string text) {
    return Failure{KVTIER_E_ARGUMENT, "bad_argument", 0, std::move(text)};
  };
  if (!item.path && item.fd < 0) return bad("neither a path nor a descriptor");
  if (!item.namespace_hash) return bad("no namespace hash");
  if (!item.key_hash && item.key_hash_length) return bad("no key hash");
  if (!item.segments && item.num_segments) return bad("no segment table");
  if (!item.runs && item.num_runs) return bad("no destination runs");
#if KVTIER_STORE_HAVE_MAC
  if (item.mac_key && !item.mac_key_length) return bad("an empty MAC key");
#else
  if (item.mac_key) return bad("a keyed store, and this library was built without OpenSSL");
#endif
  std::uint64_t total = 0;
  for (std::uint32_t i = 0; i < item.num_runs; ++i) {
    if (item.runs[i].length && !item.runs[i].address) return bad("a run at address 0");
    total += item.runs[i].length;
  }
  if (total != item.payload_length)
    return bad("the runs hold " + std::to_string(total) + " bytes, the payload is " +
               std::to_string(item.payload_length));
  return std::nullopt;
}

#if KVTIER_STORE_HAVE_MAC
// A keyed file (FORMAT.md 3.6): the MAC's verdict comes before every other.
// The trailer is read first (a v3 seal's salt keys the MAC), the header is
// parsed as the plain file it seals (flag cleared, checksum redone) only to
// learn where the payload goes; the payload is read into the runs as a
// plain file's, the MAC fed the header and then each window of the runs'
// bytes as it lands, exactly what the caller will use. A file that fails
// any check has its whole body MAC'd from disk first, so a forgery is always
// mac_mismatch, as the Python codec (open_chunk before verify_chunk) says.
std::optional<Failure> read_keyed(int fd, std::uint64_t size, std::vector<std::uint8_t> head,
                                  kvtier_read_item& item,
                                  const std::vector<kvformat::Segment>& segments, bool willneed,
                                  unsigned pieces) {
  if (!kvformat::is_sealed(head))
    return mac_failure(kvformat::Reason::MacMissing, "chunk has no MAC; the store is keyed");
  if (size < kvformat::kMinHeaderLength - kvformat::kSegmentEntrySize + kvformat::kMacSize)
    return Failure{KVTIER_E_FORMAT, "truncated", 0, "too short for a MAC"};
  const std::uint64_t body = size - kvformat::kMacSize;
  kvformat::Trailer tag{};
  if (auto f = read_tag(fd, body, tag)) return f;
  const std::uint16_t version = kvformat::raw_version(head);
  kvformat::ChunkMacCheck mac({item.mac_key, item.mac_key_length}, item.mac_rank, version, tag);
  if (!mac.known())
    return mac_failure(kvformat::Reason::MacMismatch,
                       "sealed chunk of format version " + std::to_string(version) +
                           ": no MAC this reader knows");
  auto refused = [&](Failure f) -> std::optional<Failure> {
    if (auto m = body_mac_differs(fd, size, item, version, tag)) return m;
    return f;
  };
  auto header = kvformat::parse_sealed_header(head, size);  // as mac.py's open_chunk
  if (!header) return refused(format_failure(header.error()));
  if (auto f = check_expected(*header, item, segments)) return refused(*f);

  const std::uint64_t header_length = header->header_length();
  if (willneed)
    (void)::posix_fadvise(fd, static_cast<off_t>(header_length),
                          static_cast<off_t>(header->payload_length + kvformat::kMacSize),
                          POSIX_FADV_WILLNEED);
  mac.update({head.data(), static_cast<std::size_t>(header_length)});  // as sealed
  // A v3 tag authenticates every payload byte and the header's CRC (which
  // the manifest's matched): once it holds, the payload CRC could only
  // disagree if the key's holder sealed bytes it did not CRC, so it is not
  // computed again (FORMAT.md 3.6; half the work of a keyed read). A v2
  // seal keeps it, as that format's readers did.
  const bool crc_implied = version == kvformat::kSealedVersion;
  std::uint32_t crc = 0;
  if (auto f = read_payload(fd, header_length, item.runs, item.num_runs, header->payload_length,
                            pieces, crc, item.bytes_read, &mac, crc_implied))
    return refused(*f);
  if (!mac.matches()) return mac_failure(kvformat::Reason::MacMismatch, "chunk MAC differs");
  if (crc_implied) return std::nullopt;
  if (auto r = kvformat::check_payload_checksum(*header, crc); !r)
    return format_failure(r.error());
  return std::nullopt;
}
#endif

std::optional<Failure> read_one(kvtier_read_item& item, bool willneed, bool safe_folders,
                               unsigned pieces) {
  if (auto f = check_arguments(item)) return f;
  if (safe_folders && item.path) {
    if (auto problem = chunk_folders_problem(item.path))
      return Failure{KVTIER_E_UNSAFE, "unsafe_folder", 0, "store folder not safe: " + *problem};
  }
  const auto segments = to_segments(item.segments, item.num_segments);
  if (!segments) return Failure{KVTIER_E_ARGUMENT, "bad_argument", 0, "a segment with ndim > 6"};

  kvtier::Fd owned;
  int fd = item.fd;
  if (item.path) {
    // No symlink as the file or as a folder on its path (FORMAT.md 2).
    owned = kvtier::Fd(open_no_links(item.path, O_RDONLY | O_NONBLOCK));
    if (!owned.valid()) {
      const int err = errno;
      if (err == ENOENT) return Failure{KVTIER_E_MISSING, "missing_file", err, std::strerror(err)};
      if (err == ELOOP)
        return Failure{KVTIER_E_IO, "io_error", err,
                       "open: the file or a folder on its path is a symlink (the store follows none)"};
      return io_failure(err, "open");
    }
    fd = owned.get();
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io_failure(errno, "fstat");
  // A FIFO or device where a chunk belongs: never read it (FORMAT.md 2).
  if (!S_ISREG(st.st_mode)) return io_failure(EINVAL, "not a regular file");
  const auto size = static_cast<std::uint64_t>(st.st_size);

  std::vector<std::uint8_t> head;
  if (auto f = read_head(fd, size, head)) return f;
#if KVTIER_STORE_HAVE_MAC
  if (item.mac_key) return read_keyed(fd, size, std::move(head), item, *segments, willneed, pieces);
#endif
  auto header = kvformat::parse_header(head);
  if (!header) return format_failure(header.error());
  if (auto f = check_expected(*header, item, *segments)) return f;
  if (auto r = kvformat::check_file_size(*header, size); !r) return format_failure(r.error());

  if (willneed)
    (void)::posix_fadvise(fd, static_cast<off_t>(header->header_length()),
                          static_cast<off_t>(header->payload_length), POSIX_FADV_WILLNEED);
  std::uint32_t crc = 0;
  if (auto f = read_payload(fd, header->header_length(), item.runs, item.num_runs,
                            header->payload_length, pieces, crc, item.bytes_read, nullptr, false))
    return f;
  if (auto r = kvformat::check_payload_checksum(*header, crc); !r)
    return format_failure(r.error());
  return std::nullopt;
}

}  // namespace
}  // namespace storeio

extern "C" int64_t kvtier_read_chunks(kvtier_read_item* items, size_t count, uint32_t threads,
                                      uint32_t flags) {
  constexpr uint32_t kKnown =
      KVTIER_READ_STOP_ON_FAILURE | KVTIER_READ_WILLNEED | KVTIER_READ_SAFE_FOLDERS;
  if (flags & ~kKnown) return -1;
  if (count == 0) return 0;
  if (!items) return -1;
  const bool stop_on_failure = flags & KVTIER_READ_STOP_ON_FAILURE;
  const bool willneed = flags & KVTIER_READ_WILLNEED;
  const bool safe_folders = flags & KVTIER_READ_SAFE_FOLDERS;
  std::atomic<bool> failed{false};
  std::atomic<int64_t> bad{0};
  const unsigned workers = storeio::thread_count(threads, count);
  // Threads the items cannot use one each: their payloads are split instead.
  const unsigned pieces = std::max(1u, storeio::thread_count(threads, SIZE_MAX) / workers);
  storeio::parallel_for(count, workers, [&](std::size_t i) {
    kvtier_read_item& item = items[i];
    item.bytes_read = 0;
    const auto out = storeio::status_fields_of(item);
    if (stop_on_failure && failed.load(std::memory_order_relaxed)) {
      storeio::set_failure(out, KVTIER_E_SKIPPED, "skipped", 0, item.path,
                           "not read: another file of the call failed");
      bad.fetch_add(1);
      return;
    }
    try {
      if (auto f = storeio::read_one(item, willneed, safe_folders, pieces)) {
        storeio::set_failure(out, f->status, f->reason, f->err, item.path, f->text);
        failed.store(true, std::memory_order_relaxed);
        bad.fetch_add(1);
      } else {
        storeio::set_ok(out);
      }
    } catch (const std::exception& e) {  // allocation failure: never across the C ABI
      storeio::set_failure(out, KVTIER_E_IO, "io_error", ENOMEM, item.path, e.what());
      failed.store(true, std::memory_order_relaxed);
      bad.fetch_add(1);
    }
  });
  return bad.load();
}
