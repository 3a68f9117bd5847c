#include "kvtier/format/pending_record.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "json_fields.h"
#include "kvtier/format/canonical_json.h"
#include "kvtier/format/header.h"
#include "kvtier/format/layout.h"

namespace kvformat {
namespace {

using nlohmann::json;

Error bad_field(std::string message) { return make_error(Reason::BadField, std::move(message)); }

Result<std::vector<PendingChunk>> check_body(const json& body) {
  if (body.size() != 3 || !body.contains("chunks") || !body.contains("kind") || body["kind"] != kPendingKind)
    return bad_field("pending record must be {chunks, format, kind}");
  const json& chunks = body["chunks"];
  if (!chunks.is_array() || chunks.size() > kMaxPendingChunks) return bad_field("chunks must be a list");
  std::vector<PendingChunk> out;
  out.reserve(chunks.size());
  for (const auto& c : chunks) {
    if (!c.is_array() || c.size() != 2 || !c[1].is_string()) return bad_field("chunk must be [group, key hex]");
    const auto group = json_int(c[0]);
    const auto& key = c[1].get_ref<const std::string&>();
    if (!group || *group < 0 || *group > kMaxGroupIndex || !is_key_hex(key))
      return bad_field("chunk must be [group, key hex]");
    out.push_back({static_cast<std::uint32_t>(*group), key});
    // FORMAT.md 9.1: sorted by (group, key), each once.
    if (out.size() > 1 && !(out[out.size() - 2] < out.back()))
      return bad_field("chunks must be sorted by (group, key), each once");
  }
  return out;
}

}  // namespace

Result<std::string> encode_pending_record(std::vector<PendingChunk> chunks) {
  std::sort(chunks.begin(), chunks.end());
  chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
  json list = json::array();
  for (const auto& c : chunks) list.push_back({c.group, c.key});
  json body{{"chunks", std::move(list)}, {"format", kPendingFormatVersion}, {"kind", kPendingKind}};
  if (auto r = check_body(body); !r) return r.error();
  return canonical_json(body);
}

Result<std::vector<PendingChunk>> parse_pending_record(std::string_view bytes) {
  auto parsed = parse_strict_json(bytes, kMaxPendingBytes);
  if (!parsed) return parsed.error();
  const json& value = *parsed;
  if (!value.is_object()) return bad_field("pending record must be an object");
  const auto version = value.contains("format") ? json_int(value["format"]) : std::nullopt;
  if (!version) return bad_field("format missing");
  if (*version != kPendingFormatVersion)
    return make_error(Reason::UnsupportedVersion, "format version " + std::to_string(*version));
  return check_body(value);
}

}  // namespace kvformat
