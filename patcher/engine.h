// The operations behind the CLI subcommands. Each returns what it found and
// did; nothing here prints. Apply and revert resolve every anchor of every
// file, and run the compile check if asked, before the first byte is written.
#pragma once

#include <string>
#include <vector>

#include "compile_check.h"
#include "manifest.h"
#include "paths.h"
#include "error.h"
#include "state.h"

namespace patcher {

struct Request {
  std::vector<std::string> overlays;  // empty = every overlay of the set
  bool check_injected = false;
  std::string python = "python3";
  bool expect_pristine = false;  // check --expect pristine
  std::string sources;  // pinned C/C++ sources for [[built_files]] on a wheel install (built.h)
  // revert --new-files-only: remove only what the overlays added (their
  // intact new files, the folders they made and what a bake recorded in
  // them), never an engine file, whatever state the engine's files are in
  // (an upgraded or reinstalled engine: docs/UPGRADING.md).
  bool new_files_only = false;
};

struct FileChangeReport {
  std::string path;
  std::string action;  // patch | create | delete
  std::vector<std::string> notes;  // e.g. "+ kv-offload-scope/eligible-groups after line 12"
  std::string old_text, new_text;
};

// What an operation (status, plan, apply, revert, check) found and did.
struct OverlayReport {
  TreeState state;  // the state found (after completing any interrupted transaction)
  std::vector<std::string> selected;  // overlays acted on, stacking order
  std::vector<std::string> skipped;   // already in the wanted state
  std::vector<std::string> absent;    // nothing of it in this tree (a C/C++ overlay on a Python-only tree)
  std::vector<FileChangeReport> changes;
  bool recovered = false;  // an interrupted transaction was completed first
  int compiled = 0;        // units compiled by --check-injected
  std::vector<std::string> notes;  // e.g. C/C++ errors outside the regions that do not count
};

struct Session {
  Tree tree;
  ManifestSet set;
  std::string pristine_dir;  // verified pristine copies of the targets, for pin-only drift diffs ("" = none)
};

// Validates names; empty = all. Returned in stacking order.
Result<std::vector<std::string>> select_overlays(const ManifestSet& set, const std::vector<std::string>& names);

Result<OverlayReport> status(const Session& s);
Result<OverlayReport> plan_apply(const Session& s, const Request& r);
Result<OverlayReport> apply(const Session& s, const Request& r);
Result<OverlayReport> plan_revert(const Session& s, const Request& r);
Result<OverlayReport> revert(const Session& s, const Request& r);
// Read-only; Ok only when every selected overlay is in the expected state.
Result<OverlayReport> check(const Session& s, const Request& r);

// `overlay recover`: finishes an interrupted transaction (verified whole
// first), or with `discard` rolls it back; removes leftovers either way.
struct RecoverReport {
  bool had_journal = false;
  bool discarded = false;
  std::vector<Leftover> found;  // what was there before
  DiscardReport discard;
};
Result<RecoverReport> recover_tree(const Session& s, bool discard);

}  // namespace patcher
