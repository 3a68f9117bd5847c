// Namespace record, format v1 (FORMAT.md section 4): {"fenced", "info"} JSON
// beside the rank base. The namespace hash is sha256 of canonical(fenced).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvtier/format/format_error.h"
#include "sha256.h"

namespace kvformat {

// The digest type of the shared SHA-256 (common/sha256.h).
using kvtier::Sha256Digest;

inline constexpr std::size_t kMaxRecordBytes = std::size_t{1} << 20;
inline constexpr std::size_t kNsShortHex = 16;

struct NamespaceRecord {
  nlohmann::json fenced;  // compared exactly, hashed
  nlohmann::json info;    // diagnostics, never compared
};

// Checks the fenced fields' presence, types and ranges (extra keys allowed).
Result<void> check_fenced(const nlohmann::json& fenced);

// sha256(canonical_json(fenced)); fails only if fenced is not canonicalizable.
Result<Sha256Digest> namespace_hash(const nlohmann::json& fenced);

// First 16 hex digits: the <ns> part of a rank base name.
std::string namespace_short(const Sha256Digest& hash);

Result<std::string> encode_namespace_record(const NamespaceRecord& record);
Result<NamespaceRecord> parse_namespace_record(std::string_view bytes);

}  // namespace kvformat
