// --check-injected: compiles patched files and fragments with the target
// interpreter, all in ONE process (a small script on -c, the texts as JSON
// on stdin), so the check costs one interpreter start however many files.
#pragma once

#include <string>
#include <vector>

#include "error.h"

namespace patcher {

struct CompileUnit {
  std::string name;  // shown in errors
  std::string text;
  bool fragment = false;  // fragments may hold function-body code: also tried wrapped in a def
};

struct CompileError {
  std::string name;
  int line = 0;
  std::string message;
};

Result<std::vector<CompileError>> compile_units(const std::string& python, const std::vector<CompileUnit>& units);

}  // namespace patcher
