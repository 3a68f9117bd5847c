#include "kvtier/format/namespace_record.h"

#include "kvtier/format/canonical_json.h"
#include "kvtier/format/header.h"
#include "json_fields.h"
#include "kvtier/format/layout.h"

namespace kvformat {
namespace {

using nlohmann::json;

Error bad_field(std::string message) { return make_error(Reason::BadField, std::move(message)); }

}  // namespace

Result<void> check_fenced(const json& fenced) {
  if (!fenced.is_object()) return bad_field("fenced must be an object");
  const auto version =
      fenced.contains("format_version") ? json_int(fenced["format_version"]) : std::nullopt;
  if (!version) return bad_field("fenced.format_version missing");
  if (*version < 0 || !readable_version(static_cast<std::uint64_t>(*version)))
    return make_error(Reason::UnsupportedVersion, "format version " + std::to_string(*version));
  for (const char* name : {"model", "vllm_version", "build_id", "kv_dtype", "hash_algorithm"}) {
    const auto it = fenced.find(name);
    if (it == fenced.end() || !it->is_string() || it->get_ref<const std::string&>().size() > 256)
      return bad_field(std::string("fenced.") + name + " must be a string");
    if (std::string_view(name) != "build_id" && it->get_ref<const std::string&>().empty())
      return bad_field(std::string("fenced.") + name + " is empty");
  }
  if (!json_int_in(fenced, "tp_size", 1, kMaxRank + 1))
    return bad_field("fenced.tp_size must be an integer in [1, 65536]");
  if (!json_int_in(fenced, "num_speculative_tokens", 0, 1024))
    return bad_field("fenced.num_speculative_tokens must be an integer in [0, 1024]");
  const auto pages = fenced.find("page_sizes");
  if (pages == fenced.end() || !pages->is_array() || pages->empty() || pages->size() > 1024)
    return bad_field("fenced.page_sizes must be a list");
  std::int64_t last = -1;
  for (const auto& pair : *pages) {
    std::optional<std::int64_t> g, bytes;
    if (pair.is_array() && pair.size() == 2) {
      g = json_int(pair[0]);
      bytes = json_int(pair[1]);
    }
    if (!g || !bytes || *g <= last || *g > kMaxGroupIndex || *bytes < 1 ||
        *bytes > static_cast<std::int64_t>(kMaxPayloadLength))
      return bad_field("fenced.page_sizes: [[group, bytes], ...] with groups ascending");
    last = *g;
  }
  const auto abi = fenced.find("state_abi");
  if (abi == fenced.end() || !abi->is_object()) return bad_field("fenced.state_abi must be an object");
  return {};
}

Result<Sha256Digest> namespace_hash(const json& fenced) {
  auto text = canonical_json(fenced);
  if (!text) return text.error();
  return kvtier::sha256(std::span(reinterpret_cast<const std::uint8_t*>(text->data()), text->size()));
}

std::string namespace_short(const Sha256Digest& hash) { return to_hex(hash).substr(0, kNsShortHex); }

Result<std::string> encode_namespace_record(const NamespaceRecord& record) {
  if (auto r = check_fenced(record.fenced); !r) return r.error();
  if (!record.info.is_object()) return bad_field("info must be an object");
  return canonical_json(json{{"fenced", record.fenced}, {"info", record.info}});
}

Result<NamespaceRecord> parse_namespace_record(std::string_view bytes) {
  auto parsed = parse_strict_json(bytes, kMaxRecordBytes);
  if (!parsed) return parsed.error();
  const json& value = *parsed;
  if (!value.is_object() || value.size() != 2 || !value.contains("fenced") ||
      !value.contains("info"))
    return bad_field(R"(record must be {"fenced", "info"})");
  if (!value["info"].is_object()) return bad_field("info must be an object");
  if (auto r = check_fenced(value["fenced"]); !r) return r.error();
  return NamespaceRecord{value["fenced"], value["info"]};
}

}  // namespace kvformat
