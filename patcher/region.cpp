#include "region.h"

#include <algorithm>

#include "text.h"

namespace patcher {

Result<std::vector<Region>> parse_regions(const std::vector<std::string>& lines, const std::string& file) {
  std::vector<Region> out;
  std::vector<Region> stack;
  for (size_t i = 0; i < lines.size(); ++i) {
    Sentinel s = parse_sentinel(lines[i]);
    switch (s.kind) {
      case SentinelKind::None:
        break;
      case SentinelKind::Malformed:
      case SentinelKind::NewFile:
        return make_error(ErrorKind::Tampered, file,
                          "line " + std::to_string(i + 1) + ": malformed overlay sentinel: " +
                              std::string(trim(lines[i])));
      case SentinelKind::Begin:
        stack.push_back(Region{s.overlay, s.edit, s.hash, i, 0});
        break;
      case SentinelKind::End: {
        if (stack.empty())
          return make_error(ErrorKind::Tampered, file,
                            "line " + std::to_string(i + 1) + ": end sentinel of " + s.overlay + "/" + s.edit +
                                " without a begin sentinel");
        Region r = stack.back();
        if (r.overlay != s.overlay || r.edit != s.edit)
          return make_error(ErrorKind::Tampered, file,
                            "line " + std::to_string(i + 1) + ": end sentinel of " + s.overlay + "/" + s.edit +
                                " does not close " + r.overlay + "/" + r.edit + " opened at line " +
                                std::to_string(r.begin + 1));
        stack.pop_back();
        r.end = i;
        out.push_back(r);
        break;
      }
    }
  }
  if (!stack.empty())
    return make_error(ErrorKind::Tampered, file,
                      "line " + std::to_string(stack.back().begin + 1) + ": begin sentinel of " +
                          stack.back().overlay + "/" + stack.back().edit + " has no end sentinel");
  return out;
}

Result<std::vector<std::string>> strip_overlay(const std::vector<std::string>& lines, const Manifest& m,
                                               const FileSpec& spec, const std::string& file,
                                               std::map<std::string, int>* counts) {
  auto regions = parse_regions(lines, file);
  if (!regions) return regions.error();
  std::vector<const Region*> mine;
  for (const Region& r : *regions) {
    if (r.overlay != m.overlay) continue;
    mine.push_back(&r);
  }
  // Regions come out ordered by their end; an overlay's own regions never nest.
  std::vector<std::string> out;
  size_t next = 0;
  std::vector<const Region*> sorted = mine;
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (const Region* r : sorted) {
    if (r->begin < next)
      return make_error(ErrorKind::Tampered, file,
                        "line " + std::to_string(r->begin + 1) + ": region " + r->overlay + "/" + r->edit +
                            " is nested inside another region of the same overlay");
    const Edit* edit = nullptr;
    for (const Edit& e : spec.edits)
      if (e.id == r->edit) edit = &e;
    if (!edit)
      return make_error(ErrorKind::Tampered, file,
                        "line " + std::to_string(r->begin + 1) + ": region " + r->overlay + "/" + r->edit +
                            " names an edit the manifest does not have for this file");
    std::vector<std::string> body(lines.begin() + static_cast<long>(r->begin) + 1,
                                  lines.begin() + static_cast<long>(r->end));
    for (const std::string& b : body)
      if (looks_like_sentinel(b))
        return make_error(ErrorKind::Tampered, file,
                          "line " + std::to_string(r->begin + 1) + ": region " + r->overlay + "/" + r->edit +
                              " still contains another overlay's region; strip order is broken");
    std::string h = region_hash(body);
    if (h != r->hash)
      return make_error(ErrorKind::Tampered, file,
                        "line " + std::to_string(r->begin + 1) + ": region " + r->overlay + "/" + r->edit +
                            " was edited by hand (sentinel hash " + r->hash + ", text hash " + h + ")");
    out.insert(out.end(), lines.begin() + static_cast<long>(next), lines.begin() + static_cast<long>(r->begin));
    if (edit->action == Action::Replace) out.insert(out.end(), edit->anchor_lines.begin(), edit->anchor_lines.end());
    next = r->end + 1;
    if (counts) ++(*counts)[r->edit];
  }
  out.insert(out.end(), lines.begin() + static_cast<long>(next), lines.end());
  return out;
}

}  // namespace patcher
