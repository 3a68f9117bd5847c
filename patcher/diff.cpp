#include "diff.h"

#include <algorithm>

#include "fmt/format.h"

namespace patcher {
namespace {

enum class Op { Equal, Delete, Insert };
struct Step {
  Op op;
  size_t a, b;  // line indices the step consumes (a for Equal/Delete, b for Equal/Insert)
};

std::vector<Step> myers(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  const long n = static_cast<long>(a.size()), m = static_cast<long>(b.size()), max = n + m;
  const long off = max + 1;
  std::vector<long> v(static_cast<size_t>(2 * max + 3), 0);
  std::vector<std::vector<long>> trace;
  long x = 0, y = 0;
  bool done = false;
  for (long d = 0; d <= max && !done; ++d) {
    trace.push_back(v);
    for (long k = -d; k <= d; k += 2) {
      bool down = k == -d || (k != d && v[static_cast<size_t>(off + k - 1)] < v[static_cast<size_t>(off + k + 1)]);
      x = down ? v[static_cast<size_t>(off + k + 1)] : v[static_cast<size_t>(off + k - 1)] + 1;
      y = x - k;
      while (x < n && y < m && a[static_cast<size_t>(x)] == b[static_cast<size_t>(y)]) ++x, ++y;
      v[static_cast<size_t>(off + k)] = x;
      if (x >= n && y >= m) {
        done = true;
        break;
      }
    }
  }
  std::vector<Step> steps;
  x = n;
  y = m;
  for (long d = static_cast<long>(trace.size()) - 1; d >= 0; --d) {
    const auto& tv = trace[static_cast<size_t>(d)];
    long k = x - y;
    long prev_k;
    if (d == 0)
      prev_k = 0;
    else
      prev_k = (k == -d || (k != d && tv[static_cast<size_t>(off + k - 1)] < tv[static_cast<size_t>(off + k + 1)]))
                   ? k + 1
                   : k - 1;
    long prev_x = d == 0 ? 0 : tv[static_cast<size_t>(off + prev_k)];
    long prev_y = prev_x - prev_k;
    while (x > prev_x && y > prev_y) {
      --x, --y;
      steps.push_back({Op::Equal, static_cast<size_t>(x), static_cast<size_t>(y)});
    }
    if (d == 0) break;
    if (x == prev_x) {
      --y;
      steps.push_back({Op::Insert, static_cast<size_t>(x), static_cast<size_t>(y)});
    } else {
      --x;
      steps.push_back({Op::Delete, static_cast<size_t>(x), static_cast<size_t>(y)});
    }
  }
  std::reverse(steps.begin(), steps.end());
  return steps;
}

}  // namespace

std::vector<std::string> unified_file_diff(const std::vector<std::string>& a, const std::vector<std::string>& b,
                                           const std::string& a_name, const std::string& b_name, size_t context) {
  std::vector<Step> steps = myers(a, b);
  std::vector<std::string> out;
  size_t i = 0;
  while (i < steps.size()) {
    // Next change.
    size_t first = i;
    while (first < steps.size() && steps[first].op == Op::Equal) ++first;
    if (first == steps.size()) break;
    size_t start = first >= context ? first - context : 0;
    start = std::max(start, i == 0 ? 0 : i);
    // Extend while changes are within 2*context of each other.
    size_t end = first, equal_run = 0;
    for (size_t j = first; j < steps.size(); ++j) {
      if (steps[j].op == Op::Equal) {
        if (++equal_run > 2 * context) break;
      } else {
        equal_run = 0;
        end = j;
      }
    }
    size_t stop = std::min(steps.size(), end + 1 + context);
    size_t a_start = 0, b_start = 0, a_len = 0, b_len = 0;
    bool a_set = false, b_set = false;
    std::vector<std::string> body;
    for (size_t j = start; j < stop; ++j) {
      const Step& s = steps[j];
      if (s.op != Op::Insert) {
        if (!a_set) a_start = s.a, a_set = true;
        ++a_len;
      }
      if (s.op != Op::Delete) {
        if (!b_set) b_start = s.b, b_set = true;
        ++b_len;
      }
      if (s.op == Op::Equal) body.push_back(" " + a[s.a]);
      if (s.op == Op::Delete) body.push_back("-" + a[s.a]);
      if (s.op == Op::Insert) body.push_back("+" + b[s.b]);
    }
    if (!a_set) a_start = steps[start].a;
    if (!b_set) b_start = steps[start].b;
    if (out.empty()) {
      out.push_back("--- " + a_name);
      out.push_back("+++ " + b_name);
    }
    out.push_back(fmt::format("@@ -{},{} +{},{} @@", a_len ? a_start + 1 : a_start, a_len, b_len ? b_start + 1 : b_start,
                              b_len));
    out.insert(out.end(), body.begin(), body.end());
    i = stop;
  }
  return out;
}

}  // namespace patcher
