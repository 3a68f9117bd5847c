// Reads a store into RankInventory values: walks ROOT (a rank base, or a tier
// directory holding several), classifies every entry by FORMAT.md section 2,
// checks every chunk (header and size; with ScanOptions::payloads the
// payload pass of verify.h runs before manifests are judged),
// parses every manifest and cross-checks its references, and records what
// is wrong as Findings. Nothing here writes to the store.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/kvstore/inventory.h"
#include "kvtier/kvstore/error.h"
#include "kvtier/kvstore/progress.h"

namespace kvstore {

struct ScanOptions {
  bool payloads = false;     // checksum every payload (verify); else headers only (gc, stat)
  // false (verify alone): a chunk that one read returns whole is not stat'ed;
  // its size is the read's length, and an unnamed chunk is stat'ed later for
  // its age. Its FileStat then holds the size and at most the mtime, so a
  // scan for a plan (gc, whose sweep checks dev and inode) keeps it true.
  bool stat_chunks = true;
  unsigned threads = 0;      // chunk readers; 0 = min(4, cores)
  int64_t now_ns = 0;
  int64_t grace_ns = 600LL * 1000000000;
  Progress* progress = nullptr;
  // verify --key: a keyed store's secret; every chunk's and manifest's MAC
  // is checked (FORMAT.md 3.6). Empty: sealed files are parsed, MACs unchecked.
  std::vector<std::uint8_t> mac_key;
  // Whose every folder of a rank base must be (root's too): a folder another
  // user owns, or that is group- or world-writable, is an unsafe-folder
  // finding (docs/DEPLOY.md, Security). kSelf: the caller (geteuid).
  static constexpr uid_t kSelf = static_cast<uid_t>(-1);
  uid_t serving_uid = kSelf;
  // verify: in a keyed store (its record fences a mac_key_id) a plain chunk
  // or manifest is mac_missing even without the key, which it needs not.
  bool judge_seals = false;
};

// A chunk FileStat's mtime_ns when ScanOptions::stat_chunks spared its fstat.
inline constexpr int64_t kTimeNotRead = INT64_MIN;

// verify's first read of a chunk: a chunk this small is read whole with its
// header and checksummed from that buffer (one read per file).
inline constexpr size_t kWholeReadBytes = size_t{512} << 10;
// A namespace-record temp younger than this is never deleted, whatever
// --grace says (FORMAT.md 8.3).
inline constexpr int64_t kRecordTempFloorNs = 60LL * 1000000000;

// ROOT's top level: which rank bases to scan, and what else lies there.
struct TierListing {
  struct Rank {
    std::string rel;   // "" when ROOT is the rank base
    std::string name;
  };
  bool root_is_rank = false;
  std::vector<Rank> ranks;
  std::vector<Finding> findings;       // foreign entries, symlinks, stale record temps
  std::vector<TempRec> record_temps;   // namespace-record temps beside the rank bases
};

Result<TierListing> list_tier(int root_fd, const std::string& root_name, const ScanOptions& opt);

// A namespace-record temp may go when it is older than the grace period (and
// kRecordTempFloorNs) and no process holds its flock (FORMAT.md 7.1, 8.3).
bool record_temp_is_dead(int tier_fd, const std::string& rel, const FileStat& st, const ScanOptions& opt);

struct StoreScan {
  bool root_is_rank = false;
  std::vector<RankInventory> ranks;
  std::vector<Finding> findings;       // tier level: foreign entries, symlinks, stale record temps
  std::vector<TempRec> record_temps;   // namespace-record temps beside the rank bases
  uint64_t bytes_read = 0;
};

// `root_name` is ROOT's own directory name (it says whether ROOT is a rank base).
Result<StoreScan> scan_store(int root_fd, const std::string& root_name, const ScanOptions& opt);

// Scans one rank base again (the sweep re-plans under the lock). `rank_rel` is
// "" when ROOT is the rank base itself.
Result<RankInventory> scan_rank(int root_fd, const std::string& rank_rel,
                                 const std::string& rank_name, const ScanOptions& opt,
                                 uint64_t* bytes_read = nullptr);

// All findings of a scan, sorted: tier level and every rank.
std::vector<Finding> all_findings(const StoreScan& scan);

}  // namespace kvstore
