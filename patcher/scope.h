// Python blocks by indentation: `scope = "class X/def f"` narrows an anchor
// search to the body of f inside X. Lines inside brackets or strings are
// continuations, so multi-line signatures and docstrings do not end a block.
#pragma once

#include <string>
#include <vector>

#include "error.h"

namespace patcher {

struct LineRange {
  size_t begin = 0, end = 0;  // [begin, end) line indices
};

// True for lines that start a logical line (not inside brackets, a string,
// or after a backslash continuation).
std::vector<bool> logical_starts(const std::vector<std::string>& lines);

// End (exclusive) of the block whose header starts at `header`.
size_t block_end(const std::vector<std::string>& lines, const std::vector<bool>& starts, size_t header);

struct ScopeMatch {
  bool ok = false;
  LineRange range;
  std::string segment;              // the segment that failed
  std::vector<size_t> found;        // header lines where that segment matched (0 or several)
  std::vector<size_t> headers;      // def/class lines searched, for nearest-match reports
  LineRange searched;               // where the failing segment was searched
  std::string refusal;              // C/C++: a match Clang cannot vouch for (never guessed)
};

ScopeMatch find_scope(const std::vector<std::string>& lines, const std::string& scope);

}  // namespace patcher
