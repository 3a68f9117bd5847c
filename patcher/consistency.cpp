// Refusals shared by apply, revert and check: a pending transaction, drift,
// tampered, half-applied or stale overlays. Nothing is written before these pass.
#include <string>
#include <vector>

#include "engine_steps.h"

namespace patcher::engine_steps {

Status require_consistent(const TreeState& ts, const std::vector<std::string>& selected, const ManifestSet& set,
                          bool allow_stale, bool rebuilds) {
  if (ts.journal) {
    Error e = make_error(ErrorKind::Tampered, kJournalName,
                         ts.journal_problems.empty()
                             ? "an interrupted transaction is pending; `overlay recover` (or apply or revert) "
                               "finishes it"
                             : "an interrupted transaction is pending and cannot be finished; `overlay recover "
                               "--discard` rolls it back");
    e.details = ts.journal_problems;
    return e;
  }
  // One block per drifted file, however many overlays share it.
  Error drift = make_error(ErrorKind::Drift, "", "");
  std::vector<std::string> files;
  for (const auto& fs : ts.files) {
    if (fs.state != FileStatus::Drift && fs.state != FileStatus::Missing) continue;
    bool mine = false;
    for (const auto& name : selected)
      mine |= set.get(name).find_file(fs.path) != nullptr || set.get(name).find_built(fs.path) != nullptr;
    if (!mine) continue;
    files.push_back(fs.path);
    drift.details.push_back(fs.path + ": " + fs.message);
    for (const auto& d : fs.details) drift.details.push_back("  " + d);
    drift.drift.insert(drift.drift.end(), fs.drift.begin(), fs.drift.end());
  }
  if (files.size() == 1) {
    drift.file = files.front();
    drift.message = "drift: " + ts.file(files.front())->message;
  } else if (!files.empty()) {
    std::string list;
    for (const auto& f : files) list += (list.empty() ? "" : ", ") + f;
    drift.message = "drift in " + std::to_string(files.size()) + " files: " + list;
  }
  if (!drift.message.empty()) return drift;
  // A file whose other overlay is stale cannot be rebuilt without losing or
  // silently refreshing that overlay's regions.
  if (rebuilds)
    for (const auto& fs : ts.files) {
      if (fs.state != FileStatus::Stale || fs.is_new) continue;
      std::string list;  // stale overlays the caller did not select (selected ones are refused below)
      for (const auto& o : fs.stale_overlays)
        if (!contains(selected, o)) list += (list.empty() ? "" : ", ") + o;
      if (list.empty()) continue;
      for (const auto& name : selected) {
        if (!set.get(name).find_file(fs.path)) continue;
        return make_error(ErrorKind::Tampered, fs.path,
                          "overlay " + list + " is stale in this file, which overlay " + name +
                              " also edits; revert " + list + ", then apply again");
      }
    }
  for (const auto& name : selected) {
    const OverlayState* os = ts.overlay(name);
    if (os->state == OverlayStatus::Tampered || os->state == OverlayStatus::HalfApplied ||
        (os->state == OverlayStatus::Stale && !allow_stale)) {
      std::string first = os->problems.empty() ? "" : os->problems.front();
      size_t colon = first.find(": ");
      std::string file = colon == std::string::npos ? "" : first.substr(0, colon);
      std::string msg = colon == std::string::npos ? first : first.substr(colon + 2);
      Error e = make_error(ErrorKind::Tampered, file,
                           "overlay " + name + " is " + overlay_status_name(os->state) + ": " + msg +
                               "; refusing to touch the tree");
      e.details = os->problems;
      return e;
    }
  }
  return ok_status();
}

}  // namespace patcher::engine_steps
