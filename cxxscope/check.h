// --check-injected for C/C++: judges one syntax-only parse of a patched file.
// An error inside an injected region fails the apply; so does a region the
// preprocessor drops (inactive under the flags: it would never be built or
// checked). Errors elsewhere are reported, and fail only a file the manifest
// says must compile cleanly (a file without torch or CUDA here cannot).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "report.h"

namespace cxxscope {

struct InjectedRegion {
  std::string name;           // overlay/edit
  size_t first = 0, last = 0; // 1-based inclusive: the region's lines, sentinels included
  // 1-based lines holding code (not blank, a comment or a preprocessor
  // directive); empty = every line between the sentinels.
  std::vector<size_t> code_lines;
};

struct Finding {
  std::string file;
  size_t line = 0;
  std::string message;
  std::string region;  // overlay/edit, "new file", or "" (outside any region)
};

struct Verdict {
  std::vector<Finding> in_regions, outside, dropped;
  bool failed = false;
};

// `file` is the patched file's absolute path as the tool saw it; `new_files`
// are absolute paths of files an overlay creates (all of their text is injected).
Verdict judge(const FileReport& report, const std::string& file, const std::vector<InjectedRegion>& regions,
              const std::set<std::string>& new_files, bool must_compile);

}  // namespace cxxscope
