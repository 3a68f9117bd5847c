// A file name as a report may show it: one line, valid UTF-8, and the bytes
// recoverable. Store paths come from the file system, where a name may hold
// any byte but '/' and NUL: a newline would split a report line (and could
// forge one), an escape sequence would reach the terminal, and a byte that
// is not UTF-8 makes a JSON document invalid.
#pragma once

#include <string>
#include <string_view>

namespace kvtier {

// Control characters (below 0x20, and 0x7f), backslash and every byte that
// is not part of a valid UTF-8 sequence become `\xNN` (backslash `\\`);
// everything else, multi-byte characters included, is kept as is.
std::string printable(std::string_view s);

}  // namespace kvtier
