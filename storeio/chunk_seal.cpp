// The keyed-chunk calls of the C ABI (store_abi.h, ABI 5): a sealed chunk
// opened under its MAC, a plain one sealed (FORMAT.md 3.6), through
// kvformat_mac.
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "abi_result.h"
#include "chunk_abi.h"
#include "kvtier/format/header.h"
#if KVTIER_STORE_HAVE_MAC
#include "kvtier/format/mac.h"
#endif
#include "kvtier/store_abi.h"

#if KVTIER_STORE_HAVE_MAC
namespace storeio {

std::variant<std::vector<std::uint8_t>, std::int32_t> open_sealed(
    std::span<const std::uint8_t> file, std::span<const std::uint8_t> key, std::uint32_t rank,
    kvtier_result* out, const char* path) {
  using kvformat::Reason;
  const auto fail = [&](Reason reason, std::string text) {
    return result_error(out, kvformat::make_error(reason, std::move(text)), path);
  };
  switch (kvformat::check_chunk_mac(key, rank, file)) {
    case kvformat::MacVerdict::Ok:
      break;
    case kvformat::MacVerdict::Missing:
      return fail(Reason::MacMissing, "chunk has no MAC; the store is keyed");
    case kvformat::MacVerdict::Truncated:
      return fail(Reason::Truncated, std::to_string(file.size()) + " bytes, too short for a MAC");
    case kvformat::MacVerdict::Mismatch: {
      const auto version = kvformat::raw_version(file);
      if (version != kvformat::kSealedVersion && !kvformat::readable_version(version))
        return fail(Reason::MacMismatch, "sealed chunk of format version " +
                                             std::to_string(version) + ": no MAC this reader knows");
      return fail(Reason::MacMismatch, "chunk MAC differs");
    }
  }
  std::vector<std::uint8_t> plain(file.begin(), file.end() - kvformat::kMacSize);
  if (!kvformat::unseal_header(plain)) return fail(Reason::BadHeaderLength, "header length");
  return plain;
}

}  // namespace storeio
#endif

using storeio::result_bad_argument;
using storeio::result_error;
using storeio::result_ok;
using storeio::run_call;

extern "C" {

int32_t kvtier_open_chunk(const uint8_t* file, size_t length, const uint8_t* mac_key,
                          uint32_t mac_key_length, uint32_t mac_rank, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (!file && length) return result_bad_argument(out, "input is NULL with a nonzero length");
    if (!mac_key || !mac_key_length) return result_bad_argument(out, "no key");
#if KVTIER_STORE_HAVE_MAC
    auto plain = storeio::open_sealed({file, length}, {mac_key, mac_key_length}, mac_rank, out,
                                      nullptr);
    if (auto* status = std::get_if<std::int32_t>(&plain)) return *status;
    const auto& bytes = std::get<std::vector<std::uint8_t>>(plain);
    return result_ok(out, {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
#else
    (void)mac_rank;
    return result_bad_argument(out, "a keyed store, and this library was built without OpenSSL");
#endif
  });
}

int32_t kvtier_seal_chunk(const uint8_t* chunk, size_t length, const uint8_t* mac_key,
                          uint32_t mac_key_length, uint32_t mac_rank, const uint8_t* salt,
                          uint32_t flags, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (!chunk && length) return result_bad_argument(out, "input is NULL with a nonzero length");
    if (!mac_key || !mac_key_length) return result_bad_argument(out, "no key");
    if (flags & ~KVTIER_SEAL_V2) return result_bad_argument(out, "unknown flags");
#if KVTIER_STORE_HAVE_MAC
    const std::span<const std::uint8_t> key(mac_key, mac_key_length);
    std::vector<std::uint8_t> sealed;
    if (flags & KVTIER_SEAL_V2) {
      sealed = kvformat::seal_chunk_v2(key, {chunk, length});
    } else {
      kvformat::Salt chosen{};
      if (salt) {
        std::memcpy(chosen.data(), salt, chosen.size());
      } else if (auto drawn = kvformat::random_salt()) {
        chosen = *drawn;
      } else {
        return storeio::result_failure(out, KVTIER_E_IO, "io_error", 0, nullptr,
                                       "no random salt from libcrypto: nothing sealed");
      }
      sealed = kvformat::seal_chunk(key, mac_rank, chosen, {chunk, length});
    }
    if (sealed.empty())
      return result_error(out, kvformat::make_error(kvformat::Reason::BadHeaderLength,
                                                    "the bytes cannot hold their header"));
    return result_ok(out, {reinterpret_cast<const char*>(sealed.data()), sealed.size()});
#else
    (void)mac_rank;
    (void)salt;
    return result_bad_argument(out, "a keyed store, and this library was built without OpenSSL");
#endif
  });
}

}  // extern "C"
