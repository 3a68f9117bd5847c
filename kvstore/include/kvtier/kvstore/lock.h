// The writer/GC lock: `<rank_base>/.lock`. A writer holds flock(LOCK_SH) from
// the moment it starts writing or reusing a job's chunks until that job's
// manifests are published; `kvstore gc --sweep` holds flock(LOCK_EX) while it
// re-plans and deletes. So a sweep never sees a chunk that a writer is about
// to name in a manifest it has not yet published.
#pragma once

#include <chrono>

#include "kvtier/kvstore/error.h"
#include "kvtier/kvstore/walk.h"

namespace kvstore {

inline constexpr const char* kLockFileName = ".lock";

class StoreLock {
 public:
  StoreLock() = default;
  explicit StoreLock(Fd fd) : fd_(std::move(fd)) {}
  bool held() const { return fd_.valid(); }
  // The sweep generation (FORMAT.md 8): a sweep that deleted files moves the
  // lock file's mtime forward, at least 1 ns past its old value (a coarse
  // clock could repeat it), so a live writer's budget index learns with one
  // stat that files went behind its back. False when it could not.
  bool mark_swept() const;
  // Dropping the fd releases the flock.
 private:
  Fd fd_;
};

// Takes LOCK_EX on `<rank_fd>/.lock`, creating the file if needed, waiting up
// to `timeout`. A timeout is ErrorKind::kRefused (a writer is busy); a .lock
// that is not a regular file (folder, symlink, FIFO, socket, device) is
// kInvalid and is never opened as one; any other failure kIo.
Result<StoreLock> lock_exclusive(int rank_fd, std::chrono::milliseconds timeout);

// Same with LOCK_SH: what a writer takes (used by tests and the bench).
Result<StoreLock> lock_shared(int rank_fd, std::chrono::milliseconds timeout);

}  // namespace kvstore
