// open_no_links (no_links.h).
#include "no_links.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>

namespace storeio {
namespace {

std::atomic<bool> g_no_openat2{false};

// One component at a time from / (or the working folder), O_NOFOLLOW each.
int walk(const char* path, int flags, mode_t mode) {
  const std::string p(path);
  int at = ::open(p.starts_with("/") ? "/" : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (at < 0) return -1;
  std::size_t i = 0;
  while (i < p.size()) {
    std::size_t j = p.find('/', i);
    if (j == std::string::npos) j = p.size();
    const std::string part = p.substr(i, j - i);
    i = j + 1;
    if (part.empty() || part == ".") continue;
    const bool last = p.find_first_not_of('/', j) == std::string::npos;
    const int want = last ? flags : O_RDONLY | O_DIRECTORY;
    const int next = ::openat(at, part.c_str(), want | O_NOFOLLOW | O_CLOEXEC, mode);
    int err = errno;
    if (next < 0 && err == ENOTDIR) {
      // O_DIRECTORY|O_NOFOLLOW on a link to a folder says ENOTDIR: it is a link.
      struct stat st {};
      if (::fstatat(at, part.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) err = ELOOP;
    }
    ::close(at);
    if (next < 0) {
      errno = err;
      return -1;
    }
    if (last) return next;
    at = next;
  }
  return at;  // the path named / or the working folder itself
}

}  // namespace

int open_no_links(const char* path, int flags, mode_t mode, bool walk_only) {
  if (!walk_only && !g_no_openat2.load(std::memory_order_relaxed)) {
    struct open_how how {};
    how.flags = static_cast<std::uint64_t>(flags | O_CLOEXEC);
    how.mode = (flags & O_CREAT) ? mode : 0;
    how.resolve = RESOLVE_NO_SYMLINKS;
    const long fd = ::syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how);
    if (fd >= 0) return static_cast<int>(fd);
    if (errno != ENOSYS && errno != EPERM && errno != E2BIG) return -1;
    g_no_openat2.store(true, std::memory_order_relaxed);  // seccomp or an old kernel
  }
  return walk(path, flags, mode);
}

}  // namespace storeio
