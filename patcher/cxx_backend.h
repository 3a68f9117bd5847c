// The C/C++ backend of the engine: for .c/.cc/.cpp/.h/.hpp/.cu/.cuh targets,
// scopes come from the Clang AST (kvtier-cxxscope, through cxxscope_client)
// instead of Python indentation, anchors in inactive preprocessor branches or
// multi-line #defines are refused, and --check-injected runs a syntax-only
// Clang parse per patched file. Everything else (sentinels, transaction,
// states, drift report, revert) is the shared engine.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "error.h"
#include "manifest.h"
#include "scope.h"

namespace patcher::cxx {

bool is_cxx(std::string_view path);

// Process-wide: where the scope tool is and which tree relative paths and
// include folders start from. main() sets it once; tests may point it elsewhere.
void configure(const std::string& tool, const std::string& root);
void configure_root(const std::string& root);  // the tool stays as found beside the executable
void configure_python(const std::string& python);  // {python_include} in compile_flags
const std::string& tool();

// Compile flags of a target: compile_flags, or its compile_commands.json entry.
Result<std::vector<std::string>> flags_for(const FileSpec& spec);

// The scope of an edit in a C/C++ text (cached per text). A scope Clang cannot
// vouch for comes back not ok with ScopeMatch::refusal set.
Result<ScopeMatch> find_scope(const std::vector<std::string>& lines, const std::string& scope, const FileSpec& spec);

// "" or why an anchor at 0-based [first, first + count) must not be edited.
Result<std::string> anchor_refusal(const std::vector<std::string>& lines, size_t first, size_t count,
                                   const FileSpec& spec);

struct CheckUnit {
  std::string path;                       // target path in the tree
  std::string text;                       // patched text
  const FileSpec* spec = nullptr;
  std::map<std::string, std::string> new_files;  // path -> full text (header line included)
};

struct CheckTiming {
  std::string path;
  double seconds = 0;
};

// --check-injected for C/C++ files: one tool process for all units. Errors in
// injected regions, regions the flags drop, and (must_compile) any error give
// one Compile error listing every finding; other errors come back as notes.
Status check(const std::vector<CheckUnit>& units, std::vector<std::string>* notes, std::vector<CheckTiming>* timings);

}  // namespace patcher::cxx
