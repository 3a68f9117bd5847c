// What `overlay revert` (and `overlay plan --revert`) would write: the
// selected overlays' regions stripped, their new files deleted, built
// binaries restored, and the folders they created removed once empty.
#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "engine_steps.h"
#include "fmt/format.h"
#include "plan.h"
#include "region.h"
#include "text.h"

namespace patcher::engine_steps {

namespace {

// After the deletions of a revert: every folder the engine created (it holds
// the marker) that would then hold nothing else is removed, deepest first.
// Besides what the revert deletes, it may hold what a bake installed there
// and recorded (installed_files): those go with it. The folders of every
// selected overlay's new files are looked at, also when the files are gone
// already (a revert before this rule left such folders behind).
Status plan_rmdirs(const Session& s, const Tree& tree, Prepared& p) {
  std::set<std::string> gone;
  std::vector<std::string> folders;
  auto add_folders_of = [&](const std::string& path) {
    for (std::string d = dir_name(path); !d.empty(); d = dir_name(d))
      if (std::find(folders.begin(), folders.end(), d) == folders.end()) folders.push_back(d);
  };
  for (const auto& c : p.changes) {
    if (c.kind != Change::Delete) continue;
    gone.insert(c.path);
    add_folders_of(c.path);
  }
  for (const auto& name : p.out.selected)
    for (const auto& nf : s.set.get(name).new_files) add_folders_of(nf.path);
  auto depth = [](const std::string& d) { return std::count(d.begin(), d.end(), '/'); };
  std::stable_sort(folders.begin(), folders.end(),
                   [&](const std::string& a, const std::string& b) { return depth(a) > depth(b); });
  for (const auto& d : folders) {
    std::string marker = d + "/" + kDirMarker;
    auto t = tree.type(marker);
    if (!t) return t.error();
    if (*t != S_IFREG) continue;  // not created by the engine: never removed
    auto dir = tree.open_parent(marker);
    if (!dir) return dir.error();
    if (!dir->has_value()) continue;
    auto names = list_dir((*dir)->get(), d);
    if (!names) return names.error();
    std::vector<std::string> installed = installed_files((*dir)->get());
    bool empty = true;
    for (const auto& n : *names)
      empty &= n == kDirMarker || gone.count(d + "/" + n) > 0 ||
               std::find(installed.begin(), installed.end(), n) != installed.end();
    if (!empty) continue;
    gone.insert(d);
    std::vector<std::string> notes{"- folder created by overlay, now empty"};
    if (!installed.empty()) {
      std::string list;
      for (const auto& n : installed) list += (list.empty() ? "" : ", ") + n;
      notes.push_back("- with the files a bake installed in it, as its record lists them: " + list);
    }
    p.out.changes.push_back(FileChangeReport{d, "rmdir", notes, "", ""});
    p.changes.push_back(rmdir_change(d));
  }
  return ok_status();
}

}  // namespace

// revert --new-files-only: the selected overlays' new files that still carry
// their intact header (present or stale), whatever the engine's own files
// say; a new file edited by hand is kept and named. Then the folders.
Status prepare_new_files_only(const Session& s, Prepared& p) {
  const TreeState& ts = p.out.state;
  for (const auto& name : p.out.selected) {
    const Manifest& m = s.set.get(name);
    for (const auto& nf : m.new_files) {
      const FileState* fs = ts.file(nf.path);
      if (fs == nullptr || !fs->exists) continue;
      if (fs->state != FileStatus::Present && fs->state != FileStatus::Stale) {
        p.out.notes.push_back(nf.path + ": kept: " + fs->message + "; remove it by hand if it is the overlay's");
        continue;
      }
      p.out.changes.push_back(FileChangeReport{nf.path, "delete", {"- new file of " + m.overlay}, fs->data.bytes, ""});
      p.changes.push_back(delete_change(nf.path, fs->sha));
    }
  }
  return plan_rmdirs(s, s.tree, p);
}

Status prepare_revert(const Session& s, const Request& r, Prepared& p) {
  if (r.new_files_only) return prepare_new_files_only(s, p);
  const TreeState& ts = p.out.state;
  const std::vector<std::string>& sel = p.out.selected;
  // Refuse to pull an overlay out from under one that stacks on it.
  for (const auto& name : sel)
    for (const auto& os : ts.overlays) {
      if (contains(sel, os.name) || !contains(os.after, name)) continue;
      if (os.state == OverlayStatus::Pristine || os.state == OverlayStatus::Superseded) continue;
      const Manifest& m = s.set.get(os.name);
      return make_error(ErrorKind::Usage, m.file,
                        "cannot revert " + name + ": overlay " + os.name + " is " + overlay_status_name(os.state) +
                            " and stacks on it (after = [\"" + name + "\"]); revert " + os.name +
                            " first or both together");
    }
  if (auto st = require_consistent(ts, sel, s.set, /*allow_stale=*/true); !st) return st.error();
  for (const auto& os : ts.overlays) {
    if (!contains(sel, os.name)) continue;
    if (os.state == OverlayStatus::Absent)
      p.out.absent.push_back(os.name);
    else if (os.state == OverlayStatus::Pristine || os.state == OverlayStatus::Superseded)
      p.out.skipped.push_back(os.name);
  }
  // Revert strips the selected overlays' verified regions (later overlays
  // first), so it also works when fragments changed since the apply.
  for (const auto& fs : ts.files) {
    if (fs.is_new || fs.is_built || !fs.exists) continue;
    Text text = split_lines(fs.data.bytes);
    std::vector<std::string> lines = text.lines;
    std::vector<std::string> notes;
    auto regions = parse_regions(lines, fs.path);
    if (!regions) return regions.error();
    for (const auto& rg : *regions)
      if (contains(sel, rg.overlay)) notes.push_back(fmt::format("- {}/{} at line {}", rg.overlay, rg.edit, rg.begin + 1));
    if (notes.empty()) continue;
    for (size_t k = s.set.overlays.size(); k-- > 0;) {
      const Manifest& m = s.set.overlays[k];
      const FileSpec* spec = m.find_file(fs.path);
      if (!spec || !contains(sel, m.overlay)) continue;
      auto stripped = strip_overlay(lines, m, *spec, fs.path, nullptr);
      if (!stripped) return stripped.error();
      lines = std::move(*stripped);
    }
    std::string new_text = join_lines(lines, text.trailing_newline);
    p.out.changes.push_back(FileChangeReport{fs.path, "patch", notes, fs.data.bytes, new_text});
    p.changes.push_back(write_change(fs.path, fs.data, new_text));
  }
  for (const auto& name : sel) {
    const Manifest& m = s.set.get(name);
    for (const auto& nf : m.new_files) {
      const FileState* fs = ts.file(nf.path);
      if (fs->state != FileStatus::Present && fs->state != FileStatus::Stale) continue;
      p.out.changes.push_back(FileChangeReport{nf.path, "delete", {"- new file of " + m.overlay}, fs->data.bytes, ""});
      p.changes.push_back(delete_change(nf.path, fs->sha));
    }
    for (const auto& bf : m.built_files) {  // wheel install: the original binary goes back
      const FileState* fs = ts.file(bf.path);
      if (!fs || !fs->is_built || fs->state != FileStatus::Applied) continue;
      auto ch = built::revert_changes(s.tree, bf, *fs);
      if (!ch) return ch.error();
      p.out.changes.push_back(FileChangeReport{bf.path, "restore", {"- original binary of " + m.overlay + " restored"}, "", ""});
      for (auto& c : *ch) p.changes.push_back(std::move(c));
    }
  }
  if (auto st = plan_rmdirs(s, s.tree, p); !st) return st.error();
  return ok_status();
}

}  // namespace patcher::engine_steps
