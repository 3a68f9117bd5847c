// Opening a store path without following a symbolic link anywhere on it
// (docs/FORMAT.md 2; issue 45: a chunk folder swapped for a link led the
// reads and writes out of the rank base).
#pragma once

#include <sys/types.h>

namespace storeio {

// open(2) of `path` (O_CLOEXEC added) that refuses, with ELOOP, a symlink
// as the file or as any folder on the way: openat2's RESOLVE_NO_SYMLINKS,
// or a walk of the path one component at a time (O_NOFOLLOW each) on a
// kernel without openat2. A descriptor, or -1 with errno set.
// `walk_only`: skip openat2 (tests of the walk on a kernel that has it).
int open_no_links(const char* path, int flags, mode_t mode = 0, bool walk_only = false);

}  // namespace storeio
