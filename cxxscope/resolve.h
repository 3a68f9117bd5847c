// C/C++ scopes: `scope = "namespace vllm/fn swap_blocks_batch"` narrows an
// anchor search to the exact source range Clang reports for that definition.
// Segments: "namespace N" (also "namespace (anonymous)"), "class N",
// "struct N", "union N", "fn N" (a function or method; "fn A::f" matches
// by the end of the qualified name). Each segment must match exactly one
// definition inside the previous one's range, at any depth; a namespace may
// be reopened, so its segment searches every block of that name. A match
// whose range Clang could not vouch for is refused, never guessed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "report.h"

namespace cxxscope {

// "" when the scope is well formed, else why not (for manifest errors).
std::string scope_syntax_error(std::string_view scope);

struct ScopeResolution {
  bool ok = false;
  size_t begin = 0, end = 0;   // 0-based line range [begin, end) of the definition
  std::string segment;         // the segment that failed
  std::vector<size_t> found;   // 0-based name lines where it matched (0 or several)
  std::vector<size_t> headers; // 0-based name lines of definitions searched, for nearest reports
  std::vector<std::string> header_names;  // "kind name" of those, same order
  std::string refusal;         // set when a match exists but cannot be trusted
};

ScopeResolution resolve_scope(const std::vector<Definition>& defs, std::string_view scope, size_t line_count);

// Why an anchor at 0-based lines [first, first + count) must not be edited
// (inactive preprocessor branch, or a multi-line #define), or "".
std::string anchor_refusal(const FileReport& report, size_t first, size_t count);

}  // namespace cxxscope
