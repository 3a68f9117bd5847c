// Anchor search and the drift report: when an anchor is not found exactly N
// times, show where it was found, or the closest lines with a similarity
// score and a unified diff, so porting to a new engine version is quick.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace patcher {

// Start indices in [begin, end) where all anchor lines match exactly.
std::vector<size_t> find_anchor(const std::vector<std::string>& lines, size_t begin, size_t end,
                                const std::vector<std::string>& anchor);

// 2*matches/(len(a)+len(b)) over the longest common subsequence of bytes, in [0, 1].
double similarity(std::string_view a, std::string_view b);

struct NearMatch {
  size_t line = 0;  // 0-based start
  double score = 0;
};

// The k windows of anchor.size() lines in [begin, end) most similar to the anchor.
std::vector<NearMatch> nearest(const std::vector<std::string>& lines, size_t begin, size_t end,
                               const std::vector<std::string>& anchor, size_t k = 3);

// A unified diff (one hunk) turning `a` into `b`.
std::vector<std::string> unified_diff(const std::vector<std::string>& a, const std::vector<std::string>& b,
                                      const std::string& a_name, const std::string& b_name, size_t a_first_line,
                                      size_t b_first_line);

}  // namespace patcher
