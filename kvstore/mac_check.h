// verify --key (docs/FORMAT.md 3.6): a keyed store's MACs, checked with the
// operator's key. Compiled against libcrypto when CMake finds OpenSSL; else
// available() is false and kvstore refuses --key.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvstore::mac_check {

bool available();

// The key file's checks (kvformat::load_key_file, key_file.h, which the
// overlays' kv_store_format.mac.load_key calls through the store library; as
// ssh's of a private key): a regular file, not a symlink, owned by this user,
// no group or other permission bit, 32..4096 bytes, not inside the store
// folder `store`, not all zero bytes; opened without blocking and judged on
// the descriptor (a FIFO or a file swapped in is refused, never waited on).
// "" and `key` filled, or the problem naming the file (never the key's bytes).
std::string load_key(const std::string& path, std::vector<std::uint8_t>& key, const std::string& store = "");

// What the namespace record fences for this key (never the key).
std::string key_id(std::span<const std::uint8_t> key);

// The manifest's "mac" (hex) over `body` (split_manifest_mac), in constant time.
bool manifest_ok(std::span<const std::uint8_t> key, std::string_view body, std::string_view mac_hex);

// A sealed chunk file's MAC: its bytes [0, size - 32) read and MAC'd, then
// checked against its last 32 (the v3 seal's salt || tag, for `rank`, the
// rank of the folder it lies in, -1 when the folder's name gives none; or a
// v2 seal's HMAC). "" when it holds, else the verdict text
// ("mac_mismatch: ..."); `io` tells a read failure from a bad MAC.
std::string chunk_problem(int fd, std::uint64_t size, std::span<const std::uint8_t> key, int rank,
                          bool* io);

}  // namespace kvstore::mac_check
