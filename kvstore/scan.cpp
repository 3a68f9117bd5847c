#include "kvtier/kvstore/scan.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "kvtier/format/chunk_verifier.h"
#include "kvtier/kvstore/mapped_crc.h"
#include "kvtier/format/layout.h"
#include "kvtier/format/boundary_manifest.h"
#include "kvtier/format/namespace_record.h"

namespace kvstore {

namespace {

std::string join(const std::string& a, const std::string& b) {
  return a.empty() ? b : a + "/" + b;
}

std::vector<std::string> split(const std::string& rel) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    size_t slash = rel.find('/', pos);
    out.push_back(rel.substr(pos, slash == std::string::npos ? slash : slash - pos));
    if (slash == std::string::npos) return out;
    pos = slash + 1;
  }
}

bool older_than_grace(const FileStat& st, const ScanOptions& opt) {
  return st.mtime_ns + opt.grace_ns <= opt.now_ns;
}

// Reads a whole small file (manifest, namespace record), refusing big ones.
Outcome<std::string> read_small(int fd, const std::string& rel, size_t limit) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return io_error(rel, errno, "cannot stat");
  if (!S_ISREG(st.st_mode)) return io_error(rel, EINVAL, "not a regular file");
  if (static_cast<uint64_t>(st.st_size) > limit) {
    Error e;
    e.kind = ErrorKind::kInvalid;
    e.path = rel;
    e.message = fmt::format("larger than {} bytes", limit);
    return e;
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(rel, errno, "cannot read");
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

std::string short_hex(const std::string& hex) { return hex.substr(0, 16); }

// Runs fn(i, buffer) for i in [0, n) on `threads` threads, each with its own buffer.
template <class Fn>
void parallel_for(size_t n, unsigned threads, size_t buffer_bytes, Fn fn) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    std::vector<uint8_t> buf(buffer_bytes);
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i, buf);
  };
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(std::max<size_t>(n, 1))));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

std::string verdict(const kvformat::Error& e) {
  std::string out(kvformat::reason_name(e.reason));
  if (!e.message.empty()) out += ": " + e.message;
  return out;
}

FindingKind kind_of(kvformat::Reason r) {
  switch (r) {
    case kvformat::Reason::Truncated: return FindingKind::kTruncated;
    case kvformat::Reason::IoError: return FindingKind::kUnreadable;
    default: return FindingKind::kCorrupt;
  }
}

// Reads the header of an open chunk of `size` bytes into `buf` (grown when
// the header is longer) and parses it; the file size is checked too.
kvformat::Result<kvformat::ChunkHeader> read_header(int fd, uint64_t size, std::vector<uint8_t>& buf,
                                                    size_t* got_out) {
  auto fill = [&](size_t want, size_t have) -> kvformat::Result<size_t> {
    if (buf.size() < want) buf.resize(want);
    while (have < want) {
      ssize_t n = ::pread(fd, buf.data() + have, want - have, static_cast<off_t>(have));
      if (n < 0) {
        if (errno == EINTR) continue;
        return kvformat::make_error(kvformat::Reason::IoError, std::string("read: ") + std::strerror(errno));
      }
      if (n == 0) break;
      have += static_cast<size_t>(n);
    }
    return have;
  };
  size_t first = static_cast<size_t>(std::min<uint64_t>(size, std::max<size_t>(buf.size(), 4096)));
  auto got = fill(first, 0);
  if (!got) return got.error();
  size_t have = *got;
  // header_length (offset 12) is bounded before it sizes a read.
  if (have >= kvformat::kFixedHeaderSize) {
    uint64_t hl = 0;
    for (int i = 3; i >= 0; --i) hl = (hl << 8) | buf[12 + i];
    if (hl <= kvformat::kMaxHeaderLength && hl > have && have < size) {
      auto more = fill(static_cast<size_t>(std::min<uint64_t>(hl, size)), have);
      if (!more) return more.error();
      have = *more;
    }
  }
  auto hdr = kvformat::parse_header(std::span<const uint8_t>(buf.data(), have));
  if (!hdr) return hdr;
  if (auto r = kvformat::check_file_size(*hdr, size); !r) return r.error();
  if (got_out) *got_out = have;
  return hdr;
}

// Header, size and payload checksum of an open chunk, in FORMAT.md 3.5's
// order. Reads in cache-sized blocks so the checksum runs on bytes the read
// just put in L2, not on a second trip through memory.
kvformat::Result<kvformat::ChunkHeader> verify_fd(int fd, uint64_t size, std::vector<uint8_t>& buf) {
  size_t have = 0;
  auto hdr = read_header(fd, size, buf, &have);
  if (!hdr) return hdr;
  uint64_t hl = hdr->header_length();
  if (size > hl) {
    // Straight from the page cache; read() below only if mapping is refused.
    auto mapped = crc_mapped(fd, size, hl, 0);
    if (mapped) {
      if (auto r = kvformat::check_payload_checksum(*hdr, *mapped); !r) return r.error();
      return hdr;
    }
    if (mapped.error().kind != ErrorKind::kIo)
      return kvformat::make_error(kvformat::Reason::IoError, mapped.error().message);
  }
  uint32_t crc = kvformat::crc32(std::span<const uint8_t>(buf.data() + hl, have - hl));
  uint64_t off = have;
  while (off < size) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return kvformat::make_error(kvformat::Reason::IoError, std::string("read: ") + std::strerror(errno));
    }
    if (n == 0) return kvformat::make_error(kvformat::Reason::IoError, "file shrank while being read");
    crc = kvformat::crc32(std::span<const uint8_t>(buf.data(), static_cast<size_t>(n)), crc);
    off += static_cast<uint64_t>(n);
  }
  if (auto r = kvformat::check_payload_checksum(*hdr, crc); !r) return r.error();
  return hdr;
}

struct RankContext {
  const ScanOptions& opt;
  RankInventory& inv;
  std::string ns_hex;  // full namespace hash from the record, "" if unknown
};

// Reads the namespace record `<rank name>.json` from `tier_fd`.
void check_namespace(int tier_fd, const std::string& record_rel, RankContext& cx,
                     const kvformat::RankBaseName& base) {
  auto& inv = cx.inv;
  std::string name = kvformat::namespace_record_name(inv.name);
  int fd = ::openat(tier_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    inv.findings.push_back({record_rel, err == EACCES ? FindingKind::kUnreadable : FindingKind::kBadNamespace,
                            err == ENOENT ? "namespace record missing"
                                          : fmt::format("cannot open: {}", std::strerror(err))});
    return;
  }
  Fd guard(fd);
  auto bytes = read_small(fd, record_rel, kvformat::kMaxRecordBytes);
  if (!bytes) {
    inv.findings.push_back({record_rel, FindingKind::kBadNamespace, bytes.error().message});
    return;
  }
  auto rec = kvformat::parse_namespace_record(*bytes);
  if (!rec) {
    inv.findings.push_back({record_rel, FindingKind::kBadNamespace, verdict(rec.error())});
    return;
  }
  auto hash = kvformat::namespace_hash(rec->fenced);
  if (!hash) {
    inv.findings.push_back({record_rel, FindingKind::kBadNamespace, verdict(hash.error())});
    return;
  }
  std::string hex = kvformat::to_hex(*hash);
  if (short_hex(hex) != base.ns_short) {
    inv.findings.push_back({record_rel, FindingKind::kBadNamespace,
                            fmt::format("namespace hash {} does not match the directory name's {}",
                                        short_hex(hex), base.ns_short)});
    return;
  }
  cx.ns_hex = hex;
  inv.namespace_ok = true;
  inv.namespace_hash = hex;
  if (rec->info.is_object() && rec->info.contains("keep_boundaries") &&
      rec->info["keep_boundaries"].is_number_unsigned()) {
    auto k = rec->info["keep_boundaries"].get<uint64_t>();
    if (k <= 1024) inv.keep_hint = static_cast<uint32_t>(k);
  }
}

// Classifies the walked entries of one rank base (rels relative to the base).
void classify(const WalkResult& w, const std::string& prefix, RankContext& cx,
              std::vector<std::pair<ChunkRec, std::string>>& chunks,
              std::vector<std::pair<std::string, FileStat>>& manifest_files) {
  auto& inv = cx.inv;
  std::set<std::string> foreign_dirs;
  for (const auto& d : w.dirs) {
    auto parts = split(d.rel);
    bool ok = false;
    if (parts.size() == 1)
      ok = parts[0] == kvformat::kManifestDir || kvformat::is_chunk_top_dir(parts[0]);
    else if (parts.size() == 2 && kvformat::is_chunk_top_dir(parts[0]))
      ok = kvformat::parse_chunk_leaf_dir(parts[1]).has_value();
    if (!ok) foreign_dirs.insert(d.rel);
  }
  auto under_foreign = [&](const std::string& rel) {
    if (foreign_dirs.empty()) return false;
    for (size_t pos = rel.find('/'); pos != std::string::npos; pos = rel.find('/', pos + 1))
      if (foreign_dirs.count(rel.substr(0, pos))) return true;
    return false;
  };
  for (const auto& d : foreign_dirs)
    if (!under_foreign(d))
      inv.findings.push_back({join(prefix, d), FindingKind::kForeign, "directory not part of the store format"});
  for (const auto& l : w.links)
    if (!under_foreign(l.rel))
      inv.findings.push_back({join(prefix, l.rel), FindingKind::kSymlink, "symlink, not followed"});
  for (const auto& o : w.others)
    if (!under_foreign(o.rel))
      inv.findings.push_back({join(prefix, o.rel), FindingKind::kForeign, "not a regular file"});
  for (const auto& p : w.problems)
    if (!under_foreign(p.rel))
      inv.findings.push_back({join(prefix, p.rel), FindingKind::kUnreadable,
                              fmt::format("{}: {}", p.what, std::strerror(p.err))});

  for (const auto& f : w.files) {
    if (under_foreign(f.rel)) continue;
    auto parts = split(f.rel);
    std::string rel = join(prefix, f.rel);
    bool known = false;
    if (parts.size() == 1 && parts[0] == kvformat::kLockFile) {
      known = true;
    } else if (parts.size() == 2 && parts[0] == kvformat::kManifestDir) {
      if (kvformat::parse_manifest_file_name(parts[1])) {
        manifest_files.emplace_back(f.rel, f.st);
        known = true;
      } else if (auto t = kvformat::parse_temp_name(parts[1]);
                 t && kvformat::parse_manifest_file_name(t->final_name)) {
        inv.temps.push_back({rel, f.st});
        known = true;
      }
    } else if (parts.size() == 3) {
      auto leaf = kvformat::parse_chunk_leaf_dir(parts[1]);
      if (leaf) {
        if (auto key = kvformat::parse_chunk_file_name(parts[2], parts[0], leaf->hh)) {
          ChunkRec c;
          c.rel = rel;
          c.st = f.st;
          c.group = leaf->group;
          c.key = *key;
          chunks.emplace_back(std::move(c), f.rel);
          known = true;
        } else if (auto t = kvformat::parse_temp_name(parts[2]);
                   t && kvformat::parse_chunk_file_name(t->final_name, parts[0], leaf->hh)) {
          inv.temps.push_back({rel, f.st});
          known = true;
        }
      }
    }
    if (!known) inv.findings.push_back({rel, FindingKind::kForeign, "not part of the store format"});
  }
  for (const auto& t : inv.temps)
    if (older_than_grace(t.st, cx.opt))
      inv.findings.push_back({t.rel, FindingKind::kStaleTemp, "writer temp older than the grace period"});
}

unsigned reader_threads(const ScanOptions& opt) {
  return opt.threads ? opt.threads : std::min(4u, std::max(1u, std::thread::hardware_concurrency()));
}

// What the walk read from a chunk-shaped file while its directory was open.
struct EarlyHeader {
  int open_errno = 0;  // the open failed with this
  kvformat::Result<kvformat::ChunkHeader> header = kvformat::make_error(kvformat::Reason::IoError, "");
};
using EarlyHeaders = std::unordered_map<std::string, EarlyHeader>;  // by rel in rank

// Reads every chunk: header (and payload when opt.payloads), on a few
// threads. Headers the walk already read (gc, stat) are taken from `early`.
void check_chunks(int rank_fd, std::vector<std::pair<ChunkRec, std::string>>& chunks, RankContext& cx,
                  uint64_t* bytes_read, EarlyHeaders& early) {
  const auto& opt = cx.opt;
  unsigned threads = reader_threads(opt);
  std::vector<std::vector<Finding>> found(chunks.size());
  std::vector<char> vanished(chunks.size(), 0);
  std::atomic<uint64_t> read_total{0};
  if (opt.progress) {
    uint64_t total = 0;
    for (auto& [c, _] : chunks) total += c.st.size;
    opt.progress->set_total(chunks.size(), opt.payloads ? total : 0);
  }
  size_t buf_bytes = opt.payloads ? opt.buffer_bytes : 4096;
  auto judge = [&](size_t i, kvformat::Result<kvformat::ChunkHeader>& hdr) {
    auto& c = chunks[i].first;
    if (opt.progress) opt.progress->add(1, opt.payloads ? c.st.size : 0);
    if (!hdr) {
      auto kind = kind_of(hdr.error().reason);
      found[i].push_back({c.rel, kind, verdict(hdr.error())});
      c.damaged = kind != FindingKind::kUnreadable;
      return;
    }
    c.header_ok = true;
    c.payload_ok = opt.payloads;
    c.payload_len = hdr->payload_length;
    c.checksum = hdr->payload_checksum;
    c.boundary = hdr->boundary;
    for (const auto& s : hdr->segments)
      if (s.kind == kvformat::SegmentKind::Conv || s.kind == kvformat::SegmentKind::Temporal)
        c.state_group = true;
    std::string ns = kvformat::to_hex(hdr->namespace_hash);
    if (!cx.ns_hex.empty() && ns != cx.ns_hex) {
      found[i].push_back({c.rel, FindingKind::kWrongNamespace,
                          fmt::format("header namespace {} differs from the record's {}",
                                      short_hex(ns), short_hex(cx.ns_hex))});
      c.damaged = true;
    }
    if (hdr->group != c.group || hdr->key_hex() != c.key) {
      found[i].push_back({c.rel, FindingKind::kMisplaced,
                          fmt::format("header says group {} key {}", hdr->group, hdr->key_hex())});
      c.damaged = true;
    }
  };
  parallel_for(chunks.size(), threads, buf_bytes, [&](size_t i, std::vector<uint8_t>& buf) {
    auto& [c, rel_in_rank] = chunks[i];
    if (auto it = early.find(rel_in_rank); it != early.end()) {
      if (it->second.open_errno == ENOENT) {
        vanished[i] = 1;
      } else if (it->second.open_errno) {
        found[i].push_back({c.rel, FindingKind::kUnreadable,
                            fmt::format("cannot open: {}", std::strerror(it->second.open_errno))});
      } else {
        judge(i, it->second.header);
      }
      return;
    }
    auto fd = open_beneath(rank_fd, rel_in_rank, O_RDONLY | O_NONBLOCK);
    if (!fd) {
      if (fd.error().err == ENOENT) {
        vanished[i] = 1;  // a writer's or another sweep's unlink: not ours to report
      } else {
        found[i].push_back({c.rel, FindingKind::kUnreadable, fd.error().message});
        c.damaged = false;
      }
      return;
    }
    // The size from this fd, not the walk: the file may have been replaced.
    struct stat st;
    if (::fstat(fd->get(), &st) != 0) {
      found[i].push_back({c.rel, FindingKind::kUnreadable, std::string("fstat: ") + std::strerror(errno)});
      return;
    }
    uint64_t size = static_cast<uint64_t>(st.st_size);
    kvformat::Result<kvformat::ChunkHeader> hdr = kvformat::make_error(kvformat::Reason::IoError, "");
    if (opt.payloads) {
      ::posix_fadvise(fd->get(), 0, 0, POSIX_FADV_SEQUENTIAL);
      hdr = verify_fd(fd->get(), size, buf);
      read_total.fetch_add(size, std::memory_order_relaxed);
    } else {
      hdr = read_header(fd->get(), size, buf, nullptr);
    }
    judge(i, hdr);
  });
  if (bytes_read) *bytes_read += read_total.load();
  auto& inv = cx.inv;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (vanished[i]) continue;
    for (auto& f : found[i]) inv.findings.push_back(std::move(f));
    inv.bytes_total += chunks[i].first.st.size;
    inv.chunks.push_back(std::move(chunks[i].first));
  }
}

void check_manifests(int rank_fd, const std::vector<std::pair<std::string, FileStat>>& files,
                     const std::string& prefix, int rank, RankContext& cx) {
  auto& inv = cx.inv;
  std::unordered_map<std::string, size_t> chunk_at;  // rel in rank -> index in inv.chunks
  chunk_at.reserve(inv.chunks.size());
  for (size_t i = 0; i < inv.chunks.size(); ++i) {
    std::string r = prefix.empty() ? inv.chunks[i].rel : inv.chunks[i].rel.substr(prefix.size() + 1);
    chunk_at.emplace(std::move(r), i);
  }
  for (const auto& [rel_in_rank, st] : files) {
    ManifestRec m;
    m.rel = join(prefix, rel_in_rank);
    m.name = split(rel_in_rank).back();
    m.st = st;
    auto fd = open_beneath(rank_fd, rel_in_rank, O_RDONLY | O_NONBLOCK);
    if (!fd && fd.error().err == ENOENT) continue;  // superseded by a writer meanwhile
    Outcome<std::string> bytes = fd ? read_small(fd->get(), m.rel, kvformat::kMaxManifestBytes)
                                    : Outcome<std::string>(fd.error());
    if (!bytes) {
      m.readable = bytes.error().kind != ErrorKind::kIo;
      inv.findings.push_back({m.rel, m.readable ? FindingKind::kBadManifest : FindingKind::kUnreadable,
                              bytes.error().message});
      inv.manifests.push_back(std::move(m));
      continue;
    }
    auto parsed = kvformat::parse_manifest(*bytes);
    if (!parsed) {
      inv.findings.push_back({m.rel, FindingKind::kBadManifest, verdict(parsed.error())});
      inv.manifests.push_back(std::move(m));
      continue;
    }
    m.parsed = true;
    m.chain = parsed->chain;
    m.boundary = parsed->boundary;
    auto broken = [&](FindingKind k, std::string detail) {
      inv.findings.push_back({m.rel, k, std::move(detail)});
      m.broken = true;
    };
    if (parsed->file_name() != m.name)
      broken(FindingKind::kBadManifest, fmt::format("file name does not match its content ({})",
                                                    parsed->file_name()));
    if (!cx.ns_hex.empty() && parsed->ns != cx.ns_hex)
      broken(FindingKind::kWrongNamespace, fmt::format("namespace {} differs from the record's {}",
                                                       short_hex(parsed->ns), short_hex(cx.ns_hex)));
    if (rank >= 0 && parsed->rank != static_cast<uint32_t>(rank))
      broken(FindingKind::kBadManifest,
             fmt::format("rank {} differs from the directory's rank {}", parsed->rank, rank));
    for (const auto& g : parsed->groups) {
      for (const auto& e : g.entries) {
        m.refs.push_back({g.group, e.key, e.length, e.checksum, ManifestRef::kNoChunk});
        auto path = kvformat::chunk_rel_path(e.key, g.group);
        if (!path) {
          broken(FindingKind::kBadManifest, fmt::format("invalid key {}", e.key));
          continue;
        }
        auto it = chunk_at.find(*path);
        if (it == chunk_at.end()) {
          broken(FindingKind::kMissing, fmt::format("names {}, which does not exist", *path));
          continue;
        }
        auto& c = inv.chunks[it->second];
        c.named = true;
        m.refs.back().chunk = static_cast<long>(it->second);
        if (c.damaged || !c.header_ok) {
          broken(FindingKind::kMismatch, fmt::format("names {}, which is damaged or unreadable", *path));
        } else if (c.payload_len != e.length || c.checksum != e.checksum) {
          broken(FindingKind::kMismatch,
                 fmt::format("names {} as length {} checksum {:08x}; its header says length {} "
                             "checksum {:08x}",
                             *path, e.length, e.checksum, c.payload_len, c.checksum));
        }
      }
    }
    inv.manifests.push_back(std::move(m));
  }
  for (const auto& c : inv.chunks)
    if (!c.named && !c.damaged && c.header_ok && older_than_grace(c.st, cx.opt))
      inv.findings.push_back({c.rel, FindingKind::kOrphan,
                              fmt::format("named by no manifest ({} group {})",
                                          c.state_group ? "state" : "full", c.group)});
}

}  // namespace

Outcome<RankInventory> scan_rank(int root_fd, const std::string& rank_rel, const std::string& rank_name,
                                 const ScanOptions& opt, uint64_t* bytes_read) {
  RankInventory inv;
  inv.rel = rank_rel;
  inv.name = rank_name;
  RankContext cx{opt, inv, {}};
  auto base = kvformat::parse_rank_base_name(rank_name);
  if (base) inv.rank = static_cast<int>(base->rank);

  Fd rank_dir;
  int rank_fd = root_fd;
  Fd parent_dir;
  int tier_fd = root_fd;
  std::string record_rel = kvformat::namespace_record_name(rank_name);
  if (rank_rel.empty()) {
    // ROOT is the rank base: its record lies beside it. This one named file is
    // the only thing read outside ROOT (O_NOFOLLOW, never written).
    int p = ::openat(root_fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (p < 0) return io_error("..", errno, "cannot open the tier directory");
    parent_dir = Fd(p);
    tier_fd = p;
    record_rel = "../" + record_rel;
  } else {
    auto d = open_beneath(root_fd, rank_rel, O_RDONLY | O_DIRECTORY);
    if (!d) return d.error();
    rank_dir = std::move(*d);
    rank_fd = rank_dir.get();
  }
  if (base) check_namespace(tier_fd, record_rel, cx, *base);

  // gc and stat read each chunk's header during the walk, while its
  // directory is open: one name lookup per file instead of a path walk.
  EarlyHeaders early;
  std::mutex early_mu;
  WalkOptions wopt;
  wopt.threads = reader_threads(opt);
  wopt.on_file = [&](int dfd, const char* name, WalkEntry& e) {
    bool chunk_shaped = !opt.payloads && std::count(e.rel.begin(), e.rel.end(), '/') == 2 &&
                        e.rel.ends_with(".bin");
    if (!chunk_shaped) {
      struct stat st;
      if (::fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) e.st = to_file_stat(st);
      return;
    }
    EarlyHeader h;
    int fd = ::openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      h.open_errno = errno;
      struct stat st;
      if (::fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) e.st = to_file_stat(st);
    } else {
      Fd guard(fd);
      struct stat st;
      if (::fstat(fd, &st) != 0) {
        h.header = kvformat::make_error(kvformat::Reason::IoError, std::string("fstat: ") + std::strerror(errno));
      } else {
        e.st = to_file_stat(st);
        thread_local std::vector<uint8_t> buf(4096);
        h.header = read_header(fd, e.st.size, buf, nullptr);
      }
    }
    std::lock_guard lk(early_mu);
    early.emplace(e.rel, std::move(h));
  };
  WalkResult w = walk(rank_fd, wopt);
  std::vector<std::pair<ChunkRec, std::string>> chunks;
  std::vector<std::pair<std::string, FileStat>> manifest_files;
  classify(w, rank_rel, cx, chunks, manifest_files);
  check_chunks(rank_fd, chunks, cx, bytes_read, early);
  // Sorted before the manifests resolve refs to chunk indexes.
  std::sort(inv.chunks.begin(), inv.chunks.end(),
            [](const ChunkRec& a, const ChunkRec& b) { return a.rel < b.rel; });
  check_manifests(rank_fd, manifest_files, rank_rel, inv.rank, cx);
  std::sort(inv.findings.begin(), inv.findings.end());
  return inv;
}

Outcome<StoreScan> scan_store(int root_fd, const std::string& root_name, const ScanOptions& opt) {
  StoreScan scan;
  if (kvformat::parse_rank_base_name(root_name)) {
    scan.root_is_rank = true;
    auto inv = scan_rank(root_fd, "", root_name, opt, &scan.bytes_read);
    if (!inv) return inv.error();
    scan.ranks.push_back(std::move(*inv));
    return scan;
  }
  // A tier directory: rank bases, their namespace records and record temps.
  WalkResult w = list_dir(root_fd);
  std::vector<std::string> ranks;
  for (const auto& d : w.dirs) {
    if (kvformat::parse_rank_base_name(d.rel))
      ranks.push_back(d.rel);
    else
      scan.findings.push_back({d.rel, FindingKind::kForeign, "directory not part of the store format"});
  }
  auto is_record_name = [](const std::string& name) {
    return name.size() > 5 && name.ends_with(".json") &&
           kvformat::parse_rank_base_name(name.substr(0, name.size() - 5)).ok();
  };
  for (const auto& f : w.files) {
    if (is_record_name(f.rel)) continue;
    if (auto t = kvformat::parse_temp_name(f.rel); t && is_record_name(t->final_name)) {
      scan.record_temps.push_back({f.rel, f.st});
      if (older_than_grace(f.st, opt))
        scan.findings.push_back({f.rel, FindingKind::kStaleTemp, "namespace record temp older than the grace period"});
      continue;
    }
    scan.findings.push_back({f.rel, FindingKind::kForeign, "not part of the store format"});
  }
  for (const auto& l : w.links) scan.findings.push_back({l.rel, FindingKind::kSymlink, "symlink, not followed"});
  for (const auto& o : w.others) scan.findings.push_back({o.rel, FindingKind::kForeign, "not a regular file"});
  for (const auto& p : w.problems)
    scan.findings.push_back({p.rel, FindingKind::kUnreadable, fmt::format("{}: {}", p.what, std::strerror(p.err))});
  std::sort(ranks.begin(), ranks.end());
  for (const auto& r : ranks) {
    auto inv = scan_rank(root_fd, r, r, opt, &scan.bytes_read);
    if (!inv) {
      scan.findings.push_back({r, FindingKind::kUnreadable, inv.error().message});
      continue;
    }
    scan.ranks.push_back(std::move(*inv));
  }
  std::sort(scan.findings.begin(), scan.findings.end());
  return scan;
}

std::vector<Finding> all_findings(const StoreScan& scan) {
  std::vector<Finding> out = scan.findings;
  for (const auto& r : scan.ranks) out.insert(out.end(), r.findings.begin(), r.findings.end());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kvstore
