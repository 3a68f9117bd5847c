#include "kvtier/kvstore/inventory.h"

#include <tuple>

namespace kvstore {

const char* finding_name(FindingKind k) {
  switch (k) {
    case FindingKind::kCorrupt: return "corrupt";
    case FindingKind::kTruncated: return "truncated";
    case FindingKind::kWrongNamespace: return "wrong-namespace";
    case FindingKind::kMisplaced: return "misplaced";
    case FindingKind::kMissing: return "missing";
    case FindingKind::kMismatch: return "mismatch";
    case FindingKind::kBadManifest: return "bad-manifest";
    case FindingKind::kBadNamespace: return "bad-namespace";
    case FindingKind::kUnreadable: return "unreadable";
    case FindingKind::kSymlink: return "symlink";
    case FindingKind::kForeign: return "foreign";
    case FindingKind::kOrphan: return "orphan";
    case FindingKind::kStaleTemp: return "stale-temp";
    case FindingKind::kBadPending: return "bad-pending";
    case FindingKind::kUnsafeFolder: return "unsafe-folder";
  }
  return "?";
}

bool is_damage(FindingKind k) { return k != FindingKind::kOrphan && k != FindingKind::kStaleTemp; }

bool Finding::operator<(const Finding& o) const {
  return std::tie(rel, kind, detail) < std::tie(o.rel, o.kind, o.detail);
}

}  // namespace kvstore
