// Fuzzes the C/C++ scope backend's inputs (cxxscope/): the first input line
// is a scope ("namespace vllm/fn f"), the rest the scope tool's JSON report.
// The report comes from another process, so the engine must not trust it:
// parse_reports has to reject every malformed shape, and resolve_scope,
// anchor_refusal and judge must stay inside the file whatever it says.
//
// Properties: a resolved range lies inside the file and inside its parent
// scope's range; found/header lines lie inside the file; a scope with a
// syntax error never resolves; the compile-check verdict fails whenever it
// lists a finding inside a region.
#include <cstdint>
#include <string>
#include <string_view>

#include "check.h"
#include "flags.h"
#include "fuzz_check.h"
#include "report.h"
#include "resolve.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string scope(in.substr(0, nl));
  const std::string_view json = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);

  // The same bytes as a compile command: splitting and filtering never fail.
  auto argv = cxxscope::split_command(scope);
  auto kept = cxxscope::filter_flags(argv, "/d");
  FUZZ_CHECK(kept.size() <= 2 * argv.size());

  auto reports = cxxscope::parse_reports(json);
  if (!reports) return 0;
  const bool syntax_ok = cxxscope::scope_syntax_error(scope).empty();
  for (const auto& r : *reports) {
    size_t lines = 0;
    for (const auto& d : r.definitions) lines = std::max(lines, d.end);
    lines += 2;
    auto m = cxxscope::resolve_scope(r.definitions, scope, lines);
    if (!syntax_ok) FUZZ_CHECK(!m.ok);
    if (m.ok) {
      FUZZ_CHECK(m.begin < m.end && m.end <= lines);
      const size_t slash = scope.rfind('/');
      if (slash != std::string::npos) {
        auto parent = cxxscope::resolve_scope(r.definitions, scope.substr(0, slash), lines);
        // A reopened namespace parent does not resolve alone; otherwise it must contain the child.
        if (parent.ok) FUZZ_CHECK(parent.begin <= m.begin && m.end <= parent.end);
      }
    }
    for (size_t f : m.found) FUZZ_CHECK(f < lines);
    for (size_t h : m.headers) FUZZ_CHECK(h < lines);
    (void)cxxscope::anchor_refusal(r, lines / 2, 3);
    std::vector<cxxscope::InjectedRegion> regions;
    for (const auto& d : r.definitions) regions.push_back({d.name, d.begin, d.end});
    auto v = cxxscope::judge(r, r.file, regions, {}, false);
    if (!v.in_regions.empty() || !v.dropped.empty()) FUZZ_CHECK(v.failed);
  }
  return 0;
}
