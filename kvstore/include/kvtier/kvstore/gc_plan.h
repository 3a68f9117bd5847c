// The gc plan: which files to delete and why, computed from a RankInventory.
// Pure: no I/O, so every rule is unit-tested on synthetic inventories.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/kvstore/inventory.h"

namespace kvstore {

enum class DeleteReason {
  kStaleTemp,          // writer temp older than the grace period, or a dead writer's pending record
  kOrphan,             // state payload named by no manifest, older than grace
  kCorrupt,            // damaged chunk (never one a kept manifest names)
  kBadManifest,        // manifest that parses but names missing/damaged chunks or has a wrong name/rank
  kSuperseded,         // manifest beyond keep-K on every chain containing it
  kSupersededPayload,  // state payload named only by manifests this plan deletes
  kBudget,             // manifest or chunk of a least recently used chain tree over --max-bytes
};

const char* reason_name(DeleteReason r);

struct PlanItem {
  std::string rel;  // relative to the kvstore ROOT argument
  DeleteReason reason;
  std::string detail;
  FileStat st;      // identity at plan time; the sweep re-checks it
  bool manifest = false;
};

struct PlanOptions {
  uint32_t keep = 2;         // keep-K
  int64_t grace_ns = 600LL * 1000000000;
  int64_t now_ns = 0;
  // Under the sweep's LOCK_EX no writer is mid-job, so every temp under a
  // rank base is dead (FORMAT.md section 8.3); the dry run keeps the grace.
  bool locked = false;
  // --max-bytes: retire least recently used chain trees (FORMAT.md 8.1)
  // until what is left is at most this many bytes; unset: no budget.
  std::optional<uint64_t> max_bytes;
};

struct Plan {
  std::vector<PlanItem> items;  // manifests first, then the rest; each part sorted
  uint64_t bytes = 0;
  size_t manifests_total = 0;
  size_t manifests_planned = 0;
  // Why a sweep must not run without --force (empty: safe to sweep).
  std::vector<std::string> refusals;
  // Part of the rank could not be read or parsed, so no chunk (and no broken-looking
  // manifest) was planned, with or without --force.
  bool chunks_withheld = false;
  size_t trees_retired = 0;  // chain trees the budget retires (--max-bytes)
  // A folder of the rank others could change, or a symlink where a store
  // folder belongs: never swept, not even with --force (what it holds may
  // be someone else's).
  bool unsafe = false;
};

// Keep-K by leaf walk (FORMAT.md section 6, kvformat::kept_chains) over the
// usable manifests: unparsed and broken ones are never kept, so the K most
// recent boundaries counted are ones a restore could use. kept[i] is for
// manifests[i]; keep == 0 keeps every usable manifest.
std::vector<bool> keep_set(const std::vector<ManifestRec>& manifests, uint32_t keep);

Plan make_plan(const RankInventory& inv, const PlanOptions& opt);

// The budget's part (gc_budget.cpp): appends to `manifests` and `rest` the
// files of the least recently used chain trees (manifests sharing chain[0];
// recency the newest manifest mtime, ties by root key) until the rank's
// bytes (chunks, manifests, temps, pending records) less `planned` and less
// what it retires are at most opt.max_bytes. Never a tree naming a chunk a
// live writer's pending record lists, a manifest already planned, or a chunk
// another remaining manifest names. Returns the trees retired.
size_t plan_budget(const RankInventory& inv, const PlanOptions& opt, uint64_t planned,
                   const std::vector<bool>& planned_manifest, std::vector<PlanItem>& manifests,
                   std::vector<PlanItem>& rest);

// A --max-bytes SIZE, the syntax GLM53_KV_OFFLOAD_DISK_GB takes too
// (tests/vectors/sizes.txt holds both to it): a decimal number and its unit,
// B, K M G T (10^3..10^12, also KB..TB) or KiB MiB GiB TiB (2^10..2^40); a
// fraction only with a unit larger than B ("1.5G"); > 0 and < 2^63. No bare
// number: "500" is 500 GB to the knob, so here it is refused as ambiguous.
// nullopt: not a SIZE.
std::optional<uint64_t> parse_size(const std::string& text);
// Why `text` is not a SIZE, in one line ("" when it is one): a bare number,
// a unit in the wrong case, anything else.
std::string size_problem(const std::string& text);

// Appends `more` to `into` (a parent holding several ranks plans per rank).
void merge_plan(Plan& into, Plan&& more);

}  // namespace kvstore
