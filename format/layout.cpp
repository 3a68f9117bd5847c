#include "kvtier/format/layout.h"

#include <charconv>

namespace kvformat {
namespace {

bool is_lower_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

bool all_lower_hex(std::string_view s) {
  for (char c : s)
    if (!is_lower_hex(c)) return false;
  return true;
}

bool model_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '-';
}

// Decimal without leading zeros (a lone "0" is fine), at most max_digits.
std::optional<std::uint64_t> parse_decimal(std::string_view s, std::size_t max_digits) {
  if (s.empty() || s.size() > max_digits || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

void strip(std::string& s, std::string_view chars) {
  const auto first = s.find_first_not_of(chars);
  if (first == std::string::npos) {
    s.clear();
    return;
  }
  s.erase(0, first);
  s.erase(s.find_last_not_of(chars) + 1);
}

}  // namespace

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::uint8_t b : bytes) {
    out += kHex[b >> 4];
    out += kHex[b & 0xF];
  }
  return out;
}

Result<std::vector<std::uint8_t>> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0 || !all_lower_hex(hex))
    return make_error(Reason::BadName, "not lowercase hex of whole bytes");
  std::vector<std::uint8_t> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    out[i] = static_cast<std::uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return out;
}

bool is_key_hex(std::string_view text) {
  return text.size() >= 16 && text.size() <= 128 && text.size() % 2 == 0 && all_lower_hex(text);
}

std::string sanitize_model(std::string_view model) {
  std::string out;
  for (char c : model) {
    if (model_char(c)) {
      out += c;
    } else if (out.empty() || out.back() != '-') {
      out += '-';  // one '-' per run of other bytes
    }
  }
  // A '-' from the input next to a replaced run collapses too.
  std::string collapsed;
  for (char c : out)
    if (!(c == '-' && !collapsed.empty() && collapsed.back() == '-')) collapsed += c;
  strip(collapsed, "-.");
  if (collapsed.size() > kModelNameMax) collapsed.resize(kModelNameMax);
  const auto last = collapsed.find_last_not_of("-.");
  collapsed.erase(last == std::string::npos ? 0 : last + 1);
  return collapsed.empty() ? "model" : collapsed;
}

Result<std::string> rank_base_name(std::string_view prefix, std::string_view model,
                                   const Sha256Digest& ns_hash, std::uint32_t rank) {
  if (prefix.empty() || prefix.size() > 32)
    return make_error(Reason::BadName, "prefix must be [a-z0-9]{1,32}");
  for (char c : prefix)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')))
      return make_error(Reason::BadName, "prefix must be [a-z0-9]{1,32}");
  if (rank > kMaxRank) return make_error(Reason::BadName, "rank " + std::to_string(rank));
  return std::string(prefix) + "_" + sanitize_model(model) + "_" +
         to_hex(ns_hash).substr(0, 16) + "_r" + std::to_string(rank);
}

Result<RankBaseName> parse_rank_base_name(std::string_view name) {
  auto bad = [&] { return make_error(Reason::BadName, "not a rank base name: " + std::string(name)); };
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const auto pos = name.find('_', start);
    parts.push_back(name.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  if (parts.size() != 4) return bad();
  RankBaseName out;
  out.prefix = parts[0];
  out.model = parts[1];
  out.ns_short = parts[2];
  if (out.prefix.empty() || out.prefix.size() > 32) return bad();
  for (char c : out.prefix)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return bad();
  if (out.model.empty() || out.model.size() > kModelNameMax || sanitize_model(out.model) != out.model)
    return bad();
  if (out.ns_short.size() != 16 || !all_lower_hex(out.ns_short)) return bad();
  if (!parts[3].starts_with("r")) return bad();
  const auto rank = parse_decimal(parts[3].substr(1), 5);
  if (!rank || *rank > kMaxRank) return bad();
  out.rank = static_cast<std::uint32_t>(*rank);
  return out;
}

std::string namespace_record_name(std::string_view rank_base_name) {
  return std::string(rank_base_name) + ".json";
}

Result<std::string> chunk_rel_path(std::string_view key_hex, std::uint32_t group) {
  if (!is_key_hex(key_hex))
    return make_error(Reason::BadName, "chunk key " + std::string(key_hex.substr(0, 80)));
  if (group > 1023) return make_error(Reason::BadName, "group " + std::to_string(group));
  return std::string(key_hex.substr(0, 3)) + "/" + std::string(key_hex.substr(3, 2)) + "_g" +
         std::to_string(group) + "/" + std::string(key_hex) + ".bin";
}

bool is_chunk_top_dir(std::string_view name) { return name.size() == 3 && all_lower_hex(name); }

std::optional<LeafDir> parse_chunk_leaf_dir(std::string_view name) {
  if (name.size() < 5 || !all_lower_hex(name.substr(0, 2)) || name.substr(2, 2) != "_g")
    return std::nullopt;
  const auto group = parse_decimal(name.substr(4), 4);
  if (!group || *group > 1023) return std::nullopt;
  return LeafDir{std::string(name.substr(0, 2)), static_cast<std::uint32_t>(*group)};
}

std::optional<std::string> parse_chunk_file_name(std::string_view name, std::string_view top,
                                                 std::string_view leaf_hh) {
  if (!name.ends_with(".bin")) return std::nullopt;
  const auto key = name.substr(0, name.size() - 4);
  if (!is_key_hex(key) || key.substr(0, 3) != top || key.substr(3, 2) != leaf_hh)
    return std::nullopt;
  return std::string(key);
}

Result<ChunkName> parse_chunk_rel_path(std::string_view rel) {
  auto bad = [&] { return make_error(Reason::BadName, "not a chunk path: " + std::string(rel)); };
  const auto s1 = rel.find('/');
  if (s1 == std::string_view::npos) return bad();
  const auto s2 = rel.find('/', s1 + 1);
  if (s2 == std::string_view::npos || rel.find('/', s2 + 1) != std::string_view::npos)
    return bad();
  const auto top = rel.substr(0, s1), leaf = rel.substr(s1 + 1, s2 - s1 - 1),
             file = rel.substr(s2 + 1);
  if (!is_chunk_top_dir(top)) return bad();
  const auto leaf_dir = parse_chunk_leaf_dir(leaf);
  if (!leaf_dir) return bad();
  const auto key = parse_chunk_file_name(file, top, leaf_dir->hh);
  if (!key) return bad();
  return ChunkName{*key, leaf_dir->group};
}

Result<std::string> manifest_file_name(std::uint64_t boundary, std::string_view tip) {
  if (!is_key_hex(tip) || boundary == 0 || boundary > (std::uint64_t{1} << 40))
    return make_error(Reason::BadName, "manifest name for boundary " + std::to_string(boundary));
  return "b" + std::to_string(boundary) + "_" + std::string(tip) + ".json";
}

Result<ManifestName> parse_manifest_file_name(std::string_view name) {
  auto bad = [&] { return make_error(Reason::BadName, "not a manifest name: " + std::string(name)); };
  if (!name.starts_with("b") || !name.ends_with(".json")) return bad();
  const auto body = name.substr(1, name.size() - 6);
  const auto us = body.find('_');
  if (us == std::string_view::npos) return bad();
  const auto boundary = parse_decimal(body.substr(0, us), 13);
  const auto tip = body.substr(us + 1);
  if (!boundary || *boundary == 0 || *boundary > (std::uint64_t{1} << 40) || !is_key_hex(tip))
    return bad();
  return ManifestName{*boundary, std::string(tip)};
}

std::string temp_name(std::string_view final_name, std::uint64_t pid, std::uint64_t tid) {
  return std::string(final_name) + ".tmp." + std::to_string(pid) + "." + std::to_string(tid);
}

Result<std::string> pending_file_name(std::uint64_t pid, std::uint64_t tid) {
  constexpr std::uint64_t kLimit = 10'000'000'000'000'000'000ULL;  // 20 digits
  if (pid == 0 || tid == 0 || pid >= kLimit || tid >= kLimit)
    return make_error(Reason::BadName,
                      "pending name for " + std::to_string(pid) + ", " + std::to_string(tid));
  return std::to_string(pid) + "." + std::to_string(tid) + ".json";
}

std::optional<PendingName> parse_pending_file_name(std::string_view name) {
  if (!name.ends_with(".json")) return std::nullopt;
  name.remove_suffix(5);
  const auto dot = name.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const auto pid = parse_decimal(name.substr(0, dot), 19);
  const auto tid = parse_decimal(name.substr(dot + 1), 19);
  if (!pid || !tid || *pid == 0 || *tid == 0) return std::nullopt;
  return PendingName{*pid, *tid};
}

std::optional<TempName> parse_temp_name(std::string_view name) {
  // <final>.tmp.<pid>.<tid>: pid and tid positive decimals, final non-empty.
  const auto last_dot = name.rfind('.');
  if (last_dot == std::string_view::npos) return std::nullopt;
  const auto mid_dot = name.rfind('.', last_dot == 0 ? 0 : last_dot - 1);
  if (mid_dot == std::string_view::npos || mid_dot < 5) return std::nullopt;
  if (name.substr(mid_dot - 4, 5) != ".tmp.") return std::nullopt;
  const auto pid = parse_decimal(name.substr(mid_dot + 1, last_dot - mid_dot - 1), 19);
  const auto tid = parse_decimal(name.substr(last_dot + 1), 19);
  if (!pid || !tid || *pid == 0 || *tid == 0) return std::nullopt;
  return TempName{std::string(name.substr(0, mid_dot - 4)), *pid, *tid};
}

}  // namespace kvformat
