// Sentinels and regions. A region is a begin sentinel, the injected lines and
// an end sentinel; the begin sentinel names overlay and edit and carries a
// hash of the injected lines, so tampering is detectable line-exactly.
//
//   <indent># >>> overlay <overlay>/<edit> sha256=<16 hex>
//   <indent>...injected lines...
//   <indent># <<< overlay <overlay>/<edit>
//
// New files start with one header line:
//   # === overlay <overlay> new-file sha256=<16 hex> (managed by overlay; do not edit)
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "manifest.h"
#include "error.h"

namespace patcher {

std::string comment_prefix(std::string_view path);  // "#" or "//", by extension
std::string region_hash(const std::vector<std::string>& body);
std::string text_hash(std::string_view text);  // 16 hex digits of sha256

std::string begin_sentinel(const std::string& prefix, const std::string& indent, const std::string& overlay,
                           const std::string& edit, const std::string& hash);
std::string end_sentinel(const std::string& prefix, const std::string& indent, const std::string& overlay,
                         const std::string& edit);
std::string new_file_header(const std::string& prefix, const std::string& overlay, const std::string& hash);

enum class SentinelKind { None, Begin, End, NewFile, Malformed };
struct Sentinel {
  SentinelKind kind = SentinelKind::None;
  std::string overlay, edit, hash;
};
Sentinel parse_sentinel(std::string_view line);
bool looks_like_sentinel(std::string_view line);

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
