// The steps behind the verbs of engine.h, shared by engine.cpp (lock,
// analyze, run), consistency.cpp, check_injected.cpp, prepare_apply.cpp and
// prepare_revert.cpp. Internal to the patcher library.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "built.h"
#include "engine.h"
#include "txn.h"

namespace patcher::engine_steps {

inline bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Turns bad overlay states into the error apply/revert/check must stop on.
// `allow_stale`: revert strips stale regions; `rebuilds`: apply rewrites
// files that other overlays share.
Status require_consistent(const TreeState& ts, const std::vector<std::string>& selected, const ManifestSet& set,
                          bool allow_stale = false, bool rebuilds = false);

// --check-injected: compiles the given file texts (path, text) and the
// selected overlays' fragments; adds the number of units to `count`.
Status compile_all(const Session& s, const Request& r, const std::vector<std::string>& selected,
                   const std::vector<std::pair<std::string, std::string>>& files, int* count,
                   std::vector<std::string>* notes = nullptr);

// A [[built_files]] binary to rebuild after the compile check (built.h).
struct PendingBuild {
  const BuiltFile* bf = nullptr;
  std::string overlay;
  FileData original;
  std::map<std::string, std::string> inputs;  // patched sources and new files
};

// What apply or revert would do, before anything is written.
struct Prepared {
  OverlayReport out;
  std::vector<Change> changes;
  std::vector<std::pair<std::string, std::string>> final_texts;  // for the compile check
  std::vector<PendingBuild> builds;
};

// Fill in `p` (its out.state and out.selected already set) for apply or revert.
Status prepare_apply(const Session& s, const Request& r, Prepared& p);
Status prepare_revert(const Session& s, const Request& r, Prepared& p);

}  // namespace patcher::engine_steps
