#include "kvtier/kvstore/verify.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "kvtier/format/crc32.h"
#include "kvtier/kvstore/mapped_crc.h"
#include "kvtier/kvstore/scan.h"
#include "kvtier/kvstore/walk.h"
#include "parallel.h"

namespace kvstore {

namespace {

// Checksums bytes [from, size) of `fd` chained onto `crc`: straight from the
// page cache through mmap; in blocks through pread if mapping is refused.
Outcome<uint32_t> payload_crc(int fd, uint64_t size, uint64_t from, uint32_t crc) {
  auto mapped = crc_mapped(fd, size, from, crc);
  if (mapped || mapped.error().kind != ErrorKind::kIo) return mapped;
  thread_local std::vector<uint8_t> buf(kWholeReadBytes);
  for (uint64_t off = from; off < size;) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error("", errno, "read");
    }
    if (n == 0) {
      Error e;
      e.kind = ErrorKind::kInvalid;
      e.message = "file shrank while being read";
      return e;
    }
    crc = kvformat::crc32(std::span<const uint8_t>(buf.data(), static_cast<size_t>(n)), crc);
    off += static_cast<uint64_t>(n);
  }
  return crc;
}

}  // namespace

void verify_payloads(int rank_fd, const std::vector<std::string>& rels_in_rank, RankInventory& inv,
                     const ScanOptions& opt, uint64_t* bytes_read) {
  std::vector<size_t> todo;
  for (size_t i = 0; i < inv.chunks.size(); ++i) {
    const auto& c = inv.chunks[i];
    if (!c.header_ok || c.damaged) continue;
    todo.push_back(i);
  }
  if (opt.progress) opt.progress->set_total(inv.chunks.size(), inv.bytes_total);
  std::vector<std::vector<Finding>> found(todo.size());
  std::atomic<uint64_t> read_total{0};
  parallel_for(todo.size(), reader_threads(opt.threads), [&](size_t t) {
    auto& c = inv.chunks[todo[t]];
    uint32_t crc = c.crc_partial;
    uint64_t size = c.st.size;
    if (c.crc_done_to < size) {
      auto fd = open_beneath(rank_fd, rels_in_rank[todo[t]], O_RDONLY | O_NONBLOCK);
      if (!fd) {
        if (fd.error().err != ENOENT) found[t].push_back({c.rel, FindingKind::kUnreadable, fd.error().message});
        return;
      }
      struct stat st;
      if (::fstat(fd->get(), &st) != 0 || static_cast<uint64_t>(st.st_ino) != c.st.ino ||
          static_cast<uint64_t>(st.st_size) != size)
        return;  // replaced since the scan read its header: the next verify judges the new file
      auto r = payload_crc(fd->get(), size, c.crc_done_to, crc);
      read_total.fetch_add(size - c.crc_done_to, std::memory_order_relaxed);
      if (opt.progress) opt.progress->add(0, size - c.crc_done_to);
      if (!r) {
        found[t].push_back({c.rel, r.error().kind == ErrorKind::kIo ? FindingKind::kUnreadable : FindingKind::kTruncated,
                            r.error().message});
        c.damaged = r.error().kind != ErrorKind::kIo;
        return;
      }
      crc = *r;
    }
    if (crc != c.checksum) {
      found[t].push_back({c.rel, FindingKind::kCorrupt,
                          fmt::format("payload_checksum_mismatch: payload checksum {:08x}, computed {:08x}",
                                      c.checksum, crc)});
      c.damaged = true;
      return;
    }
    c.payload_ok = true;
  });
  if (bytes_read) *bytes_read += read_total.load() + [&] {
    uint64_t early = 0;
    for (const auto& c : inv.chunks) early += std::min<uint64_t>(c.st.size, c.crc_done_to);
    return early;
  }();
  for (auto& f : found)
    for (auto& x : f) inv.findings.push_back(std::move(x));
}

}  // namespace kvstore
