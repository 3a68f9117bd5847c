// Keep-K manifest retention by leaf walk (FORMAT.md section 6).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kvtier/format/format_error.h"

namespace kvformat {

inline constexpr std::uint32_t kMaxKeepBoundaries = 1024;

// `chains` maps a manifest name to its chain. Returns the names keep-K retains:
// every leaf plus its keep-1 deepest ancestors (ancestor = a manifest whose chain
// is a proper prefix). keep == 0 keeps everything. Names not returned are
// superseded.
Result<std::set<std::string>> kept_manifests(
    const std::map<std::string, std::vector<std::string>>& chains, std::uint32_t keep);

// The same over chains held by the caller (no copy): kept[i] says whether
// chains[i]'s manifest is retained.
Result<std::vector<bool>> kept_chains(std::span<const std::span<const std::string>> chains,
                                      std::uint32_t keep);

}  // namespace kvformat
