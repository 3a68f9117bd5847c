// Keyed stores (docs/FORMAT.md 3.6): HMAC-SHA256 through OpenSSL's libcrypto,
// the key's id, and the chunk seal/check the Python codec's mac.py does.
// Separate from kvformat so only what handles keys links libcrypto.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/format/header.h"  // kFlagMac, kMacSize, set_chunk_flags

namespace kvformat {


using Mac = std::array<std::uint8_t, kMacSize>;

Mac hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data);

// The first 16 hex digits of HMAC(key, "kvtier key id"): what `fenced`
// carries as mac_key_id, never the key.
std::string mac_key_id(std::span<const std::uint8_t> key);

// The plain chunk with flag bit 0 set, the header checksum redone and the
// MAC appended. Empty if the bytes are too short for a header.
std::vector<std::uint8_t> seal_chunk(std::span<const std::uint8_t> key,
                                     std::span<const std::uint8_t> chunk);

// HMAC-SHA256 over bytes given in pieces (a reader MACs the header and the
// payload as they lie in memory; a writer the header after the payload).
class MacStream {
 public:
  explicit MacStream(std::span<const std::uint8_t> key);
  ~MacStream();
  MacStream(const MacStream&) = delete;
  MacStream& operator=(const MacStream&) = delete;
  void update(std::span<const std::uint8_t> data);
  Mac finish();  // once

 private:
  void* ctx_;  // EVP_MAC_CTX, kept out of this header
};

// Constant time: how much of a forged MAC matched must not show.
bool mac_equal(const std::uint8_t* a, const std::uint8_t* b);

enum class MacVerdict { Ok, Missing, Mismatch, Truncated };

// Checks a keyed file's MAC before anything else of it is used.
MacVerdict check_chunk_mac(std::span<const std::uint8_t> key,
                           std::span<const std::uint8_t> file);

}  // namespace kvformat
