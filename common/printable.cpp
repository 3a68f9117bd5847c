#include "printable.h"

#include <cstdint>

namespace kvtier {

namespace {

// The length of the valid UTF-8 sequence starting at s[i], or 0.
size_t utf8_length(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = b(i);
  size_t n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c <= 0xdf ? 2 : 0;
  if (c >= 0xf5 || n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  // Overlong forms, UTF-16 surrogates and code points above U+10FFFF.
  uint8_t d = b(i + 1);
  if ((c == 0xe0 && d < 0xa0) || (c == 0xed && d >= 0xa0) || (c == 0xf0 && d < 0x90) || (c == 0xf4 && d >= 0x90))
    return 0;
  return n;
}

}  // namespace

std::string printable(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<uint8_t>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
      ++i;
    } else if (c == '\\') {
      out += "\\\\";
      ++i;
    } else if (size_t n = c >= 0x80 ? utf8_length(s, i) : 0; n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
    }
  }
  return out;
}

}  // namespace kvtier
