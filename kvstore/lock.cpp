#include "kvtier/kvstore/lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <thread>

namespace kvstore {

namespace {

const char* type_name(mode_t m) {
  if (S_ISDIR(m)) return "a folder";
  if (S_ISLNK(m)) return "a symlink";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  return "not a regular file";
}

Error not_a_lock(mode_t m) {
  Error e;
  e.kind = ErrorKind::kInvalid;
  e.path = kLockFileName;
  e.message = std::string("is ") + type_name(m) +
              ", not a regular file: no writer can be locked out through it (remove it; the sweep creates it)";
  return e;
}

// The serving user's writer opens .lock O_RDWR at boot: a lock root made
// (a `kvstore gc --sweep` run as root) would disable it (issue 45). So a
// lock made here belongs to the rank folder's owner, and one an earlier
// root run made (root's, in a folder root does not own) is given back.
std::optional<Error> owned_like_the_rank(int rank_fd, int fd, const struct stat& lock, bool made) {
  struct stat rank;
  if (::fstat(rank_fd, &rank) != 0) return io_error(".", errno, "cannot stat the rank folder");
  if (lock.st_uid == rank.st_uid) return std::nullopt;
  if (::geteuid() != 0 || (!made && lock.st_uid != 0)) return std::nullopt;  // not ours to change
  if (::fchown(fd, rank.st_uid, rank.st_gid) != 0 || ::fchmod(fd, 0600) != 0) {
    const int err = errno;
    if (made) ::unlinkat(rank_fd, kLockFileName, 0);
    return io_error(kLockFileName, err, "cannot give the lock file to the rank folder's owner");
  }
  return std::nullopt;
}

Result<StoreLock> take(int rank_fd, int op, std::chrono::milliseconds timeout) {
  // Only a regular file is a lock: flock on a FIFO works but no writer uses
  // it, and opening a device could act on it. Looked at before the open (so
  // nothing special is opened) and after it (in case it was swapped).
  struct stat st;
  if (::fstatat(rank_fd, kLockFileName, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
    return not_a_lock(st.st_mode);
  // Private like every store file (docs/DEPLOY.md, Security); never re-moded.
  constexpr int kFlags = O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
  bool made = true;
  int fd = ::openat(rank_fd, kLockFileName, kFlags | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    made = false;
    fd = ::openat(rank_fd, kLockFileName, kFlags);
  }
  if (fd < 0) {
    const int err = errno;
    if (::fstatat(rank_fd, kLockFileName, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
      return not_a_lock(st.st_mode);
    return io_error(kLockFileName, err, "cannot open lock file");
  }
  Fd guard(fd);
  if (::fstat(fd, &st) != 0) return io_error(kLockFileName, errno, "cannot stat lock file");
  if (!S_ISREG(st.st_mode)) return not_a_lock(st.st_mode);
  if (auto owned = owned_like_the_rank(rank_fd, fd, st, made)) return *owned;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (::flock(fd, op | LOCK_NB) == 0) return StoreLock(std::move(guard));
    if (errno != EWOULDBLOCK && errno != EINTR)
      return io_error(kLockFileName, errno, "cannot lock");
    if (std::chrono::steady_clock::now() >= deadline) {
      Error e;
      e.kind = ErrorKind::kRefused;
      e.path = kLockFileName;
      e.message = "a writer holds the store lock; timed out waiting (see --lock-timeout)";
      return e;
    }
    // Poll with a short back-off: flock has no timed wait.
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace

bool StoreLock::mark_swept() const {
  struct stat st;
  if (!held() || ::fstat(fd_.get(), &st) != 0) return false;
  struct timespec now;
  if (::clock_gettime(CLOCK_REALTIME, &now) != 0) return false;
  constexpr int64_t kNs = 1000000000;
  const int64_t old_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * kNs + st.st_mtim.tv_nsec;
  int64_t ns = static_cast<int64_t>(now.tv_sec) * kNs + now.tv_nsec;
  if (ns <= old_ns) ns = old_ns + 1;
  const struct timespec times[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(ns / kNs), static_cast<long>(ns % kNs)}};
  return ::futimens(fd_.get(), times) == 0;
}

Result<StoreLock> lock_exclusive(int rank_fd, std::chrono::milliseconds timeout) {
  return take(rank_fd, LOCK_EX, timeout);
}

Result<StoreLock> lock_shared(int rank_fd, std::chrono::milliseconds timeout) {
  return take(rank_fd, LOCK_SH, timeout);
}

}  // namespace kvstore
