// A keyed store's key file (docs/FORMAT.md 3.6), loaded with the checks ssh
// makes of a private key. One implementation for kvstore (verify --key) and
// the overlays (kv_store_format.mac.load_key, through the store library).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kvformat {

inline constexpr std::size_t kMinKeyBytes = 32, kMaxKeyBytes = 4096;

// A regular file, not a symlink, owned by this user, no group or other
// permission bit, 32..4096 bytes, not inside the store folder `store` (""
// for none: whoever can write the store could read or swap it there), not
// all zero bytes; opened without blocking and judged on the descriptor (a
// FIFO or a file swapped in is refused, never waited on). "" and `key`
// filled, or the refusal naming the file (never the key's bytes).
// `between` (tests only) runs after the first look and before the open: a
// file swapped in there must be refused, never waited on.
std::string load_key_file(const std::string& path, std::vector<std::uint8_t>& key,
                          const std::string& store = "",
                          const std::function<void()>& between = {});

}  // namespace kvformat
