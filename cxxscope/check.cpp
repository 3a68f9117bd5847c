#include "check.h"

namespace cxxscope {

Verdict judge(const FileReport& report, const std::string& file, const std::vector<InjectedRegion>& regions,
              const std::set<std::string>& new_files, bool must_compile) {
  Verdict v;
  for (const auto& d : report.diagnostics) {
    Finding f{d.file, d.line, d.message, ""};
    if (d.file == file) {
      size_t best = SIZE_MAX;
      for (const auto& r : regions)
        if (r.first <= d.line && d.line <= r.last && r.last - r.first < best) {
          best = r.last - r.first;
          f.region = r.name;
        }
    } else if (new_files.count(d.file)) {
      f.region = "new file";
    }
    (f.region.empty() ? v.outside : v.in_regions).push_back(std::move(f));
  }
  // A region is live when at least one of its code lines is outside every
  // inactive span. Directives and comments do not count: "#if 0 ... #endif"
  // around the code leaves only those lines live.
  for (const auto& r : regions) {
    std::vector<size_t> lines = r.code_lines;
    if (lines.empty())
      for (size_t l = r.first + 1; l < r.last; ++l) lines.push_back(l);
    if (lines.empty()) continue;  // nothing between the sentinels (a replace that deletes)
    bool live = false;
    for (size_t l : lines) {
      bool dead = false;
      for (const auto& [a, b] : report.inactive)
        if (a <= l && l <= b) dead = true;
      live |= !dead;
    }
    if (!live)
      v.dropped.push_back(Finding{file, r.first, "injected region is in a preprocessor branch the flags drop: it would never be compiled", r.name});
  }
  if (must_compile)
    for (const auto& h : report.missing_headers)
      v.outside.push_back(Finding{file, 0, "header not found: " + h, ""});
  v.failed = !v.in_regions.empty() || !v.dropped.empty() || (must_compile && !v.outside.empty());
  return v;
}

}  // namespace cxxscope
