// Regions: a begin sentinel, the injected lines and an end sentinel (the
// syntax is in sentinel.h). Parsing every region of a file, and stripping an
// overlay's regions to get back the text it was applied to.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "manifest.h"
#include "error.h"
#include "sentinel.h"

namespace patcher {

struct Region {
  std::string overlay, edit, hash;
  size_t begin = 0, end = 0;  // line indices of the begin and end sentinels
};

// Parses every region; a malformed or unbalanced sentinel is Tampered.
Result<std::vector<Region>> parse_regions(const std::vector<std::string>& lines, const std::string& file);

// Removes every region of `m` from `lines` (they must carry no later
// overlay's regions any more), checking each hash and putting replaced
// anchor lines back. counts[edit id] = regions removed.
Result<std::vector<std::string>> strip_overlay(const std::vector<std::string>& lines, const Manifest& m,
                                               const FileSpec& spec, const std::string& file,
                                               std::map<std::string, int>* counts);

}  // namespace patcher
