// Runs kvtier-cxxscope once for a batch of files (one process, the texts on
// stdin) and parses its answer.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "report.h"

namespace cxxscope {

struct Request {
  std::string root;                         // the tree; relative -I and `file` start here
  std::string file;                         // relative to root
  std::vector<std::string> args;            // compile flags (already filtered)
  std::map<std::string, std::string> files; // path (relative to root) -> text replacing the disk
};

// $KVTIER_CXXSCOPE, else kvtier-cxxscope beside the executable (installed)
// or in <exe>/../cxxscope/ (build tree: build/patcher/overlay). "" when none is found.
std::string find_tool(const std::string& exe_path);

Result<std::vector<FileReport>> run_tool(const std::string& tool, const std::vector<Request>& requests);

}  // namespace cxxscope
