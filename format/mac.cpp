#include "kvtier/format/mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <new>

#include <nlohmann/json.hpp>

#include "kvtier/format/boundary_manifest.h"  // kMaxManifestBytes
#include "kvtier/format/canonical_json.h"

namespace kvformat {
namespace {

constexpr std::size_t kMinChunk = 148;  // fixed header + header checksum
constexpr char kManifestMac[] = "mac";

std::string hex(const Mac& mac) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * mac.size(), '0');
  for (std::size_t i = 0; i < mac.size(); ++i) {
    out[2 * i] = kHex[mac[i] >> 4];
    out[2 * i + 1] = kHex[mac[i] & 15];
  }
  return out;
}

Mac text_mac(std::span<const std::uint8_t> key, std::string_view text) {
  return hmac_sha256(key, {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
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
  return hex(hmac_sha256(key, {reinterpret_cast<const std::uint8_t*>(kLabel), sizeof kLabel - 1}))
      .substr(0, 16);
}

Mac chunk_subkey(std::span<const std::uint8_t> key, const Salt& salt, std::uint32_t rank) {
  static constexpr char kLabel[] = "kvtier chunk mac v3";
  std::array<std::uint8_t, sizeof kLabel - 1 + kSaltSize + 4> input{};
  std::memcpy(input.data(), kLabel, sizeof kLabel - 1);
  std::memcpy(input.data() + sizeof kLabel - 1, salt.data(), kSaltSize);
  for (int i = 0; i < 4; ++i)
    input[sizeof kLabel - 1 + kSaltSize + i] = static_cast<std::uint8_t>(rank >> (8 * i));
  return hmac_sha256(key, input);
}

std::optional<Salt> random_salt() {
  Salt salt{};
  if (RAND_bytes(salt.data(), static_cast<int>(salt.size())) != 1) return std::nullopt;
  return salt;
}

GmacStream::GmacStream(const Mac& subkey) : ctx_(nullptr) {
  static constexpr std::uint8_t kIv[12] = {};  // the subkey is used once: a constant IV
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  if (!ctx || EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, subkey.data(), kIv) != 1) {
    EVP_CIPHER_CTX_free(ctx);
    throw std::bad_alloc();  // no AES-GCM in this libcrypto: nothing can be sealed
  }
  ctx_ = ctx;
}

GmacStream::~GmacStream() { EVP_CIPHER_CTX_free(static_cast<EVP_CIPHER_CTX*>(ctx_)); }

void GmacStream::update(std::span<const std::uint8_t> data) {
  auto* ctx = static_cast<EVP_CIPHER_CTX*>(ctx_);
  // Additional data only (no output buffer); int lengths, so in parts.
  constexpr std::size_t kPart = std::size_t{1} << 30;
  for (std::size_t at = 0; at < data.size(); at += kPart) {
    int out = 0;
    EVP_EncryptUpdate(ctx, nullptr, &out, data.data() + at,
                      static_cast<int>(std::min(kPart, data.size() - at)));
  }
}

Tag GmacStream::finish() {
  auto* ctx = static_cast<EVP_CIPHER_CTX*>(ctx_);
  Tag tag{};
  std::uint8_t none[16];
  int out = 0;
  EVP_EncryptFinal_ex(ctx, none, &out);
  EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag.size()), tag.data());
  return tag;
}

ChunkSealer::ChunkSealer(std::span<const std::uint8_t> key, std::uint32_t rank, const Salt& salt)
    : salt_(salt), gmac_(chunk_subkey(key, salt, rank)) {}

Trailer ChunkSealer::trailer() {
  Trailer out{};
  const Tag tag = gmac_.finish();
  std::memcpy(out.data(), salt_.data(), kSaltSize);
  std::memcpy(out.data() + kSaltSize, tag.data(), kTagSize);
  return out;
}

ChunkMacCheck::ChunkMacCheck(std::span<const std::uint8_t> key, std::uint32_t rank,
                             std::uint16_t version, const Trailer& trailer)
    : trailer_(trailer) {
  if (version == kSealedVersion) {
    Salt salt{};
    std::memcpy(salt.data(), trailer.data(), kSaltSize);
    gmac_ = std::make_unique<GmacStream>(chunk_subkey(key, salt, rank));
  } else if (version == 1 || version == 2) {
    hmac_ = std::make_unique<MacStream>(key);
  }
}

void ChunkMacCheck::update(std::span<const std::uint8_t> data) {
  if (gmac_) gmac_->update(data);
  if (hmac_) hmac_->update(data);
}

bool ChunkMacCheck::matches() {
  if (gmac_) {
    const Tag tag = gmac_->finish();
    return CRYPTO_memcmp(tag.data(), trailer_.data() + kSaltSize, kTagSize) == 0;
  }
  if (hmac_) {
    const Mac mac = hmac_->finish();
    return mac_equal(mac.data(), trailer_.data());
  }
  return false;
}

std::vector<std::uint8_t> seal_chunk(std::span<const std::uint8_t> key, std::uint32_t rank,
                                     const Salt& salt, std::span<const std::uint8_t> chunk) {
  std::vector<std::uint8_t> out(chunk.begin(), chunk.end());
  if (!seal_header_v3(out)) return {};
  ChunkSealer sealer(key, rank, salt);
  sealer.update(out);
  const Trailer trailer = sealer.trailer();
  out.insert(out.end(), trailer.begin(), trailer.end());
  return out;
}

std::vector<std::uint8_t> seal_chunk_v2(std::span<const std::uint8_t> key,
                                        std::span<const std::uint8_t> chunk) {
  std::vector<std::uint8_t> out(chunk.begin(), chunk.end());
  if (!set_chunk_flags(out, kFlagMac)) return {};
  const Mac mac = hmac_sha256(key, out);
  out.insert(out.end(), mac.begin(), mac.end());
  return out;
}

MacVerdict check_chunk_mac(std::span<const std::uint8_t> key, std::uint32_t rank,
                           std::span<const std::uint8_t> file) {
  if (!is_sealed(file)) return MacVerdict::Missing;
  if (file.size() < kMinChunk + kMacSize) return MacVerdict::Truncated;
  const auto body = file.first(file.size() - kMacSize);
  Trailer trailer{};
  std::memcpy(trailer.data(), file.data() + body.size(), kMacSize);
  ChunkMacCheck check(key, rank, raw_version(file), trailer);
  check.update(body);
  return check.matches() ? MacVerdict::Ok : MacVerdict::Mismatch;
}

Result<std::string> seal_manifest(std::span<const std::uint8_t> key, std::string_view manifest) {
  auto value = parse_strict_json(manifest, kMaxManifestBytes);
  if (!value) return value.error();
  if (!value->is_object()) return make_error(Reason::BadJson, "manifest is not a JSON object");
  value->erase(kManifestMac);
  auto body = canonical_json(*value);
  if (!body) return body.error();
  (*value)[kManifestMac] = hex(text_mac(key, *body));
  return canonical_json(*value);
}

Result<std::string> open_manifest(std::span<const std::uint8_t> key, std::string_view bytes) {
  auto value = parse_strict_json(bytes, kMaxManifestBytes);
  if (!value) return value.error();
  if (!value->is_object()) return make_error(Reason::BadField, "manifest is not an object");
  const auto it = value->find(kManifestMac);
  if (it == value->end()) return make_error(Reason::MacMissing, "manifest has no mac; the store is keyed");
  // Anything but 64 lowercase hex digits is no MAC of ours (issue 45).
  if (!it->is_string() || it->get_ref<const std::string&>().size() != 2 * kMacSize ||
      it->get_ref<const std::string&>().find_first_not_of("0123456789abcdef") != std::string::npos)
    return make_error(Reason::MacMismatch, "manifest mac is not 64 lowercase hex digits");
  const std::string stored = it->get<std::string>();
  value->erase(it);
  auto body = canonical_json(*value);
  if (!body) return body.error();
  const std::string want = hex(text_mac(key, *body));
  // Constant time over the hex, as kvstore's check (mac_check.cpp) compares.
  if (CRYPTO_memcmp(want.data(), stored.data(), want.size()) != 0)
    return make_error(Reason::MacMismatch, "manifest mac differs");
  return std::move(*body);
}

}  // namespace kvformat
