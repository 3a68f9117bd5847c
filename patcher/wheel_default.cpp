#include "wheel_default.h"

namespace patcher {

DefaultSet wheel_default_set(const ManifestSet& set, bool with_binaries, const TreeState* state) {
  DefaultSet out;
  for (const auto& m : set.overlays) {
    bool keep = with_binaries || m.built_files.empty();
    if (!keep && state != nullptr)
      if (const OverlayState* os = state->overlay(m.overlay))
        keep = os->state != OverlayStatus::Pristine && os->state != OverlayStatus::Absent;
    if (keep) {
      out.overlays.push_back(m.overlay);
      continue;
    }
    std::string paths;
    for (const auto& bf : m.built_files) paths += (paths.empty() ? "" : ", ") + bf.path;
    out.left_out.push_back(m.overlay + " (rebuilds " + paths + ")");
  }
  return out;
}

}  // namespace patcher
