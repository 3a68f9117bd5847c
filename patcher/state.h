// The state of a tree against a manifest set, per file and per overlay,
// following the invariant: pristine, applied, half-applied, tampered, drift,
// superseded. Read-only; apply and revert plan from it.
#pragma once

#include <sys/stat.h>

#include <map>
#include <string>
#include <vector>

#include "manifest.h"
#include "paths.h"
#include "error.h"
#include "text.h"
#include "txn.h"

namespace patcher {

// The states below are named for output (status, --json) in one place each:
// the *_name() functions. The names are part of the JSON format (docs/JSON.md).

// What an edit's regions look like in a file.
enum class EditStatus { Applied, Missing, Superseded };
const char* edit_status_name(EditStatus s);

struct EditState {
  std::string id;
  EditStatus state = EditStatus::Missing;
  int present = 0, expected = 0;
};

// One overlay's regions in one file. Neutral: every edit is superseded.
enum class FileOverlayStatus { Pristine, Applied, Partial, Neutral };
const char* file_overlay_status_name(FileOverlayStatus s);

// A file against the manifests. Stale: regions intact and verified,
// projection == pin, but the current manifests/fragments would inject
// something else; revert works, apply refuses. Absent/Present: a new file (or a
// built binary) that is not / is there. BuildInput: a C/C++ source outside a
// wheel install's tree, judged through its built file (built.h).
enum class FileStatus { Pristine, Applied, Partial, Tampered, Stale, Drift, Missing, Absent, Present, BuildInput };
const char* file_status_name(FileStatus s);

// An overlay across its files. Absent: neither its C/C++ sources nor its built
// binary is in the tree; check accepts it like Superseded.
enum class OverlayStatus { Pristine, Applied, HalfApplied, Tampered, Stale, Drift, Superseded, Absent };
const char* overlay_status_name(OverlayStatus s);

struct FileOverlay {
  std::string overlay;
  FileOverlayStatus state = FileOverlayStatus::Pristine;
  std::vector<EditState> edits;
};

struct FileState {
  std::string path;
  bool is_new = false;  // a [[new_files]] entry
  bool is_built = false;  // a [[built_files]] entry (binary; see built.h)
  FileStatus state = FileStatus::Pristine;
  std::string message;  // why, for tampered / drift
  std::vector<std::string> details;  // drift report
  std::vector<DriftItem> drift;      // the same, structured
  std::vector<std::string> stale_overlays;  // state stale: the overlays whose regions are out of date
  std::string pin, sha;
  std::vector<FileOverlay> overlays;
  // Kept for planning.
  bool exists = false;
  FileData data;
  Text projection;
  std::vector<std::string> applied;  // overlays whose regions are all present, in order
};

struct OverlayState {
  std::string name, summary;
  OverlayStatus state = OverlayStatus::Pristine;
  std::vector<std::string> after;
  std::vector<std::string> problems;
  std::vector<std::string> superseded;  // "path: edit id"
};

struct TreeState {
  std::vector<FileState> files;
  std::vector<OverlayState> overlays;  // every overlay in the set, stacking order
  bool journal = false;                        // an interrupted transaction is pending
  std::vector<std::string> journal_problems;   // why it cannot be finished ("" list: it can)
  std::vector<std::string> stray_temps;        // temp files and staging folders
  std::vector<Leftover> leftovers;             // everything a transaction left, and its fate
  // Files an overlay created (their new-file header says so) that no manifest
  // of this set names: a [[new_files]] entry dropped between apply and revert.
  std::vector<Leftover> strays;
  const OverlayState* overlay(const std::string& name) const;
  const FileState* file(const std::string& path) const;
};

// One file's state, filled into `fs` (file_state.cpp): a [[files]] target of
// `set`, or a [[new_files]] entry of `m`. Errors as for analyze().
Status analyze_file(const Tree& tree, const ManifestSet& set, const std::string& path, FileState& fs,
                    const std::string& pristine_dir);
Status analyze_new_file(const Tree& tree, const Manifest& m, const NewFile& nf, FileState& fs);

// Fatal errors only for bad input (symlinks, CRLF, non-UTF-8, a sentinel in a
// pristine file) and I/O; everything else is a state.
// `pristine_dir`, when set, holds verified pristine copies of the targets (the
// fetch cache): a file that drifted only in its pin then gets a diff from them.
Result<TreeState> analyze(const Tree& tree, const ManifestSet& set, const std::string& pristine_dir = "");

}  // namespace patcher
