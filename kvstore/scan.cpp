#include "kvtier/kvstore/scan.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "kvtier/format/boundary_manifest.h"
#include "kvtier/format/crc32.h"
#include "kvtier/format/header.h"
#include "kvtier/format/layout.h"
#include "kvtier/format/namespace_record.h"
#include "kvtier/format/pending_record.h"
#include "kvtier/kvstore/verify.h"
#include "parallel.h"
#include "read_buffer.h"
#include "scan_detail.h"

namespace kvstore {

namespace {

using namespace scan_detail;

FindingKind kind_of(kvformat::Reason r) {
  switch (r) {
    case kvformat::Reason::Truncated: return FindingKind::kTruncated;
    case kvformat::Reason::IoError: return FindingKind::kUnreadable;
    default: return FindingKind::kCorrupt;
  }
}


// Reads the header of an open chunk of `size` bytes, of which the first `*got`
// are in buf already: the first read takes min(size, buf.size()) bytes (so a
// small chunk arrives whole), a longer header is read on. Parses it and checks
// the file size. `*got` becomes the number of bytes of the file now in buf.
kvformat::Result<kvformat::ChunkHeader> read_header(int fd, uint64_t size, ReadBuffer& buf, size_t* got) {
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
  auto first = fill(static_cast<size_t>(std::min<uint64_t>(size, buf.size())), *got);
  if (!first) return first.error();
  size_t have = *first;
  // The declared header_length is bounded before it sizes a read.
  if (have >= kvformat::kFixedHeaderSize) {
    uint64_t hl = *kvformat::declared_header_length(std::span<const uint8_t>(buf.data(), have));
    if (hl <= kvformat::kMaxHeaderLength && hl > have && have < size) {
      auto more = fill(static_cast<size_t>(std::min<uint64_t>(hl, size)), have);
      if (!more) return more.error();
      have = *more;
    }
  }
  *got = have;
  const std::span<const uint8_t> head(buf.data(), have);
  // A keyed store's file (FORMAT.md 3.6) parses as the plain header it
  // seals, its MAC after the payload (checked by verify --key only).
  if (kvformat::is_sealed(head)) return kvformat::parse_sealed_header(head, size);
  auto hdr = kvformat::parse_header(head);
  if (!hdr) return hdr;
  if (auto r = kvformat::check_file_size(*hdr, size); !r) return r.error();
  return hdr;
}


// `hex` spells `bytes` (lowercase), compared without building a string.
bool hex_equals(std::span<const uint8_t> bytes, std::string_view hex) {
  static constexpr char kDigits[] = "0123456789abcdef";
  if (hex.size() != bytes.size() * 2) return false;
  for (size_t i = 0; i < bytes.size(); ++i)
    if (hex[2 * i] != kDigits[bytes[i] >> 4] || hex[2 * i + 1] != kDigits[bytes[i] & 15]) return false;
  return true;
}


// One chunk as the walk found it, judged on the walker thread: the header
// read while its directory was open (one name lookup per file), and for a
// chunk that arrived whole in that read, its payload checksum too (verify).
struct Probe {
  ChunkRec rec;
  int open_errno = 0;
  std::vector<Finding> findings;
};

// Fills a chunk record from its header and records what is wrong.
void judge(Probe& p, const kvformat::Result<kvformat::ChunkHeader>& header, const RankContext& cx) {
  auto& c = p.rec;
  auto& found = p.findings;
  if (!header) {
    auto kind = kind_of(header.error().reason);
    // "truncated: truncated: ..." says it twice: the kind is enough then.
    const auto& e = header.error();
    bool same = std::string_view(finding_name(kind)) == kvformat::reason_name(e.reason) && !e.message.empty();
    found.push_back({c.rel, kind, same ? e.message : verdict(e)});
    c.damaged = kind != FindingKind::kUnreadable;
    return;
  }
  const auto& hdr = *header;
  c.header_ok = true;
  c.payload_len = hdr.payload_length;
  c.checksum = hdr.payload_checksum;
  c.boundary = hdr.boundary;
  c.header_length = static_cast<uint32_t>(hdr.header_length());
  for (const auto& s : hdr.segments)
    if (s.kind == kvformat::SegmentKind::Conv || s.kind == kvformat::SegmentKind::Temporal) c.state_group = true;
  if (!cx.ns_hex.empty() && hdr.namespace_hash != cx.ns_bytes) {
    found.push_back({c.rel, FindingKind::kWrongNamespace,
                     fmt::format("header namespace {} differs from the record's {}",
                                 short_hex(kvformat::to_hex(hdr.namespace_hash)), short_hex(cx.ns_hex))});
    c.damaged = true;
  }
  if (hdr.group != c.group || !hex_equals(hdr.key_hash, c.key)) {
    found.push_back({c.rel, FindingKind::kMisplaced, fmt::format("header says group {} key {}", hdr.group, hdr.key_hex())});
    c.damaged = true;
  }
}

// One pread from the start of the file. On a regular file a read returns
// short only at the end of the file, so a short read's length is its size.
kvformat::Result<size_t> read_start(int fd, ReadBuffer& buf) {
  for (;;) {
    ssize_t n = ::pread(fd, buf.data(), buf.size(), 0);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno != EINTR) return kvformat::make_error(kvformat::Reason::IoError, std::string("read: ") + std::strerror(errno));
  }
}

void probe_chunk(int dfd, const char* name, WalkEntry& e, const RankContext& cx, Probe& p) {
  int fd = ::openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    p.open_errno = errno;
    struct stat st;
    if (::fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) e.st = to_file_stat(st);
    return;
  }
  Fd guard(fd);
  // gc and stat need the header only; verify reads a small chunk whole here.
  thread_local ReadBuffer buf;
  size_t want = cx.opt.payloads ? kWholeReadBytes : 4096;
  if (buf.size() != want) buf.assign(want, 0);
  size_t have = 0;
  bool whole = false;  // the first read returned the whole file
  if (!cx.opt.stat_chunks) {
    auto n = read_start(fd, buf);
    if (!n) return judge(p, n.error(), cx);
    have = *n;
    whole = have < buf.size();
  }
  if (whole) {
    // The fstat a bigger chunk needs is saved (about a microsecond a file);
    // the age of an unnamed one is read at the end.
    e.st = FileStat{};
    e.st.size = have;
    e.st.mtime_ns = kTimeNotRead;
    e.st.mode = S_IFREG;
  } else {
    struct stat st;
    if (::fstat(fd, &st) != 0)
      return judge(p, kvformat::make_error(kvformat::Reason::IoError, std::string("fstat: ") + std::strerror(errno)), cx);
    e.st = to_file_stat(st);
  }
  p.rec.st = e.st;
  auto header = read_header(fd, e.st.size, buf, &have);
  judge(p, header, cx);
  p.rec.sealed = kvformat::is_sealed(std::span<const uint8_t>(buf.data(), have));
  if (!header) return;
  if (!cx.opt.payloads) return;
  uint64_t hl = header->header_length();
  const uint64_t end = hl + header->payload_length;  // a sealed file's MAC follows
  if (have > hl) {
    const uint64_t to = std::min<uint64_t>(have, end);
    p.rec.crc_partial = kvformat::crc32(std::span<const uint8_t>(buf.data() + hl, to - hl));
    p.rec.crc_done_to = to;
  } else {
    p.rec.crc_done_to = hl;
  }
}


// Sorts chunk records by path: the order is sorted as indexes, then applied
// by following the permutation's cycles, so each record moves about once
// (sorting the records themselves moved them ~17 times each at 40,000).
// Every rel starts with the same `cut` bytes (the rank base); the next eight
// (top folder and leaf prefix) sort as one integer, and only equal ones are
// compared as strings: far fewer visits to the records than a string sort.
void sort_by_rel(std::vector<ChunkRec>& chunks, size_t cut) {
  std::vector<std::pair<uint64_t, uint32_t>> keyed(chunks.size());
  for (uint32_t i = 0; i < keyed.size(); ++i) {
    std::string_view tail = std::string_view(chunks[i].rel).substr(cut);
    uint64_t k = 0;
    for (size_t b = 0; b < 8; ++b) k = (k << 8) | (b < tail.size() ? static_cast<uint8_t>(tail[b]) : 0);
    keyed[i] = {k, i};
  }
  std::sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    return chunks[a.second].rel < chunks[b.second].rel;
  });
  std::vector<uint32_t> order(chunks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = keyed[i].second;
  // order[i] is the record that belongs at i.
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] == i) continue;
    ChunkRec held = std::move(chunks[i]);
    size_t at = i;
    while (order[at] != i) {
      size_t from = order[at];
      chunks[at] = std::move(chunks[from]);
      order[at] = static_cast<uint32_t>(at);
      at = from;
    }
    chunks[at] = std::move(held);
    order[at] = static_cast<uint32_t>(at);
  }
}

}  // namespace

Result<RankInventory> scan_rank(int root_fd, const std::string& rank_rel, const std::string& rank_name,
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
    // ROOT is the rank base: its record lies beside it (FORMAT.md 2). This one
    // named file is the only thing read outside ROOT (O_NOFOLLOW, never written).
    // O_PATH: the record is opened through it, so search permission on the
    // tier folder is enough (0711 works as for cat).
    int p = ::openat(root_fd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
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

  // Chunks are probed during the walk, while their directory is open. Each
  // walker gathers a batch of records and moves it into inv.chunks under one
  // lock, a lock per 256 chunks rather than per chunk. One vector (not one
  // per walker, joined after) keeps gc's peak memory at 200,000 chunks
  // 30 MiB lower.
  constexpr size_t kBatch = 256;
  struct Gathered {
    std::vector<ChunkRec> chunks;
    std::vector<Finding> findings;
    uint64_t bytes = 0;
  };
  std::mutex gathered_mu;
  auto hand_over = [&](Gathered& g) {
    std::lock_guard lk(gathered_mu);
    std::move(g.chunks.begin(), g.chunks.end(), std::back_inserter(inv.chunks));
    std::move(g.findings.begin(), g.findings.end(), std::back_inserter(inv.findings));
    inv.bytes_total += g.bytes;
    g.chunks.clear();
    g.findings.clear();
    g.bytes = 0;
  };
  // The walkers share the counters' cache line: bump them only for a line
  // someone sees (about 2% of a verify of small chunks otherwise).
  Progress* shown = opt.progress && opt.progress->drawn() ? opt.progress : nullptr;
  WalkOptions wopt;
  wopt.threads = reader_threads(opt.threads);
  std::vector<Gathered> gathered(std::max(1u, wopt.threads));
  wopt.on_file = [&](unsigned worker, int dfd, const char* name, WalkEntry& e) {
    // Only "<hhh>/<hh>_g<g>/<hash>.bin" in matching folders is a chunk.
    std::string_view rel = e.rel;
    size_t s1 = rel.find('/');
    size_t s2 = s1 == std::string_view::npos ? s1 : rel.find('/', s1 + 1);
    std::optional<kvformat::LeafDir> leaf;
    std::optional<std::string> key;
    if (s2 != std::string_view::npos && rel.find('/', s2 + 1) == std::string_view::npos) {
      std::string_view top = rel.substr(0, s1), mid = rel.substr(s1 + 1, s2 - s1 - 1), file = rel.substr(s2 + 1);
      if (kvformat::is_chunk_top_dir(top) && (leaf = kvformat::parse_chunk_leaf_dir(mid)))
        key = kvformat::parse_chunk_file_name(file, top, leaf->hh);
    }
    if (!key) {
      struct stat st;
      if (::fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) e.st = to_file_stat(st);
      return true;
    }
    Probe p;
    // The walk keeps no entry it was handed (on_file returns false), so its name can move.
    p.rec.rel = rank_rel.empty() ? std::move(e.rel) : join(rank_rel, e.rel);
    p.rec.group = leaf->group;
    p.rec.key = std::move(*key);
    probe_chunk(dfd, name, e, cx, p);
    if (shown) shown->add(1, opt.payloads ? std::min<uint64_t>(e.st.size, kWholeReadBytes) : 0);
    if (p.open_errno == ENOENT) return false;  // a writer's or another sweep's unlink: not ours to report
    auto& mine = gathered[worker];
    if (p.open_errno)
      mine.findings.push_back({p.rec.rel, FindingKind::kUnreadable, fmt::format("cannot open: {}", std::strerror(p.open_errno))});
    for (auto& f : p.findings) mine.findings.push_back(std::move(f));
    mine.bytes += p.rec.st.size;
    mine.chunks.push_back(std::move(p.rec));
    if (mine.chunks.size() == kBatch) hand_over(mine);
    return false;
  };
  if (shown) wopt.on_dir = [&] { shown->add_dirs(1); };
  wopt.keep_dir = [](std::string_view rel) { return !is_store_dir(rel); };
  wopt.stat_dirs = true;
  WalkResult w = walk(rank_fd, wopt);
  for (auto& g : gathered) hand_over(g);
  check_folders(w, rank_rel, cx);
  Classified found = classify(w, rank_rel, cx);
  size_t cut = rank_rel.empty() ? 0 : rank_rel.size() + 1;
  sort_by_rel(inv.chunks, cut);

  // verify: the payload pass, before manifests judge the chunks they name.
  if (opt.payloads) verify_payloads(rank_fd, cut, inv, opt, bytes_read);
  if (cx.check_macs) verify_macs(rank_fd, cut, inv, opt);
  else if (cx.judge_seals) judge_seals(inv);

  const ChunkIndex chunk_at(inv.chunks);
  std::set<std::pair<uint32_t, std::string>> pending;
  check_pendings(rank_fd, found.pendings, rank_rel, cx, pending);
  check_manifests(rank_fd, found.manifests, rank_rel, inv.rank, cx, chunk_at);
  for (const auto& [group, key] : pending)
    if (long at = chunk_at.find(group, key); at != ChunkIndex::kNone) inv.chunks[at].pending = true;
  for (auto& c : inv.chunks) {
    if (c.named || c.pending || c.damaged || !c.header_ok) continue;
    if (c.st.mtime_ns == kTimeNotRead) {
      auto st = stat_beneath(rank_fd, std::string_view(c.rel).substr(cut));
      if (!st) continue;  // removed since the walk: nothing left to report
      c.st.mtime_ns = st->mtime_ns;
    }
    if (older_than_grace(c.st, opt))
      inv.findings.push_back(
          {c.rel, FindingKind::kOrphan,
           fmt::format("named by no manifest ({} group {})", c.state_group ? "state" : "full", c.group)});
  }
  std::sort(inv.findings.begin(), inv.findings.end());
  return inv;
}

Result<TierListing> list_tier(int root_fd, const std::string& root_name, const ScanOptions& opt) {
  TierListing tier;
  if (kvformat::parse_rank_base_name(root_name)) {
    tier.root_is_rank = true;
    tier.ranks.push_back({"", root_name});
    return tier;
  }
  // A tier directory: rank bases, their namespace records and record temps.
  WalkResult w = list_dir(root_fd);
  for (const auto& d : w.dirs) {
    if (kvformat::parse_rank_base_name(d.rel))
      tier.ranks.push_back({d.rel, d.rel});
    else
      tier.findings.push_back({d.rel, FindingKind::kForeign, "directory not part of the store format"});
  }
  auto is_record_name = [](const std::string& name) {
    return name.size() > 5 && name.ends_with(".json") &&
           kvformat::parse_rank_base_name(name.substr(0, name.size() - 5)).ok();
  };
  for (const auto& f : w.files) {
    if (is_record_name(f.rel)) continue;
    if (auto t = kvformat::parse_temp_name(f.rel); t && is_record_name(t->final_name)) {
      tier.record_temps.push_back({f.rel, f.st});
      if (record_temp_is_dead(root_fd, f.rel, f.st, opt))
        tier.findings.push_back({f.rel, FindingKind::kStaleTemp, "namespace record temp older than the grace period"});
      continue;
    }
    tier.findings.push_back({f.rel, FindingKind::kForeign, "not part of the store format"});
  }
  for (const auto& l : w.links) {
    // A rank folder made a link (issue 45): a finding about the link, not
    // "no store here".
    if (kvformat::parse_rank_base_name(l.rel))
      tier.findings.push_back({l.rel, FindingKind::kUnsafeFolder,
                               l.rel + " is a symlink where a rank folder belongs; nothing follows it"});
    else
      tier.findings.push_back({l.rel, FindingKind::kSymlink, "symlink, not followed"});
  }
  for (const auto& o : w.others)
    if (!is_record_name(o.rel))  // a record that is no file: its rank reports it (bad-namespace)
      tier.findings.push_back({o.rel, FindingKind::kForeign, "not a regular file"});
  for (const auto& p : w.problems)
    tier.findings.push_back({p.rel, FindingKind::kUnreadable, fmt::format("{}: {}", p.what, std::strerror(p.err))});
  std::sort(tier.ranks.begin(), tier.ranks.end(), [](const auto& a, const auto& b) { return a.rel < b.rel; });
  std::sort(tier.findings.begin(), tier.findings.end());
  return tier;
}

bool record_temp_is_dead(int tier_fd, const std::string& rel, const FileStat& st, const ScanOptions& opt) {
  // The record is written outside the store lock (FORMAT.md 7.1): its writer
  // holds the temp's flock from creation to rename. The age floor covers the
  // instant between O_CREAT and flock, whatever --grace says.
  if (st.mtime_ns + std::max(opt.grace_ns, kRecordTempFloorNs) > opt.now_ns) return false;
  int fd = ::openat(tier_fd, rel.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  Fd guard(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) return false;
  ::flock(fd, LOCK_UN);
  return true;
}

Result<StoreScan> scan_store(int root_fd, const std::string& root_name, const ScanOptions& opt) {
  auto tier = list_tier(root_fd, root_name, opt);
  if (!tier) return tier.error();
  StoreScan scan;
  scan.root_is_rank = tier->root_is_rank;
  scan.findings = std::move(tier->findings);
  scan.record_temps = std::move(tier->record_temps);
  for (const auto& r : tier->ranks) {
    auto inv = scan_rank(root_fd, r.rel, r.name, opt, &scan.bytes_read);
    if (!inv) {
      if (scan.root_is_rank) return inv.error();
      scan.findings.push_back({r.rel, FindingKind::kUnreadable, inv.error().message});
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
