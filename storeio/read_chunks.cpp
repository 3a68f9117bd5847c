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
#include <cstring>
#include <string>
#include <vector>

#include "fault.h"
#include "fd.h"
#include "item_status.h"
#include "kvtier/format/crc32.h"
#include "kvtier/format/header.h"
#include "kvtier/store_abi.h"
#include "parallel.h"
#include "segments.h"

namespace storeio {
namespace {

constexpr std::size_t kHeadRead = 64 << 10;  // as kv_store_format.chunk's first read
// Bytes read per preadv: small enough that the CRC that follows finds them
// still in cache, large enough that the system-call cost does not show.
constexpr std::uint64_t kWindow = 1 << 20;
constexpr int kIovMax = 1024;

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

// preadv the payload from `offset` into the runs, the CRC over each window
// right after it arrived. Fails `truncated` if the file ends early.
std::optional<Failure> read_payload(int fd, std::uint64_t offset, const kvtier_run* runs,
                                    std::uint32_t num_runs, std::uint32_t& crc,
                                    std::uint64_t& bytes_read) {
  std::uint32_t run = 0;
  std::uint64_t in_run = 0;  // bytes of runs[run] already read
  std::vector<iovec> iov;
  iov.reserve(16);
  while (run < num_runs) {
    // The next window: up to kWindow bytes of the following runs.
    iov.clear();
    std::uint64_t want = 0;
    for (std::uint32_t r = run; r < num_runs && want < kWindow && iov.size() < kIovMax; ++r) {
      const std::uint64_t start = r == run ? in_run : 0;
      const std::uint64_t take = std::min(runs[r].length - start, kWindow - want);
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
      crc = kvformat::crc32(
          {reinterpret_cast<const std::uint8_t*>(runs[run].address + in_run), take}, crc);
      in_run += take;
      left -= take;
      bytes_read += take;
      if (in_run == runs[run].length) {
        ++run;
        in_run = 0;
      }
    }
    offset += want;
  }
  return std::nullopt;
}

std::optional<Failure> check_arguments(const kvtier_read_item& item) {
  auto bad = [](std::string text) {
    return Failure{KVTIER_E_ARGUMENT, "bad_argument", 0, std::move(text)};
  };
  if (!item.path && item.fd < 0) return bad("neither a path nor a descriptor");
  if (!item.namespace_hash) return bad("no namespace hash");
  if (!item.key_hash && item.key_hash_length) return bad("no key hash");
  if (!item.segments && item.num_segments) return bad("no segment table");
  if (!item.runs && item.num_runs) return bad("no destination runs");
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

std::optional<Failure> read_one(kvtier_read_item& item, bool willneed) {
  if (auto f = check_arguments(item)) return f;
  const auto segments = to_segments(item.segments, item.num_segments);
  if (!segments) return Failure{KVTIER_E_ARGUMENT, "bad_argument", 0, "a segment with ndim > 6"};

  kvtier::Fd owned;
  int fd = item.fd;
  if (item.path) {
    owned = kvtier::Fd(::open(item.path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!owned.valid()) {
      const int err = errno;
      if (err == ENOENT) return Failure{KVTIER_E_MISSING, "missing_file", err, std::strerror(err)};
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
  auto header = kvformat::parse_header(head);
  if (!header) return format_failure(header.error());
  if (auto f = check_expected(*header, item, *segments)) return f;
  if (auto r = kvformat::check_file_size(*header, size); !r) return format_failure(r.error());

  if (willneed)
    (void)::posix_fadvise(fd, static_cast<off_t>(header->header_length()),
                          static_cast<off_t>(header->payload_length), POSIX_FADV_WILLNEED);
  std::uint32_t crc = 0;
  if (auto f = read_payload(fd, header->header_length(), item.runs, item.num_runs, crc,
                            item.bytes_read))
    return f;
  if (auto r = kvformat::check_payload_checksum(*header, crc); !r)
    return format_failure(r.error());
  return std::nullopt;
}

}  // namespace
}  // namespace storeio

extern "C" int64_t kvtier_read_chunks(kvtier_read_item* items, size_t count, uint32_t threads,
                                      uint32_t flags) {
  if (count == 0) return 0;
  if (!items) return -1;
  const bool stop_on_failure = flags & KVTIER_READ_STOP_ON_FAILURE;
  const bool willneed = flags & KVTIER_READ_WILLNEED;
  std::atomic<bool> failed{false};
  std::atomic<int64_t> bad{0};
  storeio::parallel_for(count, storeio::thread_count(threads, count), [&](std::size_t i) {
    kvtier_read_item& item = items[i];
    item.bytes_read = 0;
    const auto out = storeio::outcome_of(item);
    if (stop_on_failure && failed.load(std::memory_order_relaxed)) {
      storeio::set_failure(out, KVTIER_E_SKIPPED, "skipped", 0, item.path,
                           "not read: another file of the call failed");
      bad.fetch_add(1);
      return;
    }
    try {
      if (auto f = storeio::read_one(item, willneed)) {
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
