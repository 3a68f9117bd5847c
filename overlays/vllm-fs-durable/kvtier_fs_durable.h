// Durable publishing for vLLM's filesystem KV tier (overlay vllm-fs-durable).
//
// _store_block writes a temp file, closes it and renames it over the block's
// name. Without a data sync before the rename, a power loss can leave the new
// name pointing at an empty or torn file; without a sync of the folder after
// it, the rename itself can be lost. Each returns 0 or the failing errno.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <string>

namespace kvtier_fs_durable {

// The file's data (and what is needed to read it back) reaches the disk.
inline int sync_data(int fd) {
  while (fdatasync(fd) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

// The folder entry naming `path` reaches the disk (after a rename).
inline int sync_parent_dir(const char* path) {
  const std::string p(path);
  const size_t slash = p.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = 0;
  while (fsync(fd) != 0) {
    if (errno != EINTR) {
      err = errno;
      break;
    }
  }
  close(fd);
  return err;
}

}  // namespace kvtier_fs_durable
