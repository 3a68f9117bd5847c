#include "kvtier/kvstore/lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

namespace kvstore {

namespace {

Outcome<StoreLock> take(int rank_fd, int op, std::chrono::milliseconds timeout) {
  int fd = ::openat(rank_fd, kLockFileName, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(kLockFileName, errno, "cannot open lock file");
  Fd guard(fd);
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

Outcome<StoreLock> lock_exclusive(int rank_fd, std::chrono::milliseconds timeout) {
  return take(rank_fd, LOCK_EX, timeout);
}

Outcome<StoreLock> lock_shared(int rank_fd, std::chrono::milliseconds timeout) {
  return take(rank_fd, LOCK_SH, timeout);
}

}  // namespace kvstore
