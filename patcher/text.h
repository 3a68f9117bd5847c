// Line-oriented text: the engine edits whole lines only, so a file is a list
// of lines plus whether it ends with a newline.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace patcher {

struct Text {
  std::vector<std::string> lines;  // without '\n'
  bool trailing_newline = true;
};

Text split_lines(std::string_view s);
std::string join_lines(const Text& t);
std::string join_lines(const std::vector<std::string>& lines, bool trailing_newline);

// Multi-line TOML strings usually end with a newline; an anchor or fragment
// means the lines themselves, so one trailing '\n' is dropped.
std::string strip_one_trailing_newline(std::string s);

// Returns the byte offset of the first invalid UTF-8 sequence, if any.
std::optional<size_t> find_invalid_utf8(std::string_view s);
// 1-based line number of the first '\r', if any.
std::optional<size_t> find_cr_line(std::string_view s);
// 1-based line of a byte offset.
size_t line_of_offset(std::string_view s, size_t offset);

std::string leading_ws(std::string_view line);
std::string_view trim(std::string_view s);
bool is_blank(std::string_view line);

// Prefixes every non-blank line with `indent`; blank lines stay empty so no
// trailing whitespace is introduced.
std::vector<std::string> reindent(const std::vector<std::string>& lines, const std::string& indent);

}  // namespace patcher
