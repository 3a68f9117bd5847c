#include "kvtier/kvstore/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "kvtier/kvstore/walk.h"

namespace kvstore {

Result<Done> write_file_atomic(const std::string& path, std::string_view content) {
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  // node-exporter ignores names not ending in .prom, so the temp is never scraped.
  std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(tmp, errno, "cannot create");
  Fd guard(fd);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      Error e = io_error(tmp, errno, "cannot write");
      ::unlink(tmp.c_str());
      return e;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    Error e = io_error(tmp, errno, "fsync");
    ::unlink(tmp.c_str());
    return e;
  }
  guard = Fd();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Error e = io_error(path, errno, "cannot rename temp over");
    ::unlink(tmp.c_str());
    return e;
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return io_error(dir, errno, "cannot open directory");
  Fd dguard(dfd);
  if (::fsync(dfd) != 0) return io_error(dir, errno, "fsync");
  return Done{};
}

}  // namespace kvstore
