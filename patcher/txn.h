// One write transaction across files. Crash-safe order:
//   1. each new text goes to ".<name>.overlay-tmp" beside its target
//      (O_EXCL, mode and owner copied, fsync); directories fsynced
//   2. the journal ".overlay-journal" in the tree root is written to a temp,
//      fsynced and renamed into place: this is the commit point
//   3. temps are renamed over targets (deletions unlinked); directories fsynced
//   4. the journal is removed; the root fsynced
// A run that finds a journal rolls it forward (recover); a run that finds
// temps but no journal removes them: that transaction never committed.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "paths.h"
#include "error.h"

namespace patcher {

struct Change {
  enum Kind { Write, Create, Delete };
  std::string path;
  Kind kind = Write;
  std::string old_sha;    // Write, Delete
  std::string new_bytes;  // Write, Create
  mode_t mode = 0644;
  bool keep_owner = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

Status commit(const Tree& tree, const std::vector<Change>& changes);

// Completes an interrupted transaction when a journal exists, then removes
// stray temps beside `paths`. Returns true when it changed anything.
Result<bool> recover(const Tree& tree, const std::vector<std::string>& paths);

}  // namespace patcher
