// Compile flags for a C/C++ target: from the manifest, or from the file's
// compile_commands.json entry, filtered to what a syntax-only Clang parse
// needs and understands (-I, -isystem, -D, -U, -std, -include). Everything
// else, nvcc's options above all (-gencode, -Xcompiler, --expt-...), is dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "report.h"

namespace cxxscope {

// Keeps the understood options; relative paths are made absolute against `directory`.
std::vector<std::string> filter_flags(const std::vector<std::string>& argv, const std::string& directory);

// The filtered flags of the entry for `file` (absolute path) in a
// compile_commands.json text. An error names what is missing or malformed.
Result<std::vector<std::string>> flags_from_compile_commands(std::string_view json_text, const std::string& file);

// Splits a compile_commands "command" string (quotes and backslashes as a shell would).
std::vector<std::string> split_command(std::string_view command);

}  // namespace cxxscope
