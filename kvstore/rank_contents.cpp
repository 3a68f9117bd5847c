// The contents of one rank base beyond its chunks: the namespace record
// beside it, what each walked entry is (FORMAT.md section 2), the pending
// records of live writers (9.1) and the manifests with their references (5).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>

#include "kvtier/format/boundary_manifest.h"
#include "kvtier/format/namespace_record.h"
#include "kvtier/format/pending_record.h"
#include "kvtier/kvstore/store_perms.h"
#include "parallel.h"
#include "mac_check.h"
#include "scan_detail.h"

namespace kvstore::scan_detail {

void check_namespace(int tier_fd, const std::string& record_rel, RankContext& cx, const kvformat::RankBaseName& base) {
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
                            fmt::format("namespace hash {} does not match the directory name's {}", short_hex(hex),
                                        base.ns_short)});
    return;
  }
  cx.ns_hex = hex;
  std::copy(hash->begin(), hash->end(), cx.ns_bytes.begin());
  inv.namespace_ok = true;
  inv.namespace_hash = hex;
  if (const auto id = rec->fenced.find("mac_key_id"); id != rec->fenced.end() && id->is_string()) {
    inv.mac_key_id = id->get<std::string>();
    cx.judge_seals = cx.opt.judge_seals;
  }
  if (!cx.opt.mac_key.empty()) {
    // verify --key: the record says which key the store was written with (its
    // id, FORMAT.md 3.6); under another key every MAC would differ, so that
    // is one finding here instead of one a file.
    const std::string want = mac_check::key_id(cx.opt.mac_key);
    const auto it = rec->fenced.find("mac_key_id");
    if (it == rec->fenced.end() || !it->is_string())
      inv.findings.push_back({record_rel, FindingKind::kBadNamespace,
                              "not a keyed store (no mac_key_id): written without a key, MACs not checked"});
    else if (it->get<std::string>() != want)
      inv.findings.push_back({record_rel, FindingKind::kBadNamespace,
                              fmt::format("written with another key (mac_key_id {}, this key's is {}): MACs not checked",
                                          it->get<std::string>(), want)});
    else
      cx.check_macs = true;
  }
  // keep-K is a writer setting, not part of the namespace identity: it lives
  // in info (FORMAT.md 4) and gc only reads it as the default for --keep.
  if (rec->info.is_object() && rec->info.contains("keep_boundaries") &&
      rec->info["keep_boundaries"].is_number_unsigned()) {
    auto k = rec->info["keep_boundaries"].get<uint64_t>();
    if (k <= 1024) inv.keep_hint = static_cast<uint32_t>(k);
  }
}


bool is_store_dir(std::string_view rel) {
  auto parts = split(rel);
  if (parts.size() == 1)
    return parts[0] == kvformat::kManifestDir || parts[0] == kvformat::kPendingDir ||
           kvformat::is_chunk_top_dir(parts[0]);
  return parts.size() == 2 && kvformat::is_chunk_top_dir(parts[0]) &&
         kvformat::parse_chunk_leaf_dir(parts[1]).has_value();
}

void check_folders(const WalkResult& w, const std::string& prefix, RankContext& cx) {
  const uid_t serving = cx.opt.serving_uid == ScanOptions::kSelf ? ::geteuid() : cx.opt.serving_uid;
  for (const auto& [rel, st] : w.dir_stats) {
    if (rel.empty() ? prefix.empty() : !is_store_dir(rel)) continue;  // ROOT itself; a foreign folder
    const std::string where = rel.empty() ? prefix : join(prefix, rel);
    if (auto problem = unsafe_inner_folder(where, st.mode, st.uid, serving))
      cx.inv.findings.push_back({where, FindingKind::kUnsafeFolder, *problem});
  }
}

Classified classify(const WalkResult& w, const std::string& prefix, RankContext& cx) {
  auto& inv = cx.inv;
  Classified out;
  std::set<std::string> foreign_dirs;
  for (const auto& d : w.dirs)
    if (!is_store_dir(d.rel)) foreign_dirs.insert(d.rel);
  auto under_foreign = [&](const std::string& rel) {
    if (foreign_dirs.empty()) return false;
    for (size_t pos = rel.find('/'); pos != std::string::npos; pos = rel.find('/', pos + 1))
      if (foreign_dirs.count(rel.substr(0, pos))) return true;
    return false;
  };
  // manifests/ or pending/ as a symlink, a file, a special file or an
  // unlistable folder: which chunks are named, or held by a live writer, is
  // unknown. pending/ says so as an unreadable entry (a sweep refuses).
  bool pending_broken = false;
  auto store_dir_broken = [&](const std::string& rel) {
    if (rel == kvformat::kManifestDir) inv.manifests_readable = false;
    if (rel == kvformat::kPendingDir) pending_broken = true;
  };
  for (const auto& d : foreign_dirs)
    if (!under_foreign(d))
      inv.findings.push_back({join(prefix, d), FindingKind::kForeign, "directory not part of the store format"});
  for (const auto& l : w.links) {
    if (under_foreign(l.rel)) continue;
    store_dir_broken(l.rel);
    // Where a store folder belongs (issue 45): what the writer and restore
    // refuse, and what makes a sweep refuse the rank.
    if (is_store_dir(l.rel))
      inv.findings.push_back({join(prefix, l.rel), FindingKind::kUnsafeFolder,
                              join(prefix, l.rel) + " is a symlink where a store folder belongs; nothing follows it"});
    else
      inv.findings.push_back({join(prefix, l.rel), FindingKind::kSymlink, "symlink, not followed"});
  }
  for (const auto& o : w.others) {
    if (under_foreign(o.rel)) continue;
    store_dir_broken(o.rel);
    inv.findings.push_back({join(prefix, o.rel), FindingKind::kForeign, "not a regular file"});
  }
  for (const auto& p : w.problems) {
    if (under_foreign(p.rel)) continue;
    store_dir_broken(p.rel);
    inv.findings.push_back(
        {join(prefix, p.rel), FindingKind::kUnreadable, fmt::format("{}: {}", p.what, std::strerror(p.err))});
  }

  for (const auto& f : w.files) {
    if (under_foreign(f.rel)) continue;
    auto parts = split(f.rel);
    std::string rel = join(prefix, f.rel);
    bool known = false;
    if (parts.size() == 1 && parts[0] == kvformat::kLockFile) {
      known = true;
    } else if (parts.size() == 1 && (parts[0] == kvformat::kManifestDir || parts[0] == kvformat::kPendingDir)) {
      store_dir_broken(f.rel);  // a file where the folder belongs
    } else if (parts.size() == 2 && parts[0] == kvformat::kManifestDir) {
      if (kvformat::parse_manifest_file_name(parts[1])) {
        out.manifests.emplace_back(f.rel, f.st);
        known = true;
      } else if (auto t = kvformat::parse_temp_name(parts[1]); t && kvformat::parse_manifest_file_name(t->final_name)) {
        inv.temps.push_back({rel, f.st});
        known = true;
      }
    } else if (parts.size() == 2 && parts[0] == kvformat::kPendingDir) {
      if (kvformat::parse_pending_file_name(parts[1])) {
        out.pendings.emplace_back(f.rel, f.st);
        known = true;
      }
    } else if (parts.size() == 3) {
      // Chunk-shaped names are taken over by the walk's probe; what reaches
      // here is a temp or a name in the wrong fan-out folder.
      auto leaf = kvformat::parse_chunk_leaf_dir(parts[1]);
      if (leaf) {
        if (auto t = kvformat::parse_temp_name(parts[2]);
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
  if (!inv.manifests_readable)
    inv.findings.push_back({join(prefix, std::string(kvformat::kManifestDir)), FindingKind::kUnreadable,
                            "not a readable directory: which chunks are named is unknown"});
  if (pending_broken)
    inv.findings.push_back({join(prefix, std::string(kvformat::kPendingDir)), FindingKind::kUnreadable,
                            "not a readable directory: which chunks live writers hold is unknown"});
  return out;
}


// Pending records: a live writer (it holds the record's flock) lists chunks
// it has written or reused for manifests it has not yet published.
void check_pendings(int rank_fd, const std::vector<std::pair<std::string, FileStat>>& files, const std::string& prefix,
                    RankContext& cx, std::set<std::pair<uint32_t, std::string>>& pending) {
  auto& inv = cx.inv;
  for (const auto& [rel_in_rank, st] : files) {
    PendingRec p;
    p.rel = join(prefix, rel_in_rank);
    p.st = st;
    auto fd = open_beneath(rank_fd, rel_in_rank, O_RDONLY | O_NONBLOCK);
    if (!fd) {
      if (fd.error().err == ENOENT) continue;  // its writer removed it meanwhile
      inv.findings.push_back({p.rel, FindingKind::kUnreadable, fd.error().message});
      continue;
    }
    if (::flock(fd->get(), LOCK_EX | LOCK_NB) == 0) {
      // Nobody holds it: its writer has exited, nothing it listed is in flight.
      ::flock(fd->get(), LOCK_UN);
      inv.findings.push_back({p.rel, FindingKind::kStaleTemp, "pending record of a writer that has exited"});
      inv.pendings.push_back(std::move(p));
      continue;
    }
    p.live = true;
    auto bytes = read_small(fd->get(), p.rel, kvformat::kMaxPendingBytes);
    if (!bytes) {
      inv.findings.push_back({p.rel, FindingKind::kBadPending, bytes.error().message});
      inv.pendings.push_back(std::move(p));
      continue;
    }
    auto rec = kvformat::parse_pending_record(*bytes);
    if (!rec) {
      inv.findings.push_back({p.rel, FindingKind::kBadPending, verdict(rec.error())});
      inv.pendings.push_back(std::move(p));
      continue;
    }
    p.parsed = true;
    for (auto& c : *rec) pending.emplace(c.group, std::move(c.key));
    inv.pendings.push_back(std::move(p));
  }
}


namespace {

// Why a chunk a manifest names is not among the walk's chunks: "" when no
// file is there; else what is (a FIFO, an unreadable folder, a file that
// appeared after the walk), which is not the same as missing.
std::string why_absent(int rank_fd, uint32_t group, const std::string& key) {
  auto rel = kvformat::chunk_rel_path(key, group);
  if (!rel) return "";
  auto st = stat_beneath(rank_fd, *rel);
  if (!st) return st.error().err == ENOENT ? "" : fmt::format("which cannot be looked at: {}", std::strerror(st.error().err));
  if (!S_ISREG(st->mode)) return "which is not a regular file";
  return "which the walk could not read, or which appeared after it";
}

// Records one manifest read by check_manifests and cross-checks the chunks it names.
// `at` holds the position of each entry's chunk (ChunkIndex::kNone if there
// is none), group by group, looked up on the reader thread; `absent` says,
// for each kNone in turn, why_absent.
void judge_manifest(const std::pair<std::string, FileStat>& file, const Result<std::string>& bytes,
                    kvformat::Result<kvformat::BoundaryManifest>& parsed, const std::vector<long>& at,
                    const std::vector<std::string>& absent, const std::string& prefix, int rank, RankContext& cx) {
  auto& inv = cx.inv;
  const auto& [rel_in_rank, st] = file;
  ManifestRec m;
  m.rel = join(prefix, rel_in_rank);
  m.name = std::string(split(rel_in_rank).back());
  m.st = st;
  if (!bytes) {
    m.readable = bytes.error().kind != ErrorKind::kIo;
    if (!m.readable) inv.manifests_readable = false;
    inv.findings.push_back({m.rel, m.readable ? FindingKind::kBadManifest : FindingKind::kUnreadable,
                            bytes.error().message});
    inv.manifests.push_back(std::move(m));
    return;
  }
  if (!parsed) {
    inv.findings.push_back({m.rel, FindingKind::kBadManifest, verdict(parsed.error())});
    inv.manifests.push_back(std::move(m));
    return;
  }
  m.parsed = true;
  m.chain = std::move(parsed->chain);
  m.boundary = parsed->boundary;
  auto broken = [&](FindingKind k, std::string detail) {
    inv.findings.push_back({m.rel, k, std::move(detail)});
    m.broken = true;
  };
  if (kvformat::manifest_file_name(parsed->boundary, m.chain.back()).value() != m.name)
    broken(FindingKind::kBadManifest, fmt::format("file name does not match its content ({})",
                                                  kvformat::manifest_file_name(parsed->boundary, m.chain.back()).value()));
  if (!cx.ns_hex.empty() && parsed->ns != cx.ns_hex)
    broken(FindingKind::kWrongNamespace,
           fmt::format("namespace {} differs from the record's {}", short_hex(parsed->ns), short_hex(cx.ns_hex)));
  if (rank >= 0 && parsed->rank != static_cast<uint32_t>(rank))
    broken(FindingKind::kBadManifest, fmt::format("rank {} differs from the directory's rank {}", parsed->rank, rank));
  size_t entries = 0;
  for (const auto& g : parsed->groups) entries += g.entries.size();
  m.refs.reserve(entries);
  size_t n = 0, n_absent = 0;
  for (auto& g : parsed->groups) {
    bool state = g.kind == kvformat::GroupKind::State;
    for (size_t pos = 0; pos < g.entries.size(); ++pos) {
      auto& e = g.entries[pos];
      // The scan resolves every ref here, so the ref keeps no key of its own.
      m.refs.push_back({g.group, {}, e.length, e.checksum, ManifestRef::kNoChunk});
      const std::string& key = e.key;
      long pos_in_inv = at[n++];
      if (pos_in_inv == ChunkIndex::kNone) {
        auto path = kvformat::chunk_rel_path(key, g.group);
        const std::string& why = absent[n_absent++];
        if (why.empty())
          broken(FindingKind::kMissing, fmt::format("names {}, which does not exist", path ? *path : key));
        else
          broken(FindingKind::kMismatch, fmt::format("names {}, {}", path ? *path : key, why));
        continue;
      }
      auto& c = inv.chunks[pos_in_inv];
      c.named = true;
      m.refs.back().chunk = pos_in_inv;
      auto path = [&] { return kvformat::chunk_rel_path(key, g.group).value(); };
      // FORMAT.md 5: a full group's entry i covers tokens up to (i+1) x
      // chunk_tokens; a state group's single entry is the state at the boundary.
      uint64_t want_boundary = state ? parsed->boundary : (pos + 1) * parsed->chunk_tokens;
      if (c.damaged || !c.header_ok) {
        broken(FindingKind::kMismatch, fmt::format("names {}, which is damaged or unreadable", path()));
      } else if (c.payload_len != e.length || c.checksum != e.checksum) {
        broken(FindingKind::kMismatch,
               fmt::format("names {} as length {} checksum {:08x}; its header says length {} checksum {:08x}", path(),
                           e.length, e.checksum, c.payload_len, c.checksum));
      } else if (c.boundary != want_boundary) {
        broken(FindingKind::kMismatch,
               fmt::format("names {} at boundary token index {}; its header says {}", path(), want_boundary,
                           c.boundary));
      } else if (c.state_group != state) {
        broken(FindingKind::kMismatch,
               fmt::format("names {} in a {} group; its segments are those of a {} group", path(),
                           state ? "state" : "full", c.state_group ? "state" : "full"));
      }
    }
  }
  inv.manifests.push_back(std::move(m));
}

}  // namespace

// A manifest as the codecs read it (FORMAT.md 3.6): a sealed one's "mac"
// checked first under verify --key (mac_missing, mac_mismatch), then the rest
// judged as a plain manifest; without the key a sealed one's MAC is skipped.
static kvformat::Result<kvformat::BoundaryManifest> parse_sealed_or_plain(const std::string& bytes, const RankContext& cx) {
  auto sealed = kvformat::split_manifest_mac(bytes);
  if (!sealed) return sealed.error();
  if (!*sealed) {
    if (cx.check_macs || cx.judge_seals)
      return kvformat::make_error(kvformat::Reason::MacMissing, "manifest has no mac; the store is keyed");
    return kvformat::parse_manifest(bytes);
  }
  if (cx.check_macs && !mac_check::manifest_ok(cx.opt.mac_key, (*sealed)->body, (*sealed)->mac))
    return kvformat::make_error(kvformat::Reason::MacMismatch, "manifest mac differs");
  return kvformat::parse_manifest((*sealed)->body);
}

void check_manifests(int rank_fd, const std::vector<std::pair<std::string, FileStat>>& files, const std::string& prefix,
                     int rank, RankContext& cx, const ChunkIndex& chunk_at) {
  auto& inv = cx.inv;
  // Reading and parsing are independent per file: do them on the reader
  // threads, a batch at a time, so the bytes and parsed trees held at once
  // stay bounded however many manifests the store has.
  struct Read {
    bool vanished = false;
    Result<std::string> bytes = Error{};
    kvformat::Result<kvformat::BoundaryManifest> parsed = kvformat::make_error(kvformat::Reason::IoError, "");
    std::vector<long> at;  // each entry's chunk position
    std::vector<std::string> absent;  // why_absent, for each entry without one
  };
  const unsigned threads = reader_threads(cx.opt.threads);
  const size_t batch = size_t{64} * threads;
  inv.manifests.reserve(inv.manifests.size() + files.size());
  for (size_t first = 0; first < files.size(); first += batch) {
    size_t n = std::min(batch, files.size() - first);
    std::vector<Read> reads(n);
    parallel_for(n, threads, [&](size_t k) {
      auto& r = reads[k];
      const std::string& rel = files[first + k].first;
      auto fd = open_beneath(rank_fd, rel, O_RDONLY | O_NONBLOCK);
      if (!fd && fd.error().err == ENOENT) {
        r.vanished = true;  // superseded by a writer meanwhile
        return;
      }
      r.bytes = fd ? read_small(fd->get(), join(prefix, rel), kvformat::kMaxManifestBytes)
                   : Result<std::string>(fd.error());
      if (r.bytes) r.parsed = parse_sealed_or_plain(*r.bytes, cx);
      if (!r.parsed) return;
      for (const auto& g : r.parsed->groups)
        for (const auto& e : g.entries) {
          r.at.push_back(chunk_at.find(g.group, e.key));
          if (r.at.back() == ChunkIndex::kNone) r.absent.push_back(why_absent(rank_fd, g.group, e.key));
        }
    });
    for (size_t k = 0; k < n; ++k)
      if (!reads[k].vanished) judge_manifest(files[first + k], reads[k].bytes, reads[k].parsed, reads[k].at, reads[k].absent, prefix,
                                                rank, cx);
  }
}


}  // namespace kvstore::scan_detail
