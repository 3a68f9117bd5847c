// Fuzzes sentinel and region parsing (patcher/region.h): any text file the
// engine reads is split into lines, every line classified, and the regions
// paired up. A tampered file must give a Tampered error, never a crash.
//
// Properties:
//  - a line parses as a sentinel (of any kind) exactly when it looks like one;
//  - a parsed begin/end/new-file sentinel, written again by the engine's own
//    writer, parses back to the same fields;
//  - accepted regions lie inside the file, begin < end, the two lines are
//    the matching sentinels, and regions nest without crossing.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "region.h"
#include "text.h"

using patcher::SentinelKind;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const patcher::Text t = patcher::split_lines(text);
  FUZZ_CHECK(patcher::join_lines(t) == text);

  for (const auto& line : t.lines) {
    const auto s = patcher::parse_sentinel(line);
    FUZZ_CHECK((s.kind != SentinelKind::None) == patcher::looks_like_sentinel(line));
    const std::string indent = patcher::leading_ws(line);
    if (s.kind == SentinelKind::Begin) {
      auto again = patcher::parse_sentinel(patcher::begin_sentinel("#", indent, s.overlay, s.edit, s.hash));
      FUZZ_CHECK(again.kind == SentinelKind::Begin && again.overlay == s.overlay && again.edit == s.edit &&
                 again.hash == s.hash);
    } else if (s.kind == SentinelKind::End) {
      auto again = patcher::parse_sentinel(patcher::end_sentinel("//", indent, s.overlay, s.edit));
      FUZZ_CHECK(again.kind == SentinelKind::End && again.overlay == s.overlay && again.edit == s.edit);
    } else if (s.kind == SentinelKind::NewFile) {
      auto again = patcher::parse_sentinel(patcher::new_file_header("#", s.overlay, s.hash));
      FUZZ_CHECK(again.kind == SentinelKind::NewFile && again.overlay == s.overlay && again.hash == s.hash);
    }
  }

  auto regions = patcher::parse_regions(t.lines, "fuzz.py");
  if (!regions) {
    FUZZ_CHECK(regions.error().kind == patcher::ErrorKind::Tampered);
    return 0;
  }
  for (const auto& r : *regions) {
    FUZZ_CHECK(r.begin < r.end && r.end < t.lines.size());
    const auto b = patcher::parse_sentinel(t.lines[r.begin]);
    const auto e = patcher::parse_sentinel(t.lines[r.end]);
    FUZZ_CHECK(b.kind == SentinelKind::Begin && b.overlay == r.overlay && b.edit == r.edit && b.hash == r.hash);
    FUZZ_CHECK(e.kind == SentinelKind::End && e.overlay == r.overlay && e.edit == r.edit);
    for (const auto& o : *regions) {
      const bool disjoint = o.end < r.begin || r.end < o.begin;
      const bool nested = (o.begin < r.begin && r.end < o.end) || (r.begin < o.begin && o.end < r.end);
      FUZZ_CHECK(&o == &r || disjoint || nested);
    }
  }
  return 0;
}
