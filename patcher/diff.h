// Unified diff of two whole files (Myers' O((N+M)D) algorithm), for
// `overlay plan --diff`: overlay edits touch few lines of long files.
#pragma once

#include <string>
#include <vector>

namespace patcher {

std::vector<std::string> unified_file_diff(const std::vector<std::string>& a, const std::vector<std::string>& b,
                                           const std::string& a_name, const std::string& b_name, size_t context = 3);

}  // namespace patcher
