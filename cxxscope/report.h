// What kvtier-cxxscope says about one C/C++/CUDA file: its definitions with
// exact line ranges, inactive preprocessor lines, multi-line #define bodies,
// errors and missing headers. Parsed from the tool's JSON (parse_reports is
// fuzzed: tests/fuzz/fuzz_cxx_scope.cpp).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "result.h"

namespace cxxscope {

template <class T>
using Result = kvtier::Result<T, std::string>;  // the error is one line of text

struct Definition {
  std::string kind;       // namespace | class | struct | union | function | method
  std::string name;       // "(anonymous)" for an anonymous namespace
  std::string qualified;  // a::b::name
  size_t begin = 0, end = 0, name_line = 0;  // 1-based, inclusive
  bool valid = false;     // false: clang gave no trustworthy range (see why)
  std::string why;
};

struct Diagnostic {
  std::string severity;  // error | fatal
  std::string file;      // as clang named it (absolute), "" when unknown
  size_t line = 0;
  std::string message;
};

using LineSpan = std::pair<size_t, size_t>;  // 1-based, inclusive

struct FileReport {
  std::string file;
  bool ok = false;
  std::string error;
  std::vector<Definition> definitions;
  std::vector<LineSpan> inactive, macros;
  std::vector<Diagnostic> diagnostics;
  std::vector<std::string> missing_headers;
  double seconds = 0;
};

// Parses the tool's stdout; any shape error is an error naming what is wrong.
Result<std::vector<FileReport>> parse_reports(std::string_view json_text);

// True for files the C/C++ backend handles, by extension.
bool is_cxx_path(std::string_view path);

}  // namespace cxxscope
