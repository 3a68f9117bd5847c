#include "kvtier/format/boundary_manifest.h"

#include <cstdio>
#include <set>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "canonical_manifest.h"
#include "kvtier/format/canonical_json.h"
#include "kvtier/format/crc32.h"
#include "kvtier/format/header.h"
#include "json_fields.h"
#include "kvtier/format/layout.h"

namespace kvformat {
namespace {

using nlohmann::json;

const std::set<std::string> kBodyKeys = {"boundary", "chain",  "checksum_algorithm",
                                         "chunk_tokens", "format", "groups",
                                         "kind",     "namespace", "rank"};

Error bad_field(std::string message) { return make_error(Reason::BadField, std::move(message)); }
Error inconsistent(std::string message) {
  return make_error(Reason::ManifestInconsistent, std::move(message));
}

bool is_hex64(const json& v) {
  if (!v.is_string()) return false;
  const auto& s = v.get_ref<const std::string&>();
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

bool is_key(const json& v) { return v.is_string() && is_key_hex(v.get_ref<const std::string&>()); }

std::string range(const char* name, std::int64_t low, std::int64_t high) {
  return std::string(name) + " must be an integer in [" + std::to_string(low) + ", " +
         std::to_string(high) + "]";
}

// FORMAT.md 5's field checks (bad_field), before the structure rules
// (check_manifest_structure), in the same order as the Python codec so a
// broken file gets one verdict.
Result<void> check_fields(const json& body) {
  std::set<std::string> keys;
  for (auto it = body.begin(); it != body.end(); ++it)
    if (it.key() != "checksum") keys.insert(it.key());
  if (keys != kBodyKeys) return bad_field("manifest fields: missing or unknown keys");
  if (body["kind"] != kManifestKind) return bad_field("kind must be boundary_manifest");
  if (!is_hex64(body["namespace"])) return bad_field("namespace must be 64 lowercase hex");
  constexpr auto kMaxTok = static_cast<std::int64_t>(kMaxTokenIndex);
  if (!json_int_in(body, "rank", 0, kMaxRank)) return bad_field(range("rank", 0, kMaxRank));
  if (!json_int_in(body, "boundary", 1, kMaxTok)) return bad_field(range("boundary", 1, kMaxTok));
  if (!json_int_in(body, "chunk_tokens", 1, kMaxTok))
    return bad_field(range("chunk_tokens", 1, kMaxTok));
  const json& chain = body["chain"];
  if (!chain.is_array() || chain.empty() || chain.size() > kMaxChainLength)
    return bad_field("chain must be a non-empty list");
  for (const auto& key : chain)
    if (!is_key(key)) return bad_field("chain key is not key hex");
  const json& groups = body["groups"];
  if (!groups.is_array() || groups.empty() || groups.size() > kMaxManifestGroups)
    return bad_field("groups must be a non-empty list");
  for (const auto& g : groups) {
    if (!g.is_object() || g.size() != 3 || !g.contains("entries") || !g.contains("group") ||
        !g.contains("kind"))
      return bad_field("group must be {entries, group, kind}");
    if (!json_int_in(g, "group", 0, kMaxGroupIndex))
      return bad_field("groups[]." + range("group", 0, kMaxGroupIndex));
    if (g["kind"] != "full" && g["kind"] != "state") return bad_field("group kind");
    const json& entries = g["entries"];
    if (!entries.is_array() || entries.size() > kMaxChainLength)
      return bad_field("entries must be a list");
    for (const auto& e : entries) {
      if (!e.is_array() || e.size() != 3 || !is_key(e[0]))
        return bad_field("entry must be [key hex, length, checksum]");
      const auto length = json_int(e[1]);
      const auto checksum = json_int(e[2]);
      if (!length || *length < 1 || *length > static_cast<std::int64_t>(kMaxPayloadLength) ||
          !checksum || *checksum < 0 || *checksum > 0xFFFFFFFFll)
        return bad_field("entry must be [key hex, length, checksum]");
    }
  }
  return {};
}

json to_body(const BoundaryManifest& m) {
  json groups = json::array();
  for (const ManifestGroup& g : m.groups) {
    json entries = json::array();
    for (const ManifestEntry& e : g.entries) entries.push_back({e.key, e.length, e.checksum});
    groups.push_back({{"entries", entries}, {"group", g.group}, {"kind", group_kind_name(g.kind)}});
  }
  return json{{"boundary", m.boundary},
              {"chain", m.chain},
              {"checksum_algorithm", kChecksumCrc32},
              {"chunk_tokens", m.chunk_tokens},
              {"format", m.format},
              {"groups", groups},
              {"kind", kManifestKind},
              {"namespace", m.ns},
              {"rank", m.rank}};
}

Result<std::uint32_t> body_crc(const json& body) {
  auto text = canonical_json(body);
  if (!text) return text.error();
  return crc32(std::span(reinterpret_cast<const std::uint8_t*>(text->data()), text->size()));
}

// FORMAT.md 5's reader order up to the checksum: format, then the algorithm.
Result<std::uint16_t> judge_version(const json& value) {
  const auto version = value.contains("format") ? json_int(value["format"]) : std::nullopt;
  if (!version) return bad_field("format missing");
  if (*version < 0 || !readable_version(static_cast<std::uint64_t>(*version)))
    return make_error(Reason::UnsupportedVersion, "format version " + std::to_string(*version));
  const auto algorithm =
      value.contains("checksum_algorithm") ? json_int(value["checksum_algorithm"]) : std::nullopt;
  if (!algorithm) return bad_field("checksum_algorithm missing");
  if (*algorithm != kChecksumCrc32)
    return make_error(Reason::UnsupportedChecksumAlgorithm,
                      "checksum algorithm " + std::to_string(*algorithm));
  return static_cast<std::uint16_t>(*version);
}

// A body whose format, algorithm and checksum were judged: the field checks,
// then the manifest they describe, then its structure.
Result<BoundaryManifest> from_body(const json& value, std::uint16_t version) {
  if (auto r = check_fields(value); !r) return r.error();
  BoundaryManifest m;
  m.format = version;
  m.ns = value["namespace"].get<std::string>();
  m.rank = static_cast<std::uint32_t>(*json_int(value["rank"]));
  m.boundary = static_cast<std::uint64_t>(*json_int(value["boundary"]));
  m.chunk_tokens = static_cast<std::uint64_t>(*json_int(value["chunk_tokens"]));
  for (const auto& key : value["chain"]) m.chain.push_back(key.get<std::string>());
  for (const auto& g : value["groups"]) {
    ManifestGroup group;
    group.group = static_cast<std::uint32_t>(*json_int(g["group"]));
    group.kind = g["kind"] == "full" ? GroupKind::Full : GroupKind::State;
    for (const auto& e : g["entries"])
      group.entries.push_back(ManifestEntry{e[0].get<std::string>(),
                                            static_cast<std::uint64_t>(*json_int(e[1])),
                                            static_cast<std::uint32_t>(*json_int(e[2]))});
    m.groups.push_back(std::move(group));
  }
  if (auto r = check_manifest_structure(m); !r) return r.error();
  return m;
}

}  // namespace

std::string_view group_kind_name(GroupKind kind) {
  return kind == GroupKind::Full ? "full" : "state";
}

std::string BoundaryManifest::file_name() const {
  auto name = manifest_file_name(boundary, chain.empty() ? std::string() : chain.back());
  return name ? *name : std::string();
}

Result<std::string> encode_manifest(const BoundaryManifest& m) {
  if (!readable_version(m.format))
    return make_error(Reason::UnsupportedVersion, "format version " + std::to_string(m.format));
  json body = to_body(m);
  if (auto r = check_fields(body); !r) return r.error();
  if (auto r = check_manifest_structure(m); !r) return r.error();
  auto crc = body_crc(body);
  if (!crc) return crc.error();
  body["checksum"] = hex8(*crc);
  return canonical_json(body);
}

Result<BoundaryManifest> parse_manifest(std::string_view bytes) {
  if (auto m = parse_canonical_manifest(bytes)) return std::move(*m);
  return parse_manifest_json(bytes);
}

Result<BoundaryManifest> parse_manifest_json(std::string_view bytes) {
  auto parsed = parse_strict_json(bytes, kMaxManifestBytes);
  if (!parsed) return parsed.error();
  json& value = *parsed;
  if (!value.is_object()) return bad_field("manifest must be an object");
  const auto version = judge_version(value);
  if (!version) return version.error();
  std::string stored;
  if (auto it = value.find("checksum"); it != value.end() && it->is_string())
    stored = it->get<std::string>();
  value.erase("checksum");
  if (stored.size() != 8 || stored.find_first_not_of("0123456789abcdef") != std::string::npos)
    return bad_field("checksum must be 8 lowercase hex");
  auto crc = body_crc(value);
  if (!crc) return crc.error();
  if (hex8(*crc) != stored)
    return make_error(Reason::ManifestChecksumMismatch,
                      "manifest checksum " + stored + ", computed " + hex8(*crc));
  return from_body(value, *version);
}

Result<BoundaryManifest> parse_manifest_fields(std::string_view fields) {
  auto parsed = parse_strict_json(fields, kMaxManifestBytes);
  if (!parsed) return parsed.error();
  const json& value = *parsed;
  if (!value.is_object()) return bad_field("manifest must be an object");
  if (value.contains("checksum") || value.contains("mac"))
    return bad_field("a manifest's fields carry no checksum and no mac: the encoder adds them");
  const auto version = judge_version(value);
  if (!version) return version.error();
  return from_body(value, *version);
}

Result<void> check_manifest_structure(const BoundaryManifest& m) {
  // Both are <= 2^40 and chain.size() <= 2^18, so the product cannot overflow.
  if (m.boundary != m.chain.size() * m.chunk_tokens) return inconsistent("boundary != len(chain) x chunk_tokens");
  // Keys chain (each hashes its parent), so a repeat is a writer bug; a
  // restore would load the same chunk at two positions.
  std::unordered_set<std::string_view> seen;
  seen.reserve(m.chain.size());
  for (const auto& key : m.chain)
    if (!seen.insert(key).second) return inconsistent("chain repeats a key");
  std::int64_t last = -1;
  for (const auto& g : m.groups) {
    if (static_cast<std::int64_t>(g.group) <= last) return inconsistent("groups not ascending");
    last = g.group;
    if (g.kind == GroupKind::Full) {
      bool same = g.entries.size() == m.chain.size();
      for (std::size_t i = 0; same && i < g.entries.size(); ++i) same = g.entries[i].key == m.chain[i];
      if (!same)
        return inconsistent("full group " + std::to_string(g.group) + ": entries must be the chain, in order");
    } else if (g.entries.size() != 1 || g.entries[0].key != m.chain.back()) {
      return inconsistent("state group " + std::to_string(g.group) + ": one entry, the chain tip");
    }
  }
  return {};
}

Result<std::optional<SealedManifest>> split_manifest_mac(std::string_view bytes) {
  // A manifest's keys and hex never spell "mac" by accident: only a sealed
  // one pays the second parse. A key may also be spelled with escapes
  // ("\u006dac"): any backslash takes the strict parse too, so this reader
  // finds the "mac" the Python codec's json finds (issue 45).
  if (bytes.find("\"mac\"") == std::string_view::npos && bytes.find('\\') == std::string_view::npos)
    return std::optional<SealedManifest>{};
  auto parsed = parse_strict_json(bytes, kMaxManifestBytes);
  if (!parsed) return parsed.error();
  json& value = *parsed;
  if (!value.is_object()) return bad_field("manifest must be an object");
  auto it = value.find("mac");
  if (it == value.end()) return std::optional<SealedManifest>{};
  if (!it->is_string()) return bad_field("mac must be 64 lowercase hex");
  SealedManifest out;
  out.mac = it->get<std::string>();
  if (out.mac.size() != 64 || out.mac.find_first_not_of("0123456789abcdef") != std::string::npos)
    return bad_field("mac must be 64 lowercase hex");
  value.erase(it);
  auto body = canonical_json(value);
  if (!body) return body.error();
  out.body = std::move(*body);
  return std::optional<SealedManifest>{std::move(out)};
}

}  // namespace kvformat
