// Canonical JSON (FORMAT.md 4.1): sorted keys, no whitespace, ASCII escapes,
// integers only. The namespace hash and the manifest checksum are computed over
// it, so it must match Python's json.dumps(sort_keys=True, separators=(",", ":"),
// ensure_ascii=True) byte for byte.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvtier/format/format_error.h"

namespace kvformat {

// Fails with BadJson on floats or integers outside [-2^63, 2^63-1].
Result<std::string> canonical_json(const nlohmann::json& value);

// Strict parse: UTF-8, no BOM, no duplicate keys, no floats/NaN, at most
// `limit` bytes. Any failure is BadJson.
Result<nlohmann::json> parse_strict_json(std::string_view text, std::size_t limit);

}  // namespace kvformat
