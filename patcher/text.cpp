#include "text.h"

namespace patcher {

Text split_lines(std::string_view s) {
  Text t;
  t.trailing_newline = !s.empty() && s.back() == '\n';
  if (s.empty()) {
    t.trailing_newline = false;
    return t;
  }
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string_view::npos) {
      t.lines.emplace_back(s.substr(start));
      break;
    }
    t.lines.emplace_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return t;
}

std::string join_lines(const std::vector<std::string>& lines, bool trailing_newline) {
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    out += lines[i];
    if (i + 1 < lines.size() || trailing_newline) out += '\n';
  }
  return out;
}

std::string join_lines(const Text& t) { return join_lines(t.lines, t.trailing_newline); }

std::string strip_one_trailing_newline(std::string s) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

std::optional<size_t> find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  auto cont = [&](size_t k) { return k < s.size() && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80; };
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
    } else if (c >= 0xC2 && c <= 0xDF) {
      if (!cont(i + 1)) return i;
      i += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      if (!cont(i + 1) || !cont(i + 2)) return i;
      auto c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0)) return i;  // overlong / surrogate
      i += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return i;
      auto c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 >= 0x90)) return i;
      i += 4;
    } else {
      return i;
    }
  }
  return std::nullopt;
}

size_t line_of_offset(std::string_view s, size_t offset) {
  size_t line = 1;
  for (size_t i = 0; i < offset && i < s.size(); ++i)
    if (s[i] == '\n') ++line;
  return line;
}

std::optional<size_t> find_cr_line(std::string_view s) {
  size_t pos = s.find('\r');
  if (pos == std::string_view::npos) return std::nullopt;
  return line_of_offset(s, pos);
}

std::string leading_ws(std::string_view line) {
  size_t n = 0;
  while (n < line.size() && (line[n] == ' ' || line[n] == '\t')) ++n;
  return std::string(line.substr(0, n));
}

std::string_view trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

bool is_blank(std::string_view line) { return trim(line).empty(); }

std::vector<std::string> reindent(const std::vector<std::string>& lines, const std::string& indent) {
  std::vector<std::string> out;
  out.reserve(lines.size());
  for (const auto& l : lines) out.push_back(is_blank(l) ? std::string() : indent + l);
  return out;
}

}  // namespace patcher
