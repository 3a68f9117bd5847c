// The sentinel syntax: the comment lines that delimit an injected region
// and head a new file. The begin sentinel names overlay and edit and carries a
// hash of the injected lines, so tampering is detectable line-exactly.
//
//   <indent># >>> overlay <overlay>/<edit> sha256=<16 hex>
//   <indent>...injected lines...
//   <indent># <<< overlay <overlay>/<edit>
//
// New files start with one header line:
//   # === overlay <overlay> new-file sha256=<16 hex> (managed by overlay; do not edit)
//
// The manifest reader uses it to refuse sentinel-looking anchors and
// fragments; regions (region.h) and the planner build on it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

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

}  // namespace patcher
