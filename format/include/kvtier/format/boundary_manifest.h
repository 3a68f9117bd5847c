// Boundary manifest, format v1/v2 (FORMAT.md section 5; same structure): canonical JSON naming,
// per group, the chunks a boundary needs as [key, payload length, checksum].
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/format/format_error.h"

namespace kvformat {

inline constexpr std::string_view kManifestKind = "boundary_manifest";
inline constexpr std::size_t kMaxChainLength = std::size_t{1} << 18;
inline constexpr std::size_t kMaxManifestGroups = 1024;
inline constexpr std::size_t kMaxManifestBytes = std::size_t{64} << 20;

enum class GroupKind { Full, State };
std::string_view group_kind_name(GroupKind kind);  // "full", "state"

struct ManifestEntry {
  std::string key;  // lowercase hex of the chunk key hash
  std::uint64_t length = 0;
  std::uint32_t checksum = 0;
  bool operator==(const ManifestEntry&) const = default;
};

struct ManifestGroup {
  std::uint32_t group = 0;
  GroupKind kind = GroupKind::Full;
  std::vector<ManifestEntry> entries;
  bool operator==(const ManifestGroup&) const = default;
};

struct BoundaryManifest {
  std::string ns;  // full namespace hash, 64 lowercase hex
  std::uint32_t rank = 0;
  std::uint64_t boundary = 0;
  std::uint64_t chunk_tokens = 0;
  std::vector<std::string> chain;  // chunk key hashes, token 0 to the boundary
  std::vector<ManifestGroup> groups;
  std::uint16_t format = 2;  // 1 or 2; 2 = kFormatVersion (header.h), what writers write

  const std::string& tip() const { return chain.back(); }
  std::string file_name() const;  // b<boundary>_<tip>.json
  bool operator==(const BoundaryManifest&) const = default;
};

// Canonical JSON bytes with the checksum filled in; fails if it would not parse.
Result<std::string> encode_manifest(const BoundaryManifest& manifest);

// Parses and checks a manifest file's bytes (FORMAT.md 5, reader order).
// Bytes in the canonical layout writers produce take a scanner that needs no
// JSON tree; everything else goes through parse_manifest_json.
Result<BoundaryManifest> parse_manifest(std::string_view bytes);

// The general path alone: a JSON parser, then the checks in reader order.
// Tests hold parse_manifest to the same verdicts.
Result<BoundaryManifest> parse_manifest_json(std::string_view bytes);

// A manifest from the JSON of its fields as an encoder is given them: the
// file's object without "checksum" (and "mac"), in any layout. Judged as a
// reader judges a file (format, checksum_algorithm, the fields, the
// structure), with no checksum to compare; encode_manifest then writes it.
Result<BoundaryManifest> parse_manifest_fields(std::string_view fields);

// A keyed store's manifest (FORMAT.md 3.6): its "mac" (64 hex, unchecked)
// and the canonical JSON of the rest, which is what the MAC covers and what
// parse_manifest then judges. nullopt for a manifest without "mac" (the
// bytes are parsed as they are); bad_json / bad_field when "mac" is there
// but the file is not a JSON object or the field not 64 lowercase hex.
struct SealedManifest {
  std::string body;
  std::string mac;
};
Result<std::optional<SealedManifest>> split_manifest_mac(std::string_view bytes);

}  // namespace kvformat
