#include "suggest.h"

#include <algorithm>

namespace kvtier {
namespace {

// Optimal string alignment distance (Damerau-Levenshtein without repeated edits).
size_t distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::string nearest(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = word.size() <= 4 ? 1 : 2;
  bool found = false;
  for (const auto& c : candidates) {
    size_t d = distance(word, c);
    if (d <= best_d && (!found || d < best_d)) {
      best = c;
      best_d = d;
      found = true;
    }
  }
  if (found) return best;
  // A unique prefix: "ver" -> "verify".
  std::string prefix_hit;
  for (const auto& c : candidates)
    if (word.size() >= 3 && c.size() > word.size() && c.compare(0, word.size(), word) == 0) {
      if (!prefix_hit.empty()) return "";
      prefix_hit = c;
    }
  return prefix_hit;
}

}  // namespace kvtier
