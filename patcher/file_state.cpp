// One file's state against the manifests: a target file (its regions
// verified, stripped back to the pin, and rebuilt to tell applied from stale
// or tampered), or a new file (its sentinel header and text hash).
#include <cstdio>
#include <algorithm>
#include <map>

#include "diff.h"
#include "fault.h"
#include "plan.h"
#include "region.h"
#include "sha256.h"
#include "state.h"

namespace patcher {

namespace {

// strip_overlay numbers the lines of the text it was given, from which later
// overlays' regions are already gone; a user looks for the line in the file.
// "line N: region O/E ..." gets the file's own line of that region (the same
// occurrence of O/E, counted in order: stripping does not reorder regions).
std::string with_file_line(const std::string& message, const std::vector<std::string>& given,
                           const std::vector<Region>& in_file, const std::string& path) {
  size_t n = 0, used = 0;
  if (std::sscanf(message.c_str(), "line %zu: region %*s%zn", &n, &used) != 1 || n == 0) return message;
  auto here = parse_regions(given, path);
  if (!here) return message;
  const Region* at = nullptr;
  size_t k = 0;
  for (const Region& r : *here) {
    if (r.begin == n - 1) {
      at = &r;
      break;
    }
  }
  if (!at) return message;
  for (const Region& r : *here)
    if (r.overlay == at->overlay && r.edit == at->edit && r.begin < at->begin) ++k;
  for (const Region& r : in_file) {
    if (r.overlay != at->overlay || r.edit != at->edit) continue;
    if (k-- == 0) return "line " + std::to_string(r.begin + 1) + message.substr(message.find(':'));
  }
  return message;
}

Status check_target_text(const std::string& bytes, const std::string& path) {
  if (auto off = find_invalid_utf8(bytes))
    return make_error(ErrorKind::Usage, path,
                      "target is not valid UTF-8 (line " + std::to_string(line_of_offset(bytes, *off)) + ")");
  if (auto l = find_cr_line(bytes))
    return make_error(ErrorKind::Usage, path,
                      "target has CRLF/CR line endings (line " + std::to_string(*l) +
                          "); the engine edits LF text only");
  return ok_status();
}

// Edit bookkeeping of one overlay in one file, from region counts.
FileOverlay count_edits(const Manifest& m, const FileSpec& spec, const std::string& pristine_text,
                        const std::map<std::string, int>& counts, bool* duplicate) {
  FileOverlay fo;
  fo.overlay = m.overlay;
  int expected_total = 0, present_total = 0, full = 0, with_expect = 0;
  for (const Edit& e : spec.edits) {
    EditState es;
    es.id = e.id;
    bool sup = is_superseded(e, pristine_text);
    es.expected = sup ? 0 : e.occurrences;
    auto it = counts.find(e.id);
    es.present = it == counts.end() ? 0 : it->second;
    if (es.present > es.expected) *duplicate = true;
    es.state = sup ? EditStatus::Superseded : (es.present == es.expected ? EditStatus::Applied : EditStatus::Missing);
    expected_total += es.expected;
    present_total += es.present;
    if (es.expected > 0) {
      ++with_expect;
      if (es.present == es.expected) ++full;
    }
    fo.edits.push_back(es);
  }
  if (expected_total == 0)
    fo.state = FileOverlayStatus::Neutral;
  else if (present_total == 0)
    fo.state = FileOverlayStatus::Pristine;
  else if (full == with_expect)
    fo.state = FileOverlayStatus::Applied;
  else
    fo.state = FileOverlayStatus::Partial;
  return fo;
}

// Tries every overlay on a drifted text, collecting each failing anchor.
void trial_report(const ManifestSet& set, const Text& text, const std::string& path, const std::string& pristine_dir,
                  FileState& fs) {
  Build b = base_build(text);
  std::string raw = join_lines(text);
  for (const Manifest& m : set.overlays) {
    const FileSpec* spec = m.find_file(path);
    if (!spec) continue;
    Build trial = b;
    auto s = apply_overlay(trial, m, *spec, raw, path);
    if (s) {
      b = std::move(trial);
      continue;
    }
    fs.details.push_back(s.error().message);
    for (auto& d : s.error().details) fs.details.push_back("  " + d);
    for (auto& it : s.error().drift) fs.drift.push_back(it);
  }
  if (!fs.details.empty()) return;
  // Every anchor still matches: only the pin is out of date.
  DriftItem it;
  it.file = path;
  it.kind = "pin";
  for (const Manifest& m : set.overlays)
    if (m.find_file(path)) {
      it.manifest = m.file;
      break;
    }
  it.pin_line = "sha256 = \"" + fs.sha + "\"";
  fs.details.push_back("every anchor still matches; review the change, then update the pin in " + it.manifest +
                       " to: " + it.pin_line);
  if (!pristine_dir.empty()) {
    auto dir = Tree::open(pristine_dir);
    auto pristine = dir ? dir->read(path) : Result<std::optional<FileData>>(dir.error());
    if (pristine && pristine->has_value() && kvtier::sha256_hex((*pristine)->bytes) == fs.pin) {
      it.diff = unified_file_diff(split_lines((*pristine)->bytes).lines, text.lines, "pinned/" + path, "tree/" + path);
      fs.details.push_back("  what changed against the pinned file (" + pristine_dir + "):");
      for (auto& d : it.diff) fs.details.push_back("    " + d);
    } else {
      fs.details.push_back("  (no verified pristine copy in " + pristine_dir + " to diff against)");
    }
  }
  fs.drift.push_back(std::move(it));
}

// Which overlays' regions differ between the file and what the manifests
// produce now: each line is owned by its innermost region; an overlay whose
// owned lines differ is stale. When none differs (a region moved), all are.
std::vector<std::string> stale_by_region(const std::vector<std::string>& lines, const std::vector<Region>& regions,
                                         const Build& b, const std::vector<std::string>& applied) {
  std::map<std::string, std::vector<std::string>> have, want;
  std::vector<int> owner(lines.size(), -1);
  for (size_t r = 0; r < regions.size(); ++r)
    for (size_t i = regions[r].begin; i <= regions[r].end && i < lines.size(); ++i) {
      int cur = owner[i];
      if (cur < 0 || regions[r].end - regions[r].begin <
                         regions[static_cast<size_t>(cur)].end - regions[static_cast<size_t>(cur)].begin)
        owner[i] = static_cast<int>(r);
    }
  for (size_t i = 0; i < lines.size(); ++i)
    if (owner[i] >= 0) have[regions[static_cast<size_t>(owner[i])].overlay].push_back(lines[i]);
  for (const auto& l : b.lines)
    if (l.region >= 0) want[b.regions[static_cast<size_t>(l.region)].overlay].push_back(l.text);
  std::vector<std::string> out;
  for (const auto& o : applied)
    if (have[o] != want[o]) out.push_back(o);
  return out.empty() ? applied : out;
}

}  // namespace

Status analyze_file(const Tree& tree, const ManifestSet& set, const std::string& path, FileState& fs,
                    const std::string& pristine_dir) {
  std::vector<const Manifest*> touching;
  for (const auto& m : set.overlays)
    if (const FileSpec* f = m.find_file(path)) {
      touching.push_back(&m);
      fs.pin = f->sha256;
    }
  if (int e = fault("read-target"))  // test hook: an unreadable target
    return make_error(ErrorKind::Io, path, "cannot read: " + errno_text(e));
  auto data = tree.read(path);
  if (!data) return data.error();
  if (!data->has_value()) {
    fs.state = FileStatus::Missing;
    fs.message = "target file does not exist";
    DriftItem it;
    it.file = path;
    it.kind = "missing";
    fs.drift.push_back(it);
    return ok_status();
  }
  fs.exists = true;
  fs.data = std::move(**data);
  if (auto s = check_target_text(fs.data.bytes, path); !s) return s.error();
  fs.sha = kvtier::sha256_hex(fs.data.bytes);
  Text text = split_lines(fs.data.bytes);
  if (fs.sha == fs.pin) {
    for (size_t i = 0; i < text.lines.size(); ++i)
      if (looks_like_sentinel(text.lines[i]))
        return make_error(ErrorKind::Usage, path,
                          "pristine file has a sentinel-looking line " + std::to_string(i + 1) +
                              "; the engine could not tell its regions from upstream text");
  }
  auto regions = parse_regions(text.lines, path);
  if (!regions) {
    fs.state = FileStatus::Tampered;
    fs.message = regions.error().message;
    return ok_status();
  }
  if (regions->empty() && fs.sha != fs.pin) {
    fs.state = FileStatus::Drift;
    fs.message = "sha256 " + fs.sha.substr(0, 16) + "... differs from the pin " + fs.pin.substr(0, 16) +
                 "... and the file has no overlay regions (engine changed?)";
    trial_report(set, text, path, pristine_dir, fs);
    return ok_status();
  }
  for (const Region& r : *regions) {
    const Manifest* owner = set.find(r.overlay);
    if (!owner || !owner->find_file(path)) {
      fs.state = FileStatus::Tampered;
      fs.message = "line " + std::to_string(r.begin + 1) + ": region of overlay \"" + r.overlay +
                   "\", which has no edits for this file";
      return ok_status();
    }
  }
  // Strip in reverse stacking order: later overlays may sit inside earlier ones.
  std::vector<std::string> lines = text.lines;
  std::vector<std::map<std::string, int>> counts(touching.size());
  for (size_t k = touching.size(); k-- > 0;) {
    const Manifest& m = *touching[k];
    auto stripped = strip_overlay(lines, m, *m.find_file(path), path, &counts[k]);
    if (!stripped) {
      fs.state = FileStatus::Tampered;
      fs.message = with_file_line(stripped.error().message, lines, *regions, path);
      return ok_status();
    }
    lines = std::move(*stripped);
  }
  fs.projection = Text{lines, text.trailing_newline};
  std::string proj = join_lines(fs.projection);
  if (kvtier::sha256_hex(proj) != fs.pin) {
    fs.state = FileStatus::Tampered;
    fs.message = "text outside the overlay regions differs from the pristine pin (edited by hand?)";
    return ok_status();
  }
  bool duplicate = false, partial = false;
  int applied = 0, pristine = 0;
  for (size_t k = 0; k < touching.size(); ++k) {
    FileOverlay fo = count_edits(*touching[k], *touching[k]->find_file(path), proj, counts[k], &duplicate);
    if (fo.state == FileOverlayStatus::Partial) partial = true;
    if (fo.state == FileOverlayStatus::Applied) {
      ++applied;
      fs.applied.push_back(fo.overlay);
    }
    if (fo.state == FileOverlayStatus::Pristine) ++pristine;
    fs.overlays.push_back(std::move(fo));
  }
  if (duplicate) {
    fs.state = FileStatus::Tampered;
    fs.message = "an edit's region appears more often than the manifest allows (duplicated region)";
    return ok_status();
  }
  if (partial) {
    fs.state = FileStatus::Partial;
    fs.message = "some regions of an overlay are present and some are missing (half-applied)";
    return ok_status();
  }
  // The regions must be exactly what the manifests produce from the pristine text.
  Build b = base_build(fs.projection);
  for (const Manifest* m : touching) {
    if (std::find(fs.applied.begin(), fs.applied.end(), m->overlay) == fs.applied.end()) continue;
    auto s = apply_overlay(b, *m, *m->find_file(path), proj, path);
    if (!s) {
      fs.state = FileStatus::Stale;
      fs.stale_overlays = {m->overlay};
      fs.message = "the regions of overlay " + m->overlay + " are intact, but its manifest no longer produces them (" +
                   s.error().message + "); revert it, then apply again";
      fs.details = s.error().details;
      return ok_status();
    }
  }
  if (b.text() != fs.data.bytes) {
    fs.state = FileStatus::Stale;
    fs.stale_overlays = stale_by_region(text.lines, *regions, b, fs.applied);
    std::string list;
    for (const auto& o : fs.stale_overlays) list += (list.empty() ? "" : ", ") + o;
    fs.message = "the regions of " + list +
                 " are intact, but differ from what the manifests and fragments produce now (fragment changed or "
                 "region moved); revert, then apply again";
    return ok_status();
  }
  // Some overlays applied and others not is still "applied" for the file: the
  // per-overlay states tell which.
  fs.state = applied == 0 ? FileStatus::Pristine : FileStatus::Applied;
  return ok_status();
}

Status analyze_new_file(const Tree& tree, const Manifest& m, const NewFile& nf, FileState& fs) {
  fs.is_new = true;
  auto data = tree.read(nf.path);
  if (!data) return data.error();
  FileOverlay fo;
  fo.overlay = m.overlay;
  if (!data->has_value()) {
    fs.state = FileStatus::Absent;
    fo.state = FileOverlayStatus::Pristine;
    fs.overlays.push_back(fo);
    return ok_status();
  }
  fs.exists = true;
  fs.data = std::move(**data);
  fs.sha = kvtier::sha256_hex(fs.data.bytes);
  const std::string& bytes = fs.data.bytes;
  size_t nl = bytes.find('\n');
  std::string first = bytes.substr(0, nl);
  std::string rest = nl == std::string::npos ? std::string() : bytes.substr(nl + 1);
  Sentinel s = parse_sentinel(first);
  if (s.kind != SentinelKind::NewFile || s.overlay != m.overlay) {
    fs.state = FileStatus::Tampered;
    fs.message = "file exists but was not created by overlay " + m.overlay + " (no sentinel header)";
    return ok_status();
  }
  if (text_hash(rest) != s.hash) {
    fs.state = FileStatus::Tampered;
    fs.message = "file was edited by hand (header hash " + s.hash + ", text hash " + text_hash(rest) + ")";
    return ok_status();
  }
  if (rest != nf.text) {
    fs.state = FileStatus::Stale;
    fs.message = "file is intact but differs from its current source " + nf.source + "; revert, then apply again";
    return ok_status();
  }
  fs.state = FileStatus::Present;
  fo.state = FileOverlayStatus::Applied;
  fs.overlays.push_back(fo);
  return ok_status();
}

}  // namespace patcher
