// Keyed stores (docs/FORMAT.md 3.6) through OpenSSL's libcrypto: the v3
// chunk seal (a per-chunk subkey from a random salt and the rank, AES-GMAC
// over header || payload), the v2 seal it replaces (HMAC-SHA256, still
// read), HMAC-SHA256 for manifests and the key's id.
// Separate from kvformat so only what handles keys links libcrypto.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/format/format_error.h"
#include "kvtier/format/header.h"  // kFlagMac, kMacSize, kSealedVersion

namespace kvformat {

using Mac = std::array<std::uint8_t, kMacSize>;
inline constexpr std::size_t kSaltSize = 16;
inline constexpr std::size_t kTagSize = 16;
using Salt = std::array<std::uint8_t, kSaltSize>;
using Tag = std::array<std::uint8_t, kTagSize>;
using Trailer = std::array<std::uint8_t, kMacSize>;  // v3: salt || tag

Mac hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data);

// The first 16 hex digits of HMAC(key, "kvtier key id"): what `fenced`
// carries as mac_key_id, never the key.
std::string mac_key_id(std::span<const std::uint8_t> key);

// v3: the AES-256 key of one chunk, HMAC-SHA256(key, "kvtier chunk mac v3"
// || salt || u32le(rank)). A fresh salt per file makes every subkey used
// once, so GMAC's constant IV never repeats under a key.
Mac chunk_subkey(std::span<const std::uint8_t> key, const Salt& salt, std::uint32_t rank);

// 16 bytes from libcrypto's generator; nullopt if it fails (never seal then).
std::optional<Salt> random_salt();

// HMAC-SHA256 over bytes given in pieces (manifests; the v2 chunk seal).
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

// AES-256-GCM with the bytes as additional data only (GMAC), IV 0^96,
// under a subkey used for one message. GHASH runs on PCLMULQDQ/AVX where
// the CPU has them: memory speed, where HMAC-SHA256 is about 2 GB/s a core.
class GmacStream {
 public:
  explicit GmacStream(const Mac& subkey);
  ~GmacStream();
  GmacStream(const GmacStream&) = delete;
  GmacStream& operator=(const GmacStream&) = delete;
  void update(std::span<const std::uint8_t> data);
  Tag finish();  // once

 private:
  void* ctx_;  // EVP_CIPHER_CTX
};

// The v3 seal of one file, fed the sealed header (seal_header_v3) and then
// the payload in order; trailer() is what follows the payload.
class ChunkSealer {
 public:
  ChunkSealer(std::span<const std::uint8_t> key, std::uint32_t rank, const Salt& salt);
  void update(std::span<const std::uint8_t> data) { gmac_.update(data); }
  Trailer trailer();  // once

 private:
  Salt salt_;
  GmacStream gmac_;
};

// A sealed file's MAC checked over its bytes before the trailer, fed in
// order (a reader feeds the header, then the payload as it landed): the
// construction is the one the sealed header's version names, 3 the v3
// seal, 1 and 2 the v2 seal (HMAC, no rank); any other version has none.
class ChunkMacCheck {
 public:
  ChunkMacCheck(std::span<const std::uint8_t> key, std::uint32_t rank, std::uint16_t version,
                const Trailer& trailer);
  bool known() const { return hmac_ || gmac_; }
  void update(std::span<const std::uint8_t> data);
  bool matches();  // once; constant time; false for an unknown version

 private:
  Trailer trailer_;
  std::unique_ptr<MacStream> hmac_;
  std::unique_ptr<GmacStream> gmac_;
};

// Constant time: how much of a forged MAC matched must not show.
bool mac_equal(const std::uint8_t* a, const std::uint8_t* b);

// The plain chunk sealed with v3 for `rank` under `salt` (a writer draws it
// at random; vectors fix it). Empty if the bytes are too short for a header.
std::vector<std::uint8_t> seal_chunk(std::span<const std::uint8_t> key, std::uint32_t rank,
                                     const Salt& salt, std::span<const std::uint8_t> chunk);
// The v2 seal (flag bit 0, HMAC-SHA256 of the rest): what stores written
// before v3 hold. Tests and vectors only; writers seal v3.
std::vector<std::uint8_t> seal_chunk_v2(std::span<const std::uint8_t> key,
                                        std::span<const std::uint8_t> chunk);

enum class MacVerdict { Ok, Missing, Mismatch, Truncated };

// Checks a keyed file's MAC before anything else of it is used.
MacVerdict check_chunk_mac(std::span<const std::uint8_t> key, std::uint32_t rank,
                           std::span<const std::uint8_t> file);

// A keyed store's manifest (FORMAT.md 3.6). seal_manifest: the canonical
// bytes of `manifest` (a manifest's JSON, e.g. encode_manifest's) with
// "mac", the hex HMAC-SHA256 of the canonical JSON of the rest; bad_json if
// it is no JSON object. open_manifest: the canonical JSON of a file's object
// without "mac", its MAC checked first: bad_json / bad_field for bytes that
// are no JSON object, mac_missing, mac_mismatch (a "mac" that is not 64
// lowercase hex digits too: issue 45). parse_manifest then judges the rest.
Result<std::string> seal_manifest(std::span<const std::uint8_t> key, std::string_view manifest);
Result<std::string> open_manifest(std::span<const std::uint8_t> key, std::string_view bytes);

}  // namespace kvformat
