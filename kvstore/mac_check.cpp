#include "mac_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <vector>

#if KVSTORE_HAVE_MAC
#include "kvtier/format/mac.h"
#endif

namespace kvstore::mac_check {

namespace {

constexpr std::size_t kMinKey = 32, kMaxKey = 4096;

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

std::string load_key(const std::string& path, std::vector<std::uint8_t>& key, const std::string& store) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "key file " + path + ": " + std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return "key file " + path + " is a symlink: refused";
  if (auto p = stat_problem(path, st); !p.empty()) return p;
  if (inside(path, store))
    return "key file " + path + " is inside the store folder " + store +
           ": refused (keep it outside, where only the serving user can read it)";
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

#if KVSTORE_HAVE_MAC

bool available() { return true; }

std::string key_id(std::span<const std::uint8_t> key) { return kvformat::mac_key_id(key); }

bool manifest_ok(std::span<const std::uint8_t> key, std::string_view body, std::string_view mac_hex) {
  const kvformat::Mac mac =
      kvformat::hmac_sha256(key, {reinterpret_cast<const std::uint8_t*>(body.data()), body.size()});
  static constexpr char kHex[] = "0123456789abcdef";
  std::string want(2 * mac.size(), '0');
  for (std::size_t i = 0; i < mac.size(); ++i) {
    want[2 * i] = kHex[mac[i] >> 4];
    want[2 * i + 1] = kHex[mac[i] & 15];
  }
  if (mac_hex.size() != want.size()) return false;
  unsigned diff = 0;  // constant time over the hex, as the codecs compare
  for (std::size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned char>(want[i] ^ mac_hex[i]);
  return diff == 0;
}

std::string chunk_problem(int fd, std::uint64_t size, std::span<const std::uint8_t> key, int rank,
                          bool* io) {
  *io = false;
  if (size < kvformat::kMacSize) return "truncated: too short for a MAC";
  const std::uint64_t body = size - kvformat::kMacSize;
  // The trailer first: a v3 seal's salt keys its MAC.
  kvformat::Trailer tag{};
  std::array<std::uint8_t, 10> first{};
  for (auto [at, dst, len] : {std::tuple{body, tag.data(), tag.size()},
                              std::tuple{std::uint64_t{0}, first.data(), first.size()}}) {
    std::size_t have = 0;
    while (have < len) {
      const ssize_t n = ::pread(fd, dst + have, len - have, static_cast<off_t>(at + have));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        *io = true;
        return std::string("read: ") + std::strerror(errno);
      }
      if (n == 0) return "truncated: file shrank while read";
      have += static_cast<std::size_t>(n);
    }
  }
  const std::uint16_t version = kvformat::raw_version(first);
  if (version == kvformat::kSealedVersion && rank < 0)
    return "mac_mismatch: a v3 chunk's MAC binds its rank, and this folder's name "
           "(not <prefix>_<model>_<ns>_r<rank>) gives none";
  kvformat::ChunkMacCheck mac(key, rank < 0 ? 0 : static_cast<std::uint32_t>(rank), version, tag);
  if (!mac.known())
    return "mac_mismatch: sealed chunk of format version " + std::to_string(version) +
           ": no MAC this kvstore knows";
  std::vector<std::uint8_t> buf(std::min<std::uint64_t>(std::uint64_t{4} << 20, std::max<std::uint64_t>(body, 1)));
  std::uint64_t at = 0;
  while (at < body) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), body - at));
    const ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(at));
    if (n < 0) {
      if (errno == EINTR) continue;
      *io = true;
      return std::string("read: ") + std::strerror(errno);
    }
    if (n == 0) return "truncated: file shrank while read";
    mac.update({buf.data(), static_cast<std::size_t>(n)});
    at += static_cast<std::uint64_t>(n);
  }
  if (!mac.matches()) return "mac_mismatch: chunk MAC differs";
  return "";
}

#else

bool available() { return false; }
std::string key_id(std::span<const std::uint8_t>) { return ""; }
bool manifest_ok(std::span<const std::uint8_t>, std::string_view, std::string_view) { return false; }
std::string chunk_problem(int, std::uint64_t, std::span<const std::uint8_t>, int, bool* io) {
  *io = false;
  return "mac_mismatch: this kvstore was built without OpenSSL";
}

#endif

}  // namespace kvstore::mac_check
