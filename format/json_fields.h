// Small typed accessors over nlohmann::json shared by the manifest and the
// namespace record parsers (integers only: floats never reach here).
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

namespace kvformat {

// The value as int64 if it is a JSON integer (not a bool) that fits.
inline std::optional<std::int64_t> json_int(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<std::int64_t>();
  return std::nullopt;
}

// An integer member of `obj` within [low, high], else nullopt (missing too).
inline std::optional<std::int64_t> json_int_in(const nlohmann::json& obj, const char* name,
                                               std::int64_t low, std::int64_t high) {
  const auto it = obj.find(name);
  if (it == obj.end()) return std::nullopt;
  const auto v = json_int(*it);
  if (!v || *v < low || *v > high) return std::nullopt;
  return v;
}

}  // namespace kvformat
