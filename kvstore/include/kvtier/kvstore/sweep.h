// Carries out a gc plan. Manifests go first and their directories are
// fsynced before any payload is unlinked, so a crash mid-sweep can leave
// unnamed payloads (orphans, swept next time) but never a manifest that names
// a deleted file. Each file is re-checked (same inode, size and mtime as
// planned) just before it is unlinked; a changed file is kept and reported.
// A changed manifest is kept with every payload of the plan: it may name any
// of them now (a writer republishing a boundary under the same name).
// Payload unlinks run on several threads (contiguous slices of the sorted
// plan: an unlink can wait on the device) and are made durable by one
// syncfs(2) before returning.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/kvstore/progress.h"
#include "kvtier/kvstore/error.h"
#include "kvtier/kvstore/gc_plan.h"

namespace kvstore {

struct SweepSkip {
  std::string rel;
  std::string why;  // "changed since planned", "already gone", ...
};

struct SweepResult {
  size_t deleted = 0;
  uint64_t bytes = 0;
  std::vector<SweepSkip> skipped;
  std::vector<Error> errors;  // unlink or fsync failures (payload phase only)
  // Payloads left in place because a manifest the plan named changed since
  // it was planned (`held_for` names it): what it names now is unknown.
  size_t held = 0;
  std::string held_for;
};

// Deletes the plan's items below `root_fd`. Returns an Error (and deletes no
// payload) when a manifest could not be removed. Refusals are the caller's
// job: execute_plan assumes the plan was accepted.
// `progress`, if given, counts each deletion (files and bytes freed).
Result<SweepResult> execute_plan(int root_fd, const Plan& plan, Progress* progress = nullptr);

}  // namespace kvstore
