// load_key_file (key_file.h), moved here from kvstore's mac_check so that the
// overlays run the same checks through the store library.
#include "kvtier/format/key_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvformat {
namespace {

constexpr std::size_t kMinKey = kMinKeyBytes, kMaxKey = kMaxKeyBytes;

std::string stat_problem(const std::string& path, const struct stat& st) {
  if (!S_ISREG(st.st_mode)) return "key file " + path + " is not a regular file: refused";
  const unsigned mode = st.st_mode & 07777;
  if (mode & 077) {
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", mode);
    return "key file " + path + " has mode " + octal + ": group/other may access it (chmod 600)";
  }
  if (st.st_uid != ::geteuid())
    return "key file " + path + " is owned by uid " + std::to_string(st.st_uid) + ", not this user " +
           std::to_string(::geteuid());
  if (st.st_size < static_cast<off_t>(kMinKey) || st.st_size > static_cast<off_t>(kMaxKey))
    return "key file " + path + " holds " + std::to_string(st.st_size) + " bytes: needs 32..4096";
  return "";
}

// `path` lies in `store` (both resolved): whoever writes the store could
// read or swap a key kept there.
bool inside(const std::string& path, const std::string& store) {
  if (store.empty()) return false;
  char a[PATH_MAX], b[PATH_MAX];
  if (!::realpath(path.c_str(), a) || !::realpath(store.c_str(), b)) return false;
  std::string key(a), root(b);
  if (root != "/" && root.back() != '/') root += '/';
  return key + "/" == root || key.rfind(root, 0) == 0;
}

}  // namespace

std::string load_key_file(const std::string& path, std::vector<std::uint8_t>& key,
                          const std::string& store, const std::function<void()>& between) {
  key.clear();  // a refusal leaves no key behind
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "key file " + path + ": " + std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return "key file " + path + " is a symlink: refused";
  if (auto p = stat_problem(path, st); !p.empty()) return p;
  if (inside(path, store))
    return "key file " + path + " is inside the store folder " + store +
           ": refused (keep it outside, where only the serving user can read it)";
  if (between) between();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "key file " + path + ": " + std::strerror(errno);
  struct stat now {};
  if (::fstat(fd, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
    ::close(fd);
    return "key file " + path + " changed while opened: refused";
  }
  if (auto p = stat_problem(path, now); !p.empty()) {
    ::close(fd);
    return p;
  }
  key.assign(kMaxKey + 1, 0);
  std::size_t have = 0;
  while (have < key.size()) {
    const ssize_t n = ::read(fd, key.data() + have, key.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<std::size_t>(n);
  }
  ::close(fd);
  key.resize(have);
  if (have < kMinKey || have > kMaxKey) {
    key.clear();
    return "key file " + path + " changed while read: refused";
  }
  if (std::all_of(key.begin(), key.end(), [](std::uint8_t b) { return b == 0; })) {
    key.clear();
    return "key file " + path + " holds only zero bytes: refused (head -c 32 /dev/urandom makes a key)";
  }
  return "";
}

}  // namespace kvformat
