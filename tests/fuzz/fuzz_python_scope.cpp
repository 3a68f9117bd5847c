// Fuzzes Python block parsing (patcher/scope.h), which narrows an anchor
// search to "class X/def f": the first input line is the scope, the rest the
// Python source. Brackets, strings, docstrings and continuations all decide
// where a block ends, so this is a parser of Python's layout in its own right.
//
// Properties: every block ends after its header and inside the file; a found
// scope lies inside the file, and a nested scope inside its parent's block.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "scope.h"
#include "text.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string scope(in.substr(0, nl));
  const std::string_view source = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
  const auto lines = patcher::split_lines(source).lines;

  const auto starts = patcher::logical_starts(lines);
  FUZZ_CHECK(starts.size() == lines.size());
  for (size_t h = 0; h < lines.size() && h < 64; ++h) {
    const size_t end = patcher::block_end(lines, starts, h);
    FUZZ_CHECK(end > h && end <= lines.size());
  }

  const auto match = patcher::find_scope(lines, scope);
  if (match.ok) {
    FUZZ_CHECK(match.range.begin <= match.range.end && match.range.end <= lines.size());
    const size_t slash = scope.rfind('/');
    if (slash != std::string::npos) {
      const auto parent = patcher::find_scope(lines, scope.substr(0, slash));
      FUZZ_CHECK(parent.ok);
      FUZZ_CHECK(parent.range.begin <= match.range.begin && match.range.end <= parent.range.end);
    }
  } else {
    FUZZ_CHECK(match.searched.begin <= match.searched.end && match.searched.end <= lines.size());
  }
  return 0;
}
