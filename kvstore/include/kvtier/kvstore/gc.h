// `kvstore gc` as two library calls that return a report and print nothing:
// the dry run (scan without a lock, plan) and the sweep (per rank: take the
// lock, scan once under it, plan, refuse or carry the plan out). The CLI only
// renders the report and picks the exit code.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/kvstore/gc_plan.h"
#include "kvtier/kvstore/error.h"
#include "kvtier/kvstore/scan.h"
#include "kvtier/kvstore/sweep.h"

namespace kvstore {

struct GcOptions {
  std::optional<uint32_t> keep;  // else the namespace record's info.keep_boundaries, else 2
  int64_t grace_ns = 600LL * 1000000000;
  bool verify_payloads = false;  // checksum payloads too, so payload rot is planned
  std::optional<uint64_t> max_bytes;  // --max-bytes: the per-rank budget (FORMAT.md 8.1)
  unsigned threads = 0;
  Progress* progress = nullptr;
  // Sweep only.
  bool force = false;  // sweep despite refusals (never deleting a chunk that could be named)
  std::chrono::milliseconds lock_timeout{30000};
  uid_t serving_uid = ScanOptions::kSelf;  // whose the rank's folders must be (scan.h)
};

// One rank's part of a gc run.
struct RankGc {
  std::string where;                     // rank base relative to ROOT, "." for ROOT itself
  Plan plan;
  std::vector<std::string> refusals;     // why this rank was not swept (sweep only)
  bool refused = false;                  // nothing was deleted here for safety
  bool busy = false;                     // refused because a writer held the lock past lock_timeout
  bool executed = false;                 // the sweep carried the plan out (swept or error says how)
  std::optional<SweepResult> swept;      // what the sweep did
  std::optional<Error> error;            // an I/O error stopped this rank
};

struct GcReport {
  bool sweep = false;
  // The scan the plans came from: for a sweep, each rank's scan under its lock.
  StoreScan scan;
  std::vector<RankGc> ranks;
  Plan tier_plan;                        // namespace-record temps of exited writers
  std::optional<SweepResult> tier_swept;
  bool refused = false;                  // some rank was refused (or the lock timed out)
  bool io_failed = false;                // some unlink, fsync or open failed
};

// Dry run: plans without a lock and deletes nothing.
Result<GcReport> plan_gc(int root_fd, const std::string& root_name, const GcOptions& opt);

// The damage findings of a gc run's scan, and how many of them name a file
// the sweep deleted (gc_damage.cpp). A dry run removes none.
struct DamageCount {
  size_t found = 0;
  size_t removed = 0;
  size_t left() const { return found - removed; }
};
DamageCount damage_after_sweep(const GcReport& r);

// Sweep: for each rank, LOCK_EX on its .lock (a timeout refuses the rank),
// one scan under the lock, the plan, then execute_plan unless refused.
Result<GcReport> sweep_gc(int root_fd, const std::string& root_name, const GcOptions& opt);

}  // namespace kvstore
