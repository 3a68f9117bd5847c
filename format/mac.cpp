#include "kvtier/format/mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/hmac.h>
#include <openssl/params.h>

#include <cstring>
#include <new>

#include "kvtier/format/crc32.h"

namespace kvformat {
namespace {

constexpr std::size_t kFlagsAt = 10;
constexpr std::size_t kHeaderLengthAt = 12;
constexpr std::size_t kMinChunk = 148;  // fixed header + header checksum

std::uint32_t load_u32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
         std::uint32_t{p[3]} << 24;
}

std::uint16_t load_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | p[1] << 8);
}

}  // namespace

Mac hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> data) {
  Mac out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), data.data(), data.size(),
       out.data(), &len);
  return out;
}

MacStream::MacStream(std::span<const std::uint8_t> key) : ctx_(nullptr) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX* ctx = mac ? EVP_MAC_CTX_new(mac) : nullptr;
  EVP_MAC_free(mac);  // the context keeps its own reference
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_END};
  if (!ctx || EVP_MAC_init(ctx, key.data(), key.size(), params) != 1) {
    EVP_MAC_CTX_free(ctx);
    throw std::bad_alloc();  // no HMAC in this libcrypto: nothing can be sealed
  }
  ctx_ = ctx;
}

MacStream::~MacStream() { EVP_MAC_CTX_free(static_cast<EVP_MAC_CTX*>(ctx_)); }

void MacStream::update(std::span<const std::uint8_t> data) {
  if (!data.empty()) EVP_MAC_update(static_cast<EVP_MAC_CTX*>(ctx_), data.data(), data.size());
}

Mac MacStream::finish() {
  Mac out{};
  std::size_t len = 0;
  EVP_MAC_final(static_cast<EVP_MAC_CTX*>(ctx_), out.data(), &len, out.size());
  return out;
}

bool mac_equal(const std::uint8_t* a, const std::uint8_t* b) {
  return CRYPTO_memcmp(a, b, kMacSize) == 0;
}

std::string mac_key_id(std::span<const std::uint8_t> key) {
  static constexpr char kLabel[] = "kvtier key id";
  const Mac mac = hmac_sha256(
      key, {reinterpret_cast<const std::uint8_t*>(kLabel), sizeof kLabel - 1});
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < 8; ++i) {
    out += kHex[mac[i] >> 4];
    out += kHex[mac[i] & 15];
  }
  return out;
}

std::vector<std::uint8_t> seal_chunk(std::span<const std::uint8_t> key,
                                     std::span<const std::uint8_t> chunk) {
  if (chunk.size() < kMinChunk) return {};
  const std::uint32_t header_length = load_u32(chunk.data() + kHeaderLengthAt);
  if (header_length < kMinChunk || header_length > chunk.size()) return {};
  std::vector<std::uint8_t> out(chunk.begin(), chunk.end());
  out[kFlagsAt] = static_cast<std::uint8_t>(kFlagMac & 0xff);
  out[kFlagsAt + 1] = static_cast<std::uint8_t>(kFlagMac >> 8);
  const std::uint32_t crc = crc32({out.data(), header_length - 4});
  for (int i = 0; i < 4; ++i) out[header_length - 4 + i] = static_cast<std::uint8_t>(crc >> (8 * i));
  const Mac mac = hmac_sha256(key, out);
  out.insert(out.end(), mac.begin(), mac.end());
  return out;
}

MacVerdict check_chunk_mac(std::span<const std::uint8_t> key,
                           std::span<const std::uint8_t> file) {
  if (file.size() < kFlagsAt + 2 || !(load_u16(file.data() + kFlagsAt) & kFlagMac)) {
    return MacVerdict::Missing;
  }
  if (file.size() < kMinChunk + kMacSize) return MacVerdict::Truncated;
  const auto body = file.first(file.size() - kMacSize);
  const Mac want = hmac_sha256(key, body);
  // Constant time: how much of a forged MAC matched must not show.
  if (CRYPTO_memcmp(want.data(), file.data() + body.size(), kMacSize) != 0) {
    return MacVerdict::Mismatch;
  }
  return MacVerdict::Ok;
}

}  // namespace kvformat
