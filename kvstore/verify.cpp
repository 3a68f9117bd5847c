#include "kvtier/kvstore/verify.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "kvtier/format/crc32.h"
#include "kvtier/kvstore/mapped_crc.h"
#include "kvtier/kvstore/scan.h"
#include "kvtier/kvstore/walk.h"
#include "mac_check.h"
#include "parallel.h"
#include "read_buffer.h"


namespace kvstore {

namespace {

// Checksums bytes [from, size) of `fd` chained onto `crc`: straight from the
// page cache through mmap; in blocks through pread if mapping is refused.
Result<uint32_t> payload_crc(int fd, uint64_t size, uint64_t from, uint32_t crc) {
  auto mapped = crc_mapped(fd, size, from, crc);
  if (mapped || mapped.error().kind != ErrorKind::kIo) return mapped;
  thread_local ReadBuffer buf(kWholeReadBytes);
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

// The payload is checksummed: a mismatch is damage.
void settle(ChunkRec& c, uint32_t crc, std::vector<Finding>& found) {
  if (crc == c.checksum) {
    c.payload_ok = true;
    return;
  }
  found.push_back({c.rel, FindingKind::kCorrupt,
                   fmt::format("payload_checksum_mismatch: payload checksum {:08x}, computed {:08x}", c.checksum, crc)});
  c.damaged = true;
}

}  // namespace

void verify_payloads(int rank_fd, size_t rank_prefix, RankInventory& inv, const ScanOptions& opt,
                     uint64_t* bytes_read) {
  if (opt.progress) opt.progress->set_total(inv.chunks.size(), inv.bytes_total);
  // A chunk the scan's read returned whole was checksummed then; the rest are read on here.
  std::vector<size_t> todo;
  uint64_t early = 0;
  for (size_t i = 0; i < inv.chunks.size(); ++i) {
    auto& c = inv.chunks[i];
    early += std::min<uint64_t>(c.st.size, c.crc_done_to);
    if (!c.header_ok || c.damaged) continue;
    // The payload ends before a sealed file's MAC (FORMAT.md 3.6).
    if (c.crc_done_to < c.header_length + c.payload_len)
      todo.push_back(i);
    else
      settle(c, c.crc_partial, inv.findings);
  }
  std::vector<std::vector<Finding>> found(todo.size());
  std::atomic<uint64_t> read_total{0};
  parallel_for(todo.size(), reader_threads(opt.threads), [&](size_t t) {
    auto& c = inv.chunks[todo[t]];
    uint64_t size = c.st.size;
    auto fd = open_beneath(rank_fd, std::string_view(c.rel).substr(rank_prefix), O_RDONLY | O_NONBLOCK);
    if (!fd) {
      if (fd.error().err != ENOENT) found[t].push_back({c.rel, FindingKind::kUnreadable, fd.error().message});
      return;
    }
    struct stat st;
    if (::fstat(fd->get(), &st) != 0 || static_cast<uint64_t>(st.st_ino) != c.st.ino ||
        static_cast<uint64_t>(st.st_size) != size)
      return;  // replaced since the scan read its header: the next verify judges the new file
    const uint64_t end = c.header_length + c.payload_len;
    auto r = payload_crc(fd->get(), end, c.crc_done_to, c.crc_partial);
    read_total.fetch_add(end - c.crc_done_to, std::memory_order_relaxed);
    if (opt.progress) opt.progress->add(0, end - c.crc_done_to);
    if (!r) {
      found[t].push_back({c.rel, r.error().kind == ErrorKind::kIo ? FindingKind::kUnreadable : FindingKind::kTruncated,
                          r.error().message});
      c.damaged = r.error().kind != ErrorKind::kIo;
      return;
    }
    settle(c, *r, found[t]);
  });
  if (bytes_read) *bytes_read += read_total.load() + early;
  for (auto& f : found)
    for (auto& x : f) inv.findings.push_back(std::move(x));
}

void judge_seals(RankInventory& inv) {
  for (auto& c : inv.chunks) {
    if (!c.header_ok || c.sealed) continue;
    inv.findings.push_back({c.rel, FindingKind::kCorrupt, "mac_missing: chunk has no MAC; the store is keyed"});
    c.damaged = true;
  }
}

void verify_macs(int rank_fd, size_t rank_prefix, RankInventory& inv, const ScanOptions& opt) {
  std::vector<std::vector<Finding>> found(inv.chunks.size());
  std::vector<char> replaces(inv.chunks.size(), 0);  // the MAC's verdict comes first (FORMAT.md 3.6)
  parallel_for(inv.chunks.size(), reader_threads(opt.threads), [&](size_t i) {
    auto& c = inv.chunks[i];
    if (!c.header_ok && !c.sealed) return;  // judged already
    if (!c.sealed) {
      // A plain chunk in a keyed store: anyone can write one (CRC and namespace
      // hash are public), so restore refuses it; so does verify.
      found[i].push_back({c.rel, FindingKind::kCorrupt, "mac_missing: chunk has no MAC; the store is keyed"});
      c.damaged = true;
      return;
    }
    auto fd = open_beneath(rank_fd, std::string_view(c.rel).substr(rank_prefix), O_RDONLY | O_NONBLOCK);
    if (!fd) {
      if (fd.error().err != ENOENT) found[i].push_back({c.rel, FindingKind::kUnreadable, fd.error().message});
      return;
    }
    struct stat st;
    // Replaced meanwhile (a chunk verify read whole has no inode recorded: 0).
    if (::fstat(fd->get(), &st) != 0 || (c.st.ino && static_cast<uint64_t>(st.st_ino) != c.st.ino)) return;
    // Shorter than a fixed header, its checksum and a MAC: `truncated`, as judged.
    if (!c.header_ok && st.st_size < 148 + 32) return;
    bool io = false;
    std::string problem = mac_check::chunk_problem(fd->get(), static_cast<uint64_t>(st.st_size), opt.mac_key,
                                                  inv.rank, &io);
    if (problem.empty()) return;  // a header that failed under a good MAC keeps its verdict
    if (!c.header_ok && io) return;
    found[i].push_back({c.rel, io ? FindingKind::kUnreadable : FindingKind::kCorrupt, problem});
    replaces[i] = !c.header_ok;
    c.damaged = !io;
  });
  std::set<std::string> replaced;
  for (size_t i = 0; i < replaces.size(); ++i)
    if (replaces[i]) replaced.insert(inv.chunks[i].rel);
  if (!replaced.empty())
    std::erase_if(inv.findings, [&](const Finding& f) {
      return replaced.count(f.rel) && (f.kind == FindingKind::kTruncated || f.kind == FindingKind::kCorrupt);
    });
  for (auto& f : found)
    for (auto& x : f) inv.findings.push_back(std::move(x));
}

}  // namespace kvstore
