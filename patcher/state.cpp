// The state of a whole tree: every file (file_state.cpp, built.h), any pending
// transaction, and from them each overlay's state.
#include "state.h"

#include <sys/stat.h>

#include <algorithm>
#include <set>

#include "built.h"
#include "cxx_backend.h"
#include "paths.h"
#include "sentinel.h"

namespace patcher {

namespace {

// Beside every file the set manages, a file whose first line is an overlay's
// new-file header but which no manifest names: nothing would ever remove it.
// A transaction's own temps and saved old bytes carry that header too; they
// are leftovers (ts.leftovers, read first), each with its fate, not strays.
Status find_strays(const Tree& tree, TreeState& ts) {
  std::set<std::string> known, dirs;
  for (const auto& l : ts.leftovers) known.insert(l.path);
  for (const auto& f : ts.files) {
    known.insert(f.path);
    dirs.insert(dir_name(f.path));
  }
  for (const auto& d : dirs) {
    auto dir = d.empty() ? Result<std::optional<Fd>>(std::optional<Fd>()) : tree.open_parent(d + "/x");
    if (!dir) return dir.error();
    if (!d.empty() && !dir->has_value()) continue;  // the folder is gone
    auto names = list_dir(d.empty() ? tree.fd() : (*dir)->get(), d.empty() ? "." : d);
    if (!names) return names.error();
    for (const auto& n : *names) {
      std::string rel = d.empty() ? n : d + "/" + n;
      if (known.count(rel)) continue;
      auto t = tree.type(rel);
      if (!t || *t != S_IFREG) continue;
      auto data = tree.read(rel);
      if (!data || !data->has_value()) continue;
      const std::string& bytes = (*data)->bytes;
      Sentinel h = parse_sentinel(std::string_view(bytes).substr(0, bytes.find('\n')));
      if (h.kind != SentinelKind::NewFile) continue;
      ts.strays.push_back(Leftover{rel, "stray overlay file",
                                   "created by overlay " + h.overlay +
                                       ", but no manifest here names it, so nothing removes it: delete it by hand "
                                       "(or revert with the manifests that applied it)"});
    }
  }
  return ok_status();
}

// A folder the engine created (it holds the marker) in which no new file of
// the set is present any more: what an interrupted or older revert left
// behind (the marker, files a bake installed there). A pristine tree holds
// none; the next revert removes it when nothing but recorded files are in it.
Status find_leftover_folders(const Tree& tree, TreeState& ts) {
  std::set<std::string> dirs, live;
  for (const auto& f : ts.files) {
    if (!f.is_new) continue;
    for (std::string d = dir_name(f.path); !d.empty(); d = dir_name(d)) {
      dirs.insert(d);
      if (f.exists) live.insert(d);
    }
  }
  for (const auto& d : dirs) {
    if (live.count(d)) continue;
    auto t = tree.type(d + "/" + kDirMarker);
    if (!t) return t.error();
    if (*t != S_IFREG) continue;
    ts.strays.push_back(Leftover{d, "leftover overlay folder",
                                 "the overlay created it and none of its files is there any more: `overlay "
                                 "revert` removes it with what a bake installed in it (its .overlay-installed "
                                 "record); anything else in it, remove by hand"});
  }
  return ok_status();
}

// Up to three paths, and how many more.
std::string some_of(const std::vector<std::string>& paths) {
  std::string out;
  for (size_t i = 0; i < paths.size() && i < 3; ++i) out += (i ? ", " : "") + paths[i];
  if (paths.size() > 3) out += " and " + std::to_string(paths.size() - 3) + " more";
  return out;
}

}  // namespace

const char* edit_status_name(EditStatus s) {
  switch (s) {
    case EditStatus::Applied: return "applied";
    case EditStatus::Missing: return "missing";
    case EditStatus::Superseded: return "superseded";
  }
  return "?";
}

const char* file_overlay_status_name(FileOverlayStatus s) {
  switch (s) {
    case FileOverlayStatus::Pristine: return "pristine";
    case FileOverlayStatus::Applied: return "applied";
    case FileOverlayStatus::Partial: return "partial";
    case FileOverlayStatus::Neutral: return "neutral";
  }
  return "?";
}

const char* file_status_name(FileStatus s) {
  switch (s) {
    case FileStatus::Pristine: return "pristine";
    case FileStatus::Applied: return "applied";
    case FileStatus::Partial: return "partial";
    case FileStatus::Tampered: return "tampered";
    case FileStatus::Stale: return "stale";
    case FileStatus::Drift: return "drift";
    case FileStatus::Missing: return "missing";
    case FileStatus::Absent: return "absent";
    case FileStatus::Present: return "present";
    case FileStatus::BuildInput: return "build-input";
  }
  return "?";
}

const char* overlay_status_name(OverlayStatus s) {
  switch (s) {
    case OverlayStatus::Pristine: return "pristine";
    case OverlayStatus::Applied: return "applied";
    case OverlayStatus::HalfApplied: return "half-applied";
    case OverlayStatus::Tampered: return "tampered";
    case OverlayStatus::Stale: return "stale";
    case OverlayStatus::Drift: return "drift";
    case OverlayStatus::Superseded: return "superseded";
    case OverlayStatus::Absent: return "absent";
  }
  return "?";
}

const OverlayState* TreeState::overlay(const std::string& name) const {
  auto it = std::ranges::find(overlays, name, &OverlayState::name);
  return it == overlays.end() ? nullptr : &*it;
}

const FileState* TreeState::file(const std::string& path) const {
  auto it = std::ranges::find(files, path, &FileState::path);
  return it == files.end() ? nullptr : &*it;
}

Result<TreeState> analyze(const Tree& tree, const ManifestSet& set, const std::string& pristine_dir) {
  TreeState ts;
  std::vector<std::string> targets;
  for (const auto& m : set.overlays)
    for (const auto& f : m.files)
      if (std::find(targets.begin(), targets.end(), f.path) == targets.end()) targets.push_back(f.path);
  // On a wheel install an overlay with [[built_files]] has its C/C++ sources
  // and new files outside the tree: they are build inputs (built.h).
  std::set<std::string> build_inputs;
  for (const auto& m : set.overlays) {
    auto wheel = built::wheel_mode(tree, m);
    if (!wheel) return wheel.error();
    if (!*wheel) continue;
    for (const auto& f : m.files)
      if (cxx::is_cxx(f.path)) build_inputs.insert(f.path);
    for (const auto& nf : m.new_files)
      if (cxx::is_cxx(nf.path)) build_inputs.insert(nf.path);
  }
  auto as_build_input = [](FileState& fs) {
    fs.state = FileStatus::BuildInput;
    fs.message = "not in this tree (a wheel install): patched in memory and built into a [[built_files]] binary";
  };
  for (const auto& p : targets) {
    FileState fs;
    fs.path = p;
    if (build_inputs.count(p)) as_build_input(fs);
    else if (auto st = analyze_file(tree, set, p, fs, pristine_dir); !st) return st.error();
    ts.files.push_back(std::move(fs));
  }
  for (const auto& m : set.overlays)
    for (const auto& nf : m.new_files) {
      FileState fs;
      fs.path = nf.path;
      fs.is_new = true;
      if (build_inputs.count(nf.path)) as_build_input(fs);
      else if (auto st = analyze_new_file(tree, m, nf, fs); !st) return st.error();
      ts.files.push_back(std::move(fs));
    }
  for (const auto& m : set.overlays) {
    auto wheel = built::wheel_mode(tree, m);
    if (!wheel) return wheel.error();
    if (!*wheel) continue;  // a source tree: its own build makes the binary
    for (const auto& bf : m.built_files) {
      FileState fs;
      fs.path = bf.path;
      if (auto st = built::analyze(tree, m, bf, fs); !st) return st.error();
      ts.files.push_back(std::move(fs));
    }
  }
  std::vector<std::string> paths;
  for (const auto& f : ts.files) {
    paths.push_back(f.path);
    if (f.is_built) {
      paths.push_back(built::backup_path(f.path));
      paths.push_back(built::record_path(f.path));
    }
  }
  auto pending = inspect(tree, paths);
  if (!pending) return pending.error();
  ts.journal = pending->journal;
  ts.journal_problems = pending->blockers();
  ts.leftovers = pending->leftovers;
  if (auto st = find_strays(tree, ts); !st) return st.error();
  if (auto st = find_leftover_folders(tree, ts); !st) return st.error();
  for (const auto& l : ts.leftovers)
    if (l.what == "temp" || l.what == "staging folder") ts.stray_temps.push_back(l.path);
  // Per overlay.
  for (const auto& m : set.overlays) {
    OverlayState os;
    os.name = m.overlay;
    os.summary = m.summary;
    os.after = m.after;
    bool absent_built = false;  // a [[built_files]] binary missing along with its sources
    int applied = 0, pristine = 0, neutral = 0;
    std::vector<std::string> with, without;  // files that carry it / do not
    bool drift = false, tampered = false, half = false, stale = false;
    auto visit = [&](const FileState& fs) {
      bool mine = false;
      if (fs.state == FileStatus::BuildInput) return;  // judged through its built file
      if (fs.is_built && fs.state == FileStatus::Absent && m.find_built(fs.path)) {
        absent_built = true;
        return;
      }
      if (fs.is_built) {
        mine = m.find_built(fs.path) != nullptr;
      } else if (fs.is_new) {
        for (const auto& nf : m.new_files) mine |= nf.path == fs.path;
      } else {
        mine = m.find_file(fs.path) != nullptr;
      }
      if (!mine) return;
      if (fs.state == FileStatus::Drift || fs.state == FileStatus::Missing) {
        drift = true;
        os.problems.push_back(fs.path + ": " + fs.message);
        return;
      }
      if (fs.state == FileStatus::Tampered) {
        tampered = true;
        os.problems.push_back(fs.path + ": " + fs.message);
        return;
      }
      if (fs.state == FileStatus::Partial) os.problems.push_back(fs.path + ": " + fs.message);
      bool stale_here = fs.state == FileStatus::Stale &&
                        (fs.is_new || std::find(fs.stale_overlays.begin(), fs.stale_overlays.end(), m.overlay) !=
                                          fs.stale_overlays.end());
      if (stale_here) {
        stale = true;
        os.problems.push_back(fs.path + ": " + fs.message);
        return;
      }
      for (const auto& fo : fs.overlays) {
        if (fo.overlay != m.overlay) continue;
        if (fo.state == FileOverlayStatus::Applied) ++applied, with.push_back(fs.path);
        if (fo.state == FileOverlayStatus::Pristine) ++pristine, without.push_back(fs.path);
        if (fo.state == FileOverlayStatus::Neutral) ++neutral;
        if (fo.state == FileOverlayStatus::Partial) half = true;
        for (const auto& e : fo.edits)
          if (e.state == EditStatus::Superseded) os.superseded.push_back(fs.path + ": " + e.id);
      }
    };
    for (const auto& fs : ts.files) visit(fs);
    if (drift)
      os.state = OverlayStatus::Drift;
    else if (tampered)
      os.state = OverlayStatus::Tampered;
    else if (stale)
      os.state = OverlayStatus::Stale;
    else if (half || (applied && pristine)) {
      os.state = OverlayStatus::HalfApplied;
      if (!half)
        os.problems.push_back(without.front() + ": does not carry this overlay, which " + some_of(with) +
                              (with.size() == 1 ? " carries" : " carry") +
                              (without.size() > 1 ? " (nor do " + some_of({without.begin() + 1, without.end()}) + ")"
                                                  : std::string()) +
                              "; put the file back as the overlay left it, or reinstall the engine wheel and apply "
                              "again");
    } else if (applied)
      os.state = OverlayStatus::Applied;
    else if (pristine)
      os.state = OverlayStatus::Pristine;
    else if (absent_built) {
      os.state = OverlayStatus::Absent;  // check accepts it like superseded; status says why
      os.problems.push_back("neither its C/C++ sources nor the binary built from them is in this tree");
    } else
      os.state = OverlayStatus::Superseded;
    ts.overlays.push_back(std::move(os));
  }
  // An applied overlay whose `after` dependency is not applied is inconsistent.
  for (auto& os : ts.overlays) {
    if (os.state != OverlayStatus::Applied) continue;
    for (const auto& a : os.after) {
      const OverlayState* dep = ts.overlay(a);
      if (dep && dep->state == OverlayStatus::Pristine) {
        os.problems.push_back("applied, but overlay " + a + " it stacks on (after) is not");
        os.state = OverlayStatus::Tampered;
      }
    }
  }
  return ts;
}

}  // namespace patcher
