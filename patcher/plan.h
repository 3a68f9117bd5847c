// Computes new file texts in memory: a file's projection (its pristine text)
// plus the edits of a list of overlays, applied in stacking order. Apply,
// revert and the "is this region where it belongs" check all rebuild from
// the projection, so no sequence of operations can duplicate a region.
#pragma once

#include <string>
#include <vector>

#include "manifest.h"
#include "error.h"
#include "text.h"

namespace patcher {

struct BuildLine {
  std::string text;
  int region = -1;     // innermost region holding the line, -1 = engine text
  size_t origin = 0;   // 1-based line in the projection, 0 = injected
  std::string claim;   // "overlay/edit" anchored on this line
};

struct BuildRegion {
  std::string overlay, edit;
};

struct Build {
  std::vector<BuildLine> lines;
  bool trailing_newline = true;
  std::vector<BuildRegion> regions;
  std::string text() const;
  std::vector<std::string> texts() const;
  // "overlay/edit" of the region holding 1-based line `line`, or "".
  std::string region_at(size_t line) const;
};

Build base_build(const Text& projection);

bool is_superseded(const Edit& e, const std::string& pristine_text);

// Applies the non-superseded edits of `spec` (from overlay `m`) to `b`.
// Every edit is resolved before `b` changes; anchors that do not match
// exactly `occurrences` times give one Drift error whose details hold the
// drift report of every failing edit. Two edits anchoring on the same line
// give a Usage error.
Status apply_overlay(Build& b, const Manifest& m, const FileSpec& spec, const std::string& pristine_text,
                     const std::string& file);

}  // namespace patcher
