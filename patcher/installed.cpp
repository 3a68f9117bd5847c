// What another tool installed into a folder the engine created: docker/bake.sh
// copies the store library (and the ISA-L and libcrypto it needs) beside the
// overlay's kv_store_format/native.py and records each file's sha256 in the
// folder's `.overlay-installed`. A revert removes exactly those files whose
// bytes still match, with the record, the marker and the folder; anything
// else in the folder keeps it (the engine never deletes what it cannot name).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "sha256.h"
#include "text.h"
#include "txn.h"

namespace patcher {

namespace {

// The bytes of regular file `name` in `dir`, or nullopt (absent, a link,
// not a regular file, unreadable).
bool read_regular(int dir, const std::string& name, std::string& out) {
  int fd = ::openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  Fd owned(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  out.clear();
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    out.append(buf, static_cast<size_t>(n));
  }
}

bool plain_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos && n != kDirMarker &&
         n != kInstalledRecord;
}

}  // namespace

std::vector<std::string> installed_files(int dir) {
  std::string record;
  if (!read_regular(dir, kInstalledRecord, record)) return {};
  std::vector<std::string> out;
  for (const auto& line : split_lines(record).lines) {
    // sha256sum's text form: 64 hex digits, two spaces, the name.
    if (line.size() < 67 || line.compare(64, 2, "  ") != 0) return {};
    std::string sha = line.substr(0, 64), name = line.substr(66);
    if (sha.find_first_not_of("0123456789abcdef") != std::string::npos || !plain_name(name)) return {};
    std::string bytes;
    if (read_regular(dir, name, bytes) && kvtier::sha256_hex(bytes) == sha) out.push_back(name);
  }
  out.push_back(kInstalledRecord);
  return out;
}

}  // namespace patcher
