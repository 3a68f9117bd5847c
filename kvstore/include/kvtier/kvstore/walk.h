// Safe tree walking for kvstore: every open is relative to a directory fd
// (openat-style), no symlink is ever followed, the walk never leaves its
// root, and an entry that cannot be read becomes a reported problem rather
// than an abort.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fd.h"
#include "kvtier/kvstore/error.h"

namespace kvstore {

// The owned fd type is shared with the engine (common/fd.h).
using kvtier::Fd;

struct FileStat {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint32_t mode = 0;
  uint32_t uid = 0;
  bool operator==(const FileStat&) const = default;
};

enum class EntryType { kFile, kDir, kSymlink, kOther };

struct WalkEntry {
  std::string rel;  // path relative to the walk root, '/'-separated
  EntryType type = EntryType::kFile;
  FileStat st;      // filled when WalkOptions::stat_files (always for non-files)
};

// Something the walk could not look at, e.g. a root-owned directory.
struct WalkProblem {
  std::string rel;
  int err = 0;
  std::string what;
};

struct WalkOptions {
  bool stat_files = true;  // fstatat every regular file (size, mtime, inode)
  int max_depth = 16;      // deeper directories are reported, not entered
  bool recurse = true;     // false: list one directory only
  // >1: the root's subdirectories are walked in parallel (one subtree per
  // task); results are merged, in no particular order.
  unsigned threads = 1;
  // If set, called for every regular file instead of the fstatat, with the
  // file's directory fd (so opening it costs one name lookup); it fills e.st
  // itself and returns false when it took the file over (the walk then does
  // not list it in WalkResult::files, and the callee may move from e).
  // Runs on walker threads; `worker` (below `threads`) names the thread, so
  // the callee can keep what it gathers per thread, without a lock.
  std::function<bool(unsigned worker, int dir_fd, const char* name, WalkEntry& e)> on_file;
  // If set, called once for every directory listed (progress counters). Runs
  // on walker threads.
  std::function<void()> on_dir;
  // If set, a directory is listed in WalkResult::dirs only when
  // keep_dir(rel) is true: a caller that expects tens of thousands of fan-out
  // folders judges them here rather than holding an entry for each. It does
  // not change what is entered. Runs on walker threads.
  std::function<bool(std::string_view rel)> keep_dir;
  // Record every directory walked, the root too (rel ""), with the fstat of
  // its open descriptor (WalkResult::dir_stats): its mode and owner.
  bool stat_dirs = false;
};

struct WalkResult {
  std::vector<WalkEntry> files;    // regular files
  std::vector<WalkEntry> dirs;     // directories (not the root itself)
  std::vector<WalkEntry> links;    // symlinks: reported, never followed
  std::vector<WalkEntry> others;   // fifos, sockets, devices
  std::vector<WalkProblem> problems;
  std::vector<std::pair<std::string, FileStat>> dir_stats;  // WalkOptions::stat_dirs
};

// Opens `path` as a walk root: a directory, not itself a symlink.
Result<Fd> open_root(const std::string& path);

// The kIo error for a path that is a symlink kvstore was asked to open.
Error symlink_error(std::string path);

// Walks everything under `root_fd` (which stays open and owned by the caller).
// `prefix` is prepended to every rel path (for walking a subdirectory).
WalkResult walk(int root_fd, const WalkOptions& options = {});

// The entries of one directory, not recursing (the tier directory level).
WalkResult list_dir(int dir_fd);

// Opens `rel` below `root_fd` without following any symlink and without
// leaving the root (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS).
Result<Fd> open_beneath(int root_fd, std::string_view rel, int flags);

// Opens a regular file below the root for reading; refuses anything else.
Result<Fd> open_file_beneath(int root_fd, std::string_view rel);

// lstat-like information for `rel` below the root.
Result<FileStat> stat_beneath(int root_fd, std::string_view rel);

FileStat to_file_stat(const struct stat& st);

// Splits "a/b/c" into ("a/b", "c"); ("", "c") for a bare name.
std::pair<std::string_view, std::string_view> split_parent(std::string_view rel);

}  // namespace kvstore
