#include "anchor.h"

#include <algorithm>

#include "fmt/format.h"

namespace patcher {

std::vector<size_t> find_anchor(const std::vector<std::string>& lines, size_t begin, size_t end,
                                const std::vector<std::string>& anchor) {
  std::vector<size_t> out;
  if (anchor.empty() || end < begin + anchor.size()) return out;
  for (size_t i = begin; i + anchor.size() <= end; ++i) {
    bool all = true;
    for (size_t j = 0; j < anchor.size() && all; ++j) all = lines[i + j] == anchor[j];
    if (all) out.push_back(i);
  }
  return out;
}

double similarity(std::string_view a, std::string_view b) {
  if (a.empty() && b.empty()) return 1.0;
  std::vector<size_t> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  return 2.0 * static_cast<double>(prev[b.size()]) / static_cast<double>(a.size() + b.size());
}

std::vector<NearMatch> nearest(const std::vector<std::string>& lines, size_t begin, size_t end,
                               const std::vector<std::string>& anchor, size_t k) {
  std::vector<NearMatch> all;
  std::string want;
  for (const auto& l : anchor) want += l + "\n";
  size_t n = anchor.size();
  for (size_t i = begin; i < end; ++i) {
    std::string window;
    for (size_t j = i; j < i + n && j < end; ++j) window += lines[j] + "\n";
    // Cheap bound first: length alone caps the ratio.
    double cap = 2.0 * static_cast<double>(std::min(window.size(), want.size())) /
                 static_cast<double>(window.size() + want.size());
    if (!all.empty() && all.size() >= k && cap < all.back().score) continue;
    all.push_back({i, similarity(want, window)});
    std::stable_sort(all.begin(), all.end(), [](auto& x, auto& y) { return x.score > y.score; });
    if (all.size() > k) all.resize(k);
  }
  return all;
}

std::vector<std::string> unified_diff(const std::vector<std::string>& a, const std::vector<std::string>& b,
                                      const std::string& a_name, const std::string& b_name, size_t a_first_line,
                                      size_t b_first_line) {
  // Line LCS table; anchors are a few lines, so quadratic is fine.
  size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> L(n + 1, std::vector<size_t>(m + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;) L[i][j] = a[i] == b[j] ? L[i + 1][j + 1] + 1 : std::max(L[i + 1][j], L[i][j + 1]);
  std::vector<std::string> out;
  out.push_back("--- " + a_name);
  out.push_back("+++ " + b_name);
  out.push_back(fmt::format("@@ -{},{} +{},{} @@", a_first_line, n, b_first_line, m));
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j]) {
      out.push_back(" " + a[i]);
      ++i;
      ++j;
    } else if (i < n && (j == m || L[i + 1][j] >= L[i][j + 1])) {
      out.push_back("-" + a[i++]);
    } else {
      out.push_back("+" + b[j++]);
    }
  }
  return out;
}

}  // namespace patcher
