// Pieces of the store scan shared by scan.cpp (the walk, chunk probes, the
// driver) and rank_contents.cpp (namespace record, classification, pending
// records, manifests). Private to kvstorelib.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvtier/format/format_error.h"
#include "kvtier/format/layout.h"
#include "kvtier/kvstore/scan.h"
#include "chunk_index.h"

namespace kvstore::scan_detail {

inline std::string join(const std::string& a, const std::string& b) { return a.empty() ? b : a + "/" + b; }

inline std::vector<std::string_view> split(std::string_view rel) {
  std::vector<std::string_view> out;
  for (;;) {
    size_t slash = rel.find('/');
    out.push_back(rel.substr(0, slash));
    if (slash == std::string_view::npos) return out;
    rel.remove_prefix(slash + 1);
  }
}

inline bool older_than_grace(const FileStat& st, const ScanOptions& opt) { return st.mtime_ns + opt.grace_ns <= opt.now_ns; }

// Reads a whole small file (manifest, namespace record, pending record), refusing big ones.
inline Result<std::string> read_small(int fd, const std::string& rel, size_t limit) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return io_error(rel, errno, "cannot stat");
  if (!S_ISREG(st.st_mode)) {
    Error e = io_error(rel, EINVAL, "");
    e.message = "not a regular file";  // not "...: Invalid argument"
    return e;
  }
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

inline std::string short_hex(const std::string& hex) { return hex.substr(0, 16); }

inline std::string verdict(const kvformat::Error& e) {
  std::string out(kvformat::reason_name(e.reason));
  if (!e.message.empty()) out += ": " + e.message;
  return out;
}


struct RankContext {
  const ScanOptions& opt;
  RankInventory& inv;
  std::string ns_hex;  // full namespace hash from the record, "" if unknown
  std::array<uint8_t, 32> ns_bytes{};
  bool check_macs = false;  // verify --key and the record fences this key's id
  // The record fences a mac_key_id: every file is sealed. verify judges the
  // seal it can see without the key (a plain chunk or manifest: mac_missing).
  bool judge_seals = false;
};


// What the walk of one rank base found, classified by FORMAT.md section 2.
struct Classified {
  std::vector<std::pair<std::string, FileStat>> manifests;  // rel in rank
  std::vector<std::pair<std::string, FileStat>> pendings;   // rel in rank
};


// Reads the namespace record `<rank name>.json` from `tier_fd`.
void check_namespace(int tier_fd, const std::string& record_rel, RankContext& cx, const kvformat::RankBaseName& base);
// A folder the format defines below a rank base (FORMAT.md 2): manifests/,
// pending/, a chunk top folder or a leaf folder inside one.
bool is_store_dir(std::string_view rel);

Classified classify(const WalkResult& w, const std::string& prefix, RankContext& cx);
// Every folder of the rank base as the store folder (docs/DEPLOY.md,
// Security): the base itself (unless it is ROOT, which verify and the sweep
// check as the store folder), manifests/, pending/ and each chunk folder
// must be owned by root or the serving user and not group- or
// world-writable; else an unsafe-folder finding (issue 45).
void check_folders(const WalkResult& w, const std::string& prefix, RankContext& cx);
void check_pendings(int rank_fd, const std::vector<std::pair<std::string, FileStat>>& files, const std::string& prefix,
                    RankContext& cx, std::set<std::pair<uint32_t, std::string>>& pending);
void check_manifests(int rank_fd, const std::vector<std::pair<std::string, FileStat>>& files, const std::string& prefix,
                     int rank, RankContext& cx, const ChunkIndex& chunk_at);

}  // namespace kvstore::scan_detail
