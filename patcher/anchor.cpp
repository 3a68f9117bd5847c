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

// Two passes, so that the work is linear in the file and the anchor: a
// sliding window scores every position by the overlap of its byte bigrams with
// the anchor's (Dice coefficient, updated as lines enter and leave), then the
// best few are rescored exactly (LCS similarity) where that is affordable.
std::vector<NearMatch> nearest(const std::vector<std::string>& lines, size_t begin, size_t end,
                               const std::vector<std::string>& anchor, size_t k) {
  size_t n = anchor.size();
  if (n == 0 || begin >= end) return {};
  std::vector<int> want_count(1 << 16, 0), have(1 << 16, 0);
  auto each_bigram = [](const std::string& line, auto&& f) {
    unsigned prev = '\n';
    for (unsigned char ch : line) {
      f((prev << 8) | ch);
      prev = ch;
    }
    f((prev << 8) | '\n');
  };
  long want_total = 0, have_total = 0, common = 0;
  std::string want;
  for (const auto& l : anchor) {
    want += l + "\n";
    each_bigram(l, [&](unsigned b) {
      ++want_count[b];
      ++want_total;
    });
  }
  auto add = [&](const std::string& line) {
    each_bigram(line, [&](unsigned b) {
      if (have[b] < want_count[b]) ++common;
      ++have[b];
      ++have_total;
    });
  };
  auto remove = [&](const std::string& line) {
    each_bigram(line, [&](unsigned b) {
      --have[b];
      if (have[b] < want_count[b]) --common;
      --have_total;
    });
  };
  const size_t keep = std::max<size_t>(k, 8);
  std::vector<NearMatch> best;  // by the cheap score, best first
  for (size_t j = begin; j < std::min(end, begin + n); ++j) add(lines[j]);
  for (size_t i = begin; i < end; ++i) {
    if (i > begin) {
      remove(lines[i - 1]);
      if (i + n - 1 < end) add(lines[i + n - 1]);
    }
    double score = 2.0 * static_cast<double>(common) / static_cast<double>(want_total + have_total);
    if (best.size() == keep && score <= best.back().score) continue;
    auto at = std::upper_bound(best.begin(), best.end(), score, [](double s, const NearMatch& m) { return s > m.score; });
    best.insert(at, NearMatch{i, score});
    if (best.size() > keep) best.pop_back();
  }
  constexpr size_t kExactBudget = 4'000'000;  // byte pairs per exact rescoring
  for (auto& m : best) {
    std::string window;
    for (size_t j = m.line; j < m.line + n && j < end; ++j) window += lines[j] + "\n";
    if (window.size() * want.size() <= kExactBudget) m.score = similarity(want, window);
  }
  std::stable_sort(best.begin(), best.end(), [](const NearMatch& x, const NearMatch& y) {
    return x.score != y.score ? x.score > y.score : x.line < y.line;
  });
  if (best.size() > k) best.resize(k);
  return best;
}

std::vector<std::string> unified_diff(const std::vector<std::string>& a, const std::vector<std::string>& b,
                                      const std::string& a_name, const std::string& b_name, size_t a_first_line,
                                      size_t b_first_line) {
  // Line LCS table; anchors are a few lines, so quadratic is fine (callers
  // skip the diff for very long anchors).
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
