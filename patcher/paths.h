// Safe access to files inside a tree: paths are relative, never contain "."
// or "..", and every component is opened with O_NOFOLLOW, so neither a
// manifest nor a planted symlink can make the engine leave its root.
#pragma once

#include <sys/stat.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fd.h"
#include "error.h"

namespace patcher {

// `what` names the field in error messages, e.g. "path" or "fragment".
Status validate_rel_path(std::string_view rel, const std::string& manifest_file, const char* what);

// The owned fd type is shared with kvstore (common/fd.h).
using kvtier::Fd;

struct FileData {
  std::string bytes;
  struct stat st {};
};

class Tree {
 public:
  static Result<Tree> open(const std::string& root);
  const std::string& root() const { return root_; }
  int fd() const { return fd_.get(); }

  // Opens the directory holding `rel`. nullopt when a parent is missing.
  Result<std::optional<Fd>> open_parent(std::string_view rel) const;
  // Reads a regular file. nullopt when it does not exist.
  Result<std::optional<FileData>> read(std::string_view rel) const;
  // True when `rel` exists (as anything, links included).
  Result<bool> exists(std::string_view rel) const;
  // The file type bits of `rel` (S_IFREG, S_IFDIR, ...; a link is S_IFLNK), 0 when absent.
  Result<mode_t> type(std::string_view rel) const;

 private:
  std::string root_;
  Fd fd_;
};

std::string base_name(std::string_view rel);
std::string dir_name(std::string_view rel);  // "" for top-level names
Result<FileData> read_fd(int fd, const std::string& display);
// Names in the folder open at `dirfd` ("." and ".." left out).
Result<std::vector<std::string>> list_dir(int dirfd, const std::string& display);
std::string errno_text(int err);

}  // namespace patcher
