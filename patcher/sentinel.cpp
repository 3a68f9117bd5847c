#include "sentinel.h"

#include <algorithm>

#include "sha256.h"
#include "text.h"

namespace patcher {

std::string comment_prefix(std::string_view path) {
  static const char* slash_exts[] = {".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx", ".cu", ".cuh", ".js", ".ts", ".rs", ".go"};
  for (const char* e : slash_exts) {
    std::string_view ext(e);
    if (path.size() > ext.size() && path.substr(path.size() - ext.size()) == ext) return "//";
  }
  return "#";
}

std::string text_hash(std::string_view text) { return kvtier::sha256_hex(text).substr(0, 16); }

std::string region_hash(const std::vector<std::string>& body) { return text_hash(join_lines(body, true)); }

std::string begin_sentinel(const std::string& prefix, const std::string& indent, const std::string& overlay,
                           const std::string& edit, const std::string& hash) {
  return indent + prefix + " >>> overlay " + overlay + "/" + edit + " sha256=" + hash;
}

std::string end_sentinel(const std::string& prefix, const std::string& indent, const std::string& overlay,
                         const std::string& edit) {
  return indent + prefix + " <<< overlay " + overlay + "/" + edit;
}

std::string new_file_header(const std::string& prefix, const std::string& overlay, const std::string& hash) {
  return prefix + " === overlay " + overlay + " new-file sha256=" + hash + " (managed by overlay; do not edit)";
}

namespace {

// After the comment prefix: the marker, or npos.
size_t marker_pos(std::string_view t) {
  size_t p = 0;
  if (t.substr(0, 1) == "#")
    p = 1;
  else if (t.substr(0, 2) == "//")
    p = 2;
  else
    return std::string_view::npos;
  while (p < t.size() && t[p] == ' ') ++p;
  return p;
}

bool is_hex16(std::string_view h) {
  if (h.size() != 16) return false;
  for (char c : h)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

bool looks_like_sentinel(std::string_view line) {
  std::string_view t = trim(line);
  size_t p = marker_pos(t);
  if (p == std::string_view::npos) return false;
  std::string_view rest = t.substr(p);
  for (std::string_view m : {">>> overlay", "<<< overlay", "=== overlay"})
    if (rest.substr(0, m.size()) == m) return true;
  return false;
}

Sentinel parse_sentinel(std::string_view line) {
  Sentinel s;
  if (!looks_like_sentinel(line)) return s;
  s.kind = SentinelKind::Malformed;
  std::string_view t = trim(line);
  std::string_view rest = t.substr(marker_pos(t));
  std::string_view marker = rest.substr(0, 3);
  rest = rest.substr(std::string_view(">>> overlay").size());
  if (rest.empty() || rest[0] != ' ') return s;
  rest = rest.substr(1);
  size_t sp = rest.find(' ');
  std::string_view name = rest.substr(0, sp);
  std::string_view tail = sp == rest.npos ? std::string_view() : rest.substr(sp + 1);
  if (marker == "===") {
    const std::string_view want = "new-file sha256=";
    if (tail.substr(0, want.size()) != want) return s;
    std::string_view h = tail.substr(want.size(), 16);
    if (!is_hex16(h) || name.empty()) return s;
    s.kind = SentinelKind::NewFile;
    s.overlay = std::string(name);
    s.hash = std::string(h);
    return s;
  }
  size_t slash = name.find('/');
  if (slash == name.npos || slash == 0 || slash + 1 == name.size()) return s;
  s.overlay = std::string(name.substr(0, slash));
  s.edit = std::string(name.substr(slash + 1));
  if (marker == ">>>") {
    const std::string_view want = "sha256=";
    if (tail.substr(0, want.size()) != want || !is_hex16(tail.substr(want.size())) ||
        tail.size() != want.size() + 16)
      return s;
    s.kind = SentinelKind::Begin;
    s.hash = std::string(tail.substr(want.size()));
  } else {
    if (!tail.empty()) return s;
    s.kind = SentinelKind::End;
  }
  return s;
}

}  // namespace patcher
