#include "scope.h"

#include "text.h"

namespace patcher {

std::vector<bool> logical_starts(const std::vector<std::string>& lines) {
  std::vector<bool> starts(lines.size(), false);
  int depth = 0;
  std::string triple;  // open triple quote, "" when none
  bool continued = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    starts[i] = depth == 0 && triple.empty() && !continued;
    continued = false;
    const std::string& l = lines[i];
    size_t k = 0;
    while (k < l.size()) {
      char c = l[k];
      if (!triple.empty()) {
        if (c == '\\') {
          k += 2;
          continue;
        }
        if (l.compare(k, 3, triple) == 0) {
          triple.clear();
          k += 3;
          continue;
        }
        ++k;
        continue;
      }
      if (c == '#') break;
      if (c == '"' || c == '\'') {
        std::string q3(3, c);
        if (l.compare(k, 3, q3) == 0) {
          triple = q3;
          k += 3;
          continue;
        }
        // Single-quoted string: ends on this line.
        ++k;
        while (k < l.size() && l[k] != c) k += (l[k] == '\\') ? 2 : 1;
        ++k;
        continue;
      }
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
      if (c == '\\' && k + 1 == l.size()) continued = true;
      ++k;
    }
  }
  return starts;
}

namespace {

bool is_code_start(const std::vector<std::string>& lines, const std::vector<bool>& starts, size_t i) {
  if (!starts[i] || is_blank(lines[i])) return false;
  return trim(lines[i])[0] != '#';
}

bool ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

bool header_matches(std::string_view line, std::string_view seg) {
  std::string_view t = trim(line);
  if (seg.substr(0, 4) == "def " && t.substr(0, 6) == "async ") t = trim(t.substr(6));
  if (t.substr(0, seg.size()) != seg) return false;
  return t.size() == seg.size() || !ident_char(t[seg.size()]);
}

bool is_header(std::string_view line) {
  std::string_view t = trim(line);
  return t.substr(0, 4) == "def " || t.substr(0, 6) == "class " || t.substr(0, 10) == "async def ";
}

}  // namespace

size_t block_end(const std::vector<std::string>& lines, const std::vector<bool>& starts, size_t header) {
  size_t indent = leading_ws(lines[header]).size();
  size_t last = header;  // last line that belongs to the block
  size_t i = header + 1;
  for (; i < lines.size() && !starts[i]; ++i) if (!is_blank(lines[i])) last = i;  // header's logical line
  for (; i < lines.size(); ++i) {
    if (is_blank(lines[i])) continue;
    if (!starts[i]) {
      last = i;
      continue;
    }
    size_t ind = leading_ws(lines[i]).size();
    if (is_code_start(lines, starts, i) && ind <= indent) break;
    if (!is_code_start(lines, starts, i) && ind <= indent) continue;  // shallow comment: undecided
    last = i;
  }
  return last + 1;
}

ScopeMatch find_scope(const std::vector<std::string>& lines, const std::string& scope) {
  ScopeMatch m;
  std::vector<bool> starts = logical_starts(lines);
  LineRange range{0, lines.size()};
  size_t pos = 0;
  while (pos <= scope.size()) {
    size_t slash = scope.find('/', pos);
    std::string seg(trim(std::string_view(scope).substr(pos, slash == std::string::npos ? std::string::npos : slash - pos)));
    m.segment = seg;
    m.searched = range;
    m.found.clear();
    m.headers.clear();
    for (size_t i = range.begin; i < range.end; ++i) {
      if (!is_code_start(lines, starts, i)) continue;
      if (is_header(lines[i])) m.headers.push_back(i);
      if (header_matches(lines[i], seg)) m.found.push_back(i);
    }
    if (m.found.size() != 1) return m;
    size_t h = m.found[0];
    range = LineRange{h, block_end(lines, starts, h)};
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  m.ok = true;
  m.range = range;
  return m;
}

}  // namespace patcher
