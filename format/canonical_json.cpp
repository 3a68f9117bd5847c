#include "kvtier/format/canonical_json.h"

#include <cstdint>
#include <set>
#include <vector>

namespace kvformat {
namespace {

using nlohmann::json;

// FORMAT.md 4.1: at most 64 arrays and objects open at once; scalars and
// keys add no level.
constexpr int kMaxDepth = 64;

// Decodes one UTF-8 code point at s[i]; returns false on malformed input.
bool next_code_point(const std::string& s, std::size_t& i, std::uint32_t& cp) {
  const auto b0 = static_cast<std::uint8_t>(s[i]);
  int extra;
  if (b0 < 0x80) {
    cp = b0;
    extra = 0;
  } else if ((b0 & 0xE0) == 0xC0) {
    cp = b0 & 0x1F;
    extra = 1;
  } else if ((b0 & 0xF0) == 0xE0) {
    cp = b0 & 0x0F;
    extra = 2;
  } else if ((b0 & 0xF8) == 0xF0) {
    cp = b0 & 0x07;
    extra = 3;
  } else {
    return false;
  }
  if (i + extra >= s.size()) return false;
  for (int k = 1; k <= extra; ++k) {
    const auto b = static_cast<std::uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (b & 0x3F);
  }
  static constexpr std::uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  i += extra + 1;
  return true;
}

void put_u4(std::string& out, std::uint32_t v) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(v >> shift) & 0xF];
}

Result<void> write_string(const std::string& s, std::string& out) {
  out += '"';
  std::size_t i = 0;
  while (i < s.size()) {
    std::uint32_t cp;
    if (!next_code_point(s, i, cp)) return make_error(Reason::BadJson, "string is not valid UTF-8");
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (cp < 0x20 || (cp >= 0x7F && cp <= 0xFFFF)) {
          put_u4(out, cp);
        } else if (cp > 0xFFFF) {
          const std::uint32_t v = cp - 0x10000;
          put_u4(out, 0xD800 + (v >> 10));
          put_u4(out, 0xDC00 + (v & 0x3FF));
        } else {
          out += static_cast<char>(cp);
        }
    }
  }
  out += '"';
  return {};
}

// `open`: the arrays and objects around v.
Result<void> write_value(const json& v, std::string& out, int open) {
  if ((v.is_array() || v.is_object()) && open >= kMaxDepth)
    return make_error(Reason::BadJson, "nesting deeper than 64");
  switch (v.type()) {
    case json::value_t::null: out += "null"; return {};
    case json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return {};
    case json::value_t::number_integer: out += std::to_string(v.get<std::int64_t>()); return {};
    case json::value_t::number_unsigned: {
      const auto u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX))
        return make_error(Reason::BadJson, "integer out of range");
      out += std::to_string(u);
      return {};
    }
    case json::value_t::number_float:
      return make_error(Reason::BadJson, "non-integer number");
    case json::value_t::string: return write_string(v.get_ref<const std::string&>(), out);
    case json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ',';
        first = false;
        if (auto r = write_value(item, out, open + 1); !r) return r;
      }
      out += ']';
      return {};
    }
    case json::value_t::object: {
      // nlohmann's default object is a std::map: keys already in byte order,
      // which for valid UTF-8 equals code point order (what Python sorts by).
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ',';
        first = false;
        if (auto r = write_string(it.key(), out); !r) return r;
        out += ':';
        if (auto r = write_value(it.value(), out, open + 1); !r) return r;
      }
      out += '}';
      return {};
    }
    default: return make_error(Reason::BadJson, "value type not allowed");
  }
}

// Nesting depth of the raw text, counted outside strings: the exact rule,
// checked before parsing so a hostile file cannot drive the parser deep.
bool depth_within_limit(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace

Result<std::string> canonical_json(const json& value) {
  std::string out;
  if (auto r = write_value(value, out, 0); !r) return r.error();
  return out;
}

Result<json> parse_strict_json(std::string_view text, std::size_t limit) {
  if (text.size() > limit)
    return make_error(Reason::BadJson,
                      std::to_string(text.size()) + " bytes, limit " + std::to_string(limit));
  if (text.starts_with("\xEF\xBB\xBF")) return make_error(Reason::BadJson, "byte-order mark");
  // nlohmann's lexer takes a NUL byte for the end of input and would accept
  // `{...}\0junk`; JSON allows NUL nowhere unescaped (Python: "Extra data").
  if (const auto nul = text.find('\0'); nul != std::string_view::npos)
    return make_error(Reason::BadJson, "NUL byte at offset " + std::to_string(nul));
  if (!depth_within_limit(text)) return make_error(Reason::BadJson, "nesting deeper than 64");
  std::vector<std::set<std::string>> keys;
  bool duplicate = false;
  json::parser_callback_t callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::key) {
      if (!keys.back().insert(parsed.get<std::string>()).second) duplicate = true;
    } else if (event == json::parse_event_t::object_end) {
      keys.pop_back();
    }
    return true;
  };
  json value = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (value.is_discarded()) return make_error(Reason::BadJson, "not valid JSON");
  if (duplicate) return make_error(Reason::BadJson, "duplicate key");
  // Re-serializing checks every number and string the way canonical_json will.
  if (auto r = canonical_json(value); !r) return r.error();
  return value;
}

}  // namespace kvformat
