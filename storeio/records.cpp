// The record calls of the C ABI (store_abi.h, ABI 5): manifests, namespace
// and pending records, canonical JSON, keep-K and the key's id, each one
// format/ call between JSON text and a kvtier_result, so the overlays run no
// codec of their own.
#include <cerrno>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "abi_result.h"
#include "kvtier/format/boundary_manifest.h"
#include "kvtier/format/canonical_json.h"
#include "kvtier/format/header.h"
#include "kvtier/format/namespace_record.h"
#include "kvtier/format/pending_record.h"
#include "kvtier/format/retention.h"
#if KVTIER_STORE_HAVE_MAC
#include "kvtier/format/mac.h"
#endif
#include "kvtier/store_abi.h"

namespace storeio {
namespace {

using nlohmann::json;

// The largest JSON a call takes: a manifest's limit (FORMAT.md 5).
constexpr std::size_t kMaxInput = kvformat::kMaxManifestBytes;

std::string_view text_of(const void* data, std::size_t length) {
  return {static_cast<const char*>(data), length};
}

// Refusals of a call's own arguments (never of the bytes it judges).
std::optional<std::int32_t> missing_input(kvtier_result* out, const void* data, std::size_t length) {
  if (!data && length) return result_bad_argument(out, "input is NULL with a nonzero length");
  return std::nullopt;
}

std::optional<std::int32_t> key_problem(kvtier_result* out, const std::uint8_t* key,
                                        std::uint32_t length, bool required) {
  if (!key) {
    if (required) return result_bad_argument(out, "no key");
    return std::nullopt;
  }
  if (length == 0) return result_bad_argument(out, "an empty key");
#if KVTIER_STORE_HAVE_MAC
  return std::nullopt;
#else
  return result_bad_argument(out, "a keyed store, and this library was built without OpenSSL");
#endif
}

// A group as a pending record holds it: a JSON integer in [0, 1023].
std::optional<std::uint32_t> group_of(const json& v) {
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= kvformat::kMaxGroupIndex)
    return static_cast<std::uint32_t>(v.get<std::uint64_t>());
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0 &&
      v.get<std::int64_t>() <= kvformat::kMaxGroupIndex)
    return static_cast<std::uint32_t>(v.get<std::int64_t>());
  return std::nullopt;
}

#if KVTIER_STORE_HAVE_MAC
std::span<const std::uint8_t> key_span(const std::uint8_t* key, std::uint32_t length) {
  return {key, length};
}
#endif

}  // namespace
}  // namespace storeio

using storeio::result_bad_argument;
using storeio::result_error;
using storeio::result_ok;
using storeio::run_call;
using nlohmann::json;

extern "C" {

int32_t kvtier_manifest_encode(const char* fields, size_t length, const uint8_t* mac_key,
                               uint32_t mac_key_length, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::missing_input(out, fields, length)) return *r;
    if (auto r = storeio::key_problem(out, mac_key, mac_key_length, false)) return *r;
    auto manifest = kvformat::parse_manifest_fields(storeio::text_of(fields, length));
    if (!manifest) return result_error(out, manifest.error());
    auto text = kvformat::encode_manifest(*manifest);
    if (!text) return result_error(out, text.error());
#if KVTIER_STORE_HAVE_MAC
    if (mac_key) {
      auto sealed = kvformat::seal_manifest(storeio::key_span(mac_key, mac_key_length), *text);
      if (!sealed) return result_error(out, sealed.error());
      return result_ok(out, *sealed);
    }
#endif
    return result_ok(out, *text);
  });
}

int32_t kvtier_manifest_decode(const uint8_t* bytes, size_t length, const uint8_t* mac_key,
                               uint32_t mac_key_length, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::missing_input(out, bytes, length)) return *r;
    if (auto r = storeio::key_problem(out, mac_key, mac_key_length, false)) return *r;
    std::string_view text = storeio::text_of(bytes, length);
    std::string opened;
#if KVTIER_STORE_HAVE_MAC
    // The MAC before anything else of the file is used (FORMAT.md 3.6).
    if (mac_key) {
      auto body = kvformat::open_manifest(storeio::key_span(mac_key, mac_key_length), text);
      if (!body) return result_error(out, body.error());
      opened = std::move(*body);
      text = opened;
    }
#endif
    auto manifest = kvformat::parse_manifest(text);
    if (!manifest) return result_error(out, manifest.error());
    auto canonical = kvformat::encode_manifest(*manifest);
    if (!canonical) return result_error(out, canonical.error());
    return result_ok(out, *canonical);
  });
}

int32_t kvtier_namespace_record_encode(const char* record, size_t length, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::missing_input(out, record, length)) return *r;
    auto value = kvformat::parse_strict_json(storeio::text_of(record, length), storeio::kMaxInput);
    if (!value) return result_error(out, value.error());
    if (!value->is_object() || !value->contains("fenced") || !value->contains("info") ||
        value->size() != 2)
      return result_bad_argument(out, R"(a record to encode is {"fenced": ..., "info": ...})");
    auto text = kvformat::encode_namespace_record({(*value)["fenced"], (*value)["info"]});
    if (!text) return result_error(out, text.error());
    return result_ok(out, *text);
  });
}

int32_t kvtier_namespace_record_decode(const uint8_t* bytes, size_t length, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::missing_input(out, bytes, length)) return *r;
    auto record = kvformat::parse_namespace_record(storeio::text_of(bytes, length));
    if (!record) return result_error(out, record.error());
    auto text = kvformat::encode_namespace_record(*record);
    if (!text) return result_error(out, text.error());
    return result_ok(out, *text);
  });
}

int32_t kvtier_namespace_hash(const char* fenced, size_t length, uint32_t flags, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::missing_input(out, fenced, length)) return *r;
    if (flags & ~KVTIER_FENCED_CHECK) return result_bad_argument(out, "unknown flags");
    auto value = kvformat::parse_strict_json(storeio::text_of(fenced, length), storeio::kMaxInput);
    if (!value) return result_error(out, value.error());
    if (flags & KVTIER_FENCED_CHECK) {
      if (auto r = kvformat::check_fenced(*value); !r) return result_error(out, r.error());
    }
    auto hash = kvformat::namespace_hash(*value);
    if (!hash) return result_error(out, hash.error());
    return result_ok(out, storeio::text_of(hash->data(), hash->size()));
  });
}

int32_t kvtier_canonical_json(const char* text, size_t length, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::missing_input(out, text, length)) return *r;
    auto value = kvformat::parse_strict_json(storeio::text_of(text, length), storeio::kMaxInput);
    if (!value) return result_error(out, value.error());
    auto canonical = kvformat::canonical_json(*value);
    if (!canonical) return result_error(out, canonical.error());
    return result_ok(out, *canonical);
  });
}

int32_t kvtier_pending_record_encode(const char* chunks, size_t length, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::missing_input(out, chunks, length)) return *r;
    auto value = kvformat::parse_strict_json(storeio::text_of(chunks, length),
                                             kvformat::kMaxPendingBytes);
    if (!value) return result_error(out, value.error());
    if (!value->is_array()) return result_bad_argument(out, "chunks to list are a JSON array");
    if (value->size() > kvformat::kMaxPendingChunks)
      return result_error(out, kvformat::make_error(kvformat::Reason::BadField,
                                                    "more chunks than a pending record holds"));
    std::vector<kvformat::PendingChunk> list;
    list.reserve(value->size());
    for (const auto& c : *value) {
      const auto group = c.is_array() && c.size() == 2 ? storeio::group_of(c[0]) : std::nullopt;
      if (!group || !c[1].is_string())
        return result_error(out, kvformat::make_error(kvformat::Reason::BadField,
                                                      "chunk must be [group, key hex]"));
      list.push_back({*group, c[1].get<std::string>()});
    }
    auto text = kvformat::encode_pending_record(std::move(list));
    if (!text) return result_error(out, text.error());
    return result_ok(out, *text);
  });
}

int32_t kvtier_pending_record_decode(const uint8_t* bytes, size_t length, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::missing_input(out, bytes, length)) return *r;
    auto chunks = kvformat::parse_pending_record(storeio::text_of(bytes, length));
    if (!chunks) return result_error(out, chunks.error());
    auto text = kvformat::encode_pending_record(std::move(*chunks));
    if (!text) return result_error(out, text.error());
    return result_ok(out, *text);
  });
}

int32_t kvtier_kept_manifests(const char* chains, size_t length, uint32_t keep, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::missing_input(out, chains, length)) return *r;
    // Lines of tab-separated fields, not JSON: a tree's chains are long, and
    // a JSON parse cost a publish five times the leaf walk itself.
    const std::string_view text = storeio::text_of(chains, length);
    if (!text.empty() && text.back() != '\n')
      return result_bad_argument(out, "chains end with a newline");
    std::vector<std::string> names;
    std::vector<std::vector<std::string>> keys;
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t end = text.find('\n', at);
      const std::string_view line = text.substr(at, end - at);
      at = end + 1;
      std::size_t field = line.find('\t');
      names.emplace_back(line.substr(0, field));
      auto& chain = keys.emplace_back();
      while (field != std::string_view::npos) {
        const std::size_t next = line.find('\t', field + 1);
        chain.emplace_back(line.substr(field + 1, next == std::string_view::npos ? next : next - field - 1));
        field = next;
      }
    }
    std::vector<std::span<const std::string>> views(keys.begin(), keys.end());
    auto kept = kvformat::kept_chains(views, keep);
    if (!kept) return result_error(out, kept.error());
    std::map<std::string_view, bool> by_name;  // ascending, each name once
    for (std::size_t i = 0; i < names.size(); ++i)
      if (!by_name.emplace(names[i], (*kept)[i]).second)
        return result_bad_argument(out, "a manifest named twice");
    std::string text_out;
    for (const auto& [name, keep_it] : by_name)
      if (keep_it) (text_out += name) += '\n';
    return result_ok(out, text_out);
  });
}

int32_t kvtier_mac_key_id(const uint8_t* mac_key, uint32_t mac_key_length, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (auto r = storeio::key_problem(out, mac_key, mac_key_length, true)) return *r;
#if KVTIER_STORE_HAVE_MAC
    return result_ok(out, kvformat::mac_key_id(storeio::key_span(mac_key, mac_key_length)));
#else
    return result_bad_argument(out, "built without OpenSSL");
#endif
  });
}

}  // extern "C"
