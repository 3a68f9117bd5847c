#include "mac_check.h"

#include "kvtier/format/key_file.h"

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

std::string load_key(const std::string& path, std::vector<std::uint8_t>& key, const std::string& store) {
  return kvformat::load_key_file(path, key, store);
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
