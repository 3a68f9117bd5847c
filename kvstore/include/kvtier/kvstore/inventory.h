// What one rank's store holds, after the walk and the header/manifest reads:
// the input to verify's report, gc's plan and stat's totals. Kept free of
// byte layout so planning can be tested without writing real files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/kvstore/walk.h"

namespace kvstore {

// One kind of finding. Garbage kinds are normal by-products of crashes and
// retention; damage kinds mean something is wrong with the store.
enum class FindingKind {
  kCorrupt,         // header or payload checksum fails, or the header is invalid
  kTruncated,       // shorter than its header says
  kWrongNamespace,  // header's namespace differs from the rank's record
  kMisplaced,       // header's group/key disagree with the file's path
  kMissing,         // a manifest names a chunk that is not there
  kMismatch,        // a manifest's [key, length, checksum] disagrees with the chunk
  kBadManifest,     // manifest cannot be parsed or names an invalid path
  kBadNamespace,    // namespace record missing, unreadable or invalid
  kUnreadable,      // permission or I/O error reading an entry
  kSymlink,         // a symlink inside the store (never followed)
  kForeign,         // a file or directory that is not part of the format
  kOrphan,          // a state-group chunk named by no manifest
  kStaleTemp,       // a writer temp file older than the grace period
  kBadPending,      // a live writer's pending record cannot be read or parsed
  kUnsafeFolder,    // others could change the store: ROOT or a folder above it (store_perms.h)
};

const char* finding_name(FindingKind k);
// Damage exits 1 from verify and gc; garbage only from verify.
bool is_damage(FindingKind k);

struct Finding {
  std::string rel;  // relative to the kvstore ROOT argument
  FindingKind kind;
  std::string detail;
  bool operator<(const Finding& o) const;
  bool operator==(const Finding& o) const = default;
};

struct ChunkRec {
  std::string rel;
  FileStat st;
  uint32_t group = 0;        // from the path (_g<g>)
  std::string key;           // from the file name
  bool header_ok = false;    // header parsed and its checksum holds
  bool named = false;        // some parsed manifest names it (set by the scan)
  bool pending = false;      // a live writer's pending record lists it
  bool payload_ok = false;   // payload checksum verified (verify only)
  bool damaged = false;      // any damage finding on this file
  bool state_group = false;  // header says this group carries state payloads
  bool sealed = false;       // a keyed store's file: flag bit 0, 32-byte MAC after the payload
  uint64_t payload_len = 0;
  uint32_t checksum = 0;
  uint64_t boundary = 0;
  uint32_t header_length = 0;
  // verify: the payload checksum over bytes [header_length, crc_done_to),
  // computed from the read that fetched the header.
  uint32_t crc_partial = 0;
  uint64_t crc_done_to = 0;
};

struct ManifestRef {
  uint32_t group = 0;
  std::string key;  // for unresolved refs only (synthetic inventories); the scan resolves every ref and leaves it empty
  uint64_t length = 0;
  uint32_t checksum = 0;
  // Index into RankInventory::chunks once the scan resolved it, kNoChunk if
  // the file does not exist, kUnresolved if nobody looked (plan then matches
  // by group and key).
  static constexpr long kUnresolved = -1;
  static constexpr long kNoChunk = -2;
  long chunk = kUnresolved;
};

struct ManifestRec {
  std::string rel;
  FileStat st;
  bool readable = true;          // false: could not be opened or read
  bool parsed = false;           // false: unreadable or invalid (a refusal reason)
  bool broken = false;           // parsed, but names a missing/corrupt/mismatched chunk
  std::string name;              // file name, b<boundary>_<tip>.json
  std::vector<std::string> chain;  // chunk keys from token 0 to the boundary
  uint64_t boundary = 0;         // boundary token index
  std::vector<ManifestRef> refs;
};

struct TempRec {
  std::string rel;
  FileStat st;
};

// A writer's pending record (FORMAT.md 9.1). `live`: its writer still holds
// the record's flock, so the chunks it lists are in flight, not orphans.
struct PendingRec {
  std::string rel;
  FileStat st;
  bool live = false;
  bool parsed = false;
};

// One rank base (`<prefix>_<model>_<ns>_r<rank>`) or a bare store tree.
struct RankInventory {
  std::string rel;         // rank base relative to ROOT ("" when ROOT is the rank)
  std::string name;        // directory name
  int rank = -1;
  bool namespace_ok = false;
  std::string namespace_hash;  // hex, from the record's fenced part
  std::optional<uint32_t> keep_hint;  // keep-K from the record's info, if any
  std::string mac_key_id;  // a keyed store's, from the record's fenced part; "" when keyless
  std::vector<ChunkRec> chunks;
  std::vector<ManifestRec> manifests;
  std::vector<TempRec> temps;
  std::vector<PendingRec> pendings;
  // False when manifests/ could not be read as a real directory (a symlink,
  // a file, unlistable) or a manifest in it could not be read: then nobody
  // can say which chunks are unnamed, so no chunk may be planned.
  bool manifests_readable = true;
  std::vector<Finding> findings;
  uint64_t bytes_total = 0;
};

}  // namespace kvstore
