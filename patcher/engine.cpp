// Why one file over 500 lines: every verb (status, plan, apply, check, revert, recover) runs
// the same lock -> analyze -> preflight -> transaction sequence; one file keeps that order visible.
#include "engine.h"

#include <sys/file.h>

#include <cerrno>

#include <algorithm>
#include <map>
#include <set>

#include "built.h"
#include "cxx_backend.h"
#include "fmt/format.h"
#include "plan.h"
#include "region.h"
#include "sha256.h"
#include "text.h"
#include "txn.h"

namespace patcher {

Result<std::vector<std::string>> select_overlays(const ManifestSet& set, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const auto& n : names)
    if (!set.find(n))
      return make_error(ErrorKind::Usage, set.dir, "--overlays names \"" + n + "\", which has no manifest here");
  for (const auto& m : set.overlays)
    if (names.empty() || std::find(names.begin(), names.end(), m.overlay) != names.end()) out.push_back(m.overlay);
  return out;
}

namespace {

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::vector<std::string> all_paths(const ManifestSet& set) {
  std::vector<std::string> out;
  for (const auto& m : set.overlays) {
    for (const auto& f : m.files) out.push_back(f.path);
    for (const auto& nf : m.new_files) out.push_back(nf.path);
    for (const auto& bf : m.built_files)
      for (const auto& p : {bf.path, built::backup_path(bf.path), built::record_path(bf.path)}) out.push_back(p);
  }
  return out;
}

// Turns bad overlay states into the error apply/revert/check must stop on.
Status require_consistent(const TreeState& ts, const std::vector<std::string>& selected, const ManifestSet& set,
                          bool allow_stale = false, bool rebuilds = false) {
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

// Texts of every file after the wanted set of overlays is in place.
Result<std::vector<FileChangeReport>> rebuild(const Session& s, const TreeState& ts,
                                              const std::vector<std::string>& wanted,
                                              const std::vector<std::string>& touched,
                                              std::vector<Change>* changes) {
  std::vector<FileChangeReport> out;
  for (const auto& fs : ts.files) {
    if (fs.is_new || fs.is_built || fs.state == FileStatus::BuildInput) continue;
    bool relevant = false;
    for (const auto& name : touched)
      if (s.set.get(name).find_file(fs.path)) relevant = true;
    if (!relevant) continue;
    std::string pristine = join_lines(fs.projection);
    Build b = base_build(fs.projection);
    std::vector<std::string> notes;
    for (const auto& m : s.set.overlays) {
      const FileSpec* spec = m.find_file(fs.path);
      if (!spec || !contains(wanted, m.overlay)) continue;
      if (auto st = apply_overlay(b, m, *spec, pristine, fs.path); !st) return st.error();
      for (const Edit& e : spec->edits)
        if (is_superseded(e, pristine)) notes.push_back("= " + m.overlay + "/" + e.id + " superseded upstream");
    }
    for (size_t i = 0; i < b.lines.size(); ++i) {
      int r = b.lines[i].region;
      if (r < 0) continue;
      Sentinel sn = parse_sentinel(b.lines[i].text);
      if (sn.kind == SentinelKind::Begin && contains(touched, sn.overlay))
        notes.push_back(fmt::format("+ {}/{} at line {}", sn.overlay, sn.edit, i + 1));
    }
    std::string text = b.text();
    if (text == fs.data.bytes) continue;
    FileChangeReport fc{fs.path, "patch", notes, fs.data.bytes, text};
    out.push_back(fc);
    if (changes) changes->push_back(write_change(fs.path, fs.data, text));
  }
  return out;
}

std::string new_file_text(const std::string& path, const Manifest& m, const NewFile& nf) {
  return new_file_header(comment_prefix(path), m.overlay, text_hash(nf.text)) + "\n" + nf.text;
}

bool is_python(const std::string& path) { return path.size() > 3 && path.substr(path.size() - 3) == ".py"; }

// Innermost region holding 1-based `line` of `text`.
std::string region_in_text(const std::string& text, int line, const std::string& path) {
  auto regions = parse_regions(split_lines(text).lines, path);
  if (!regions) return "";
  std::string best;
  size_t best_len = SIZE_MAX;
  for (const auto& r : *regions) {
    size_t l = static_cast<size_t>(line) - 1;
    if (r.begin <= l && l <= r.end && r.end - r.begin < best_len) {
      best = r.overlay + "/" + r.edit;
      best_len = r.end - r.begin;
    }
  }
  return best;
}

// Compiles the given file texts and the selected overlays' fragments.
// C/C++ files among `files` (patched texts), each with the C/C++ new files
// of its overlay mapped beside it, for one syntax-only Clang parse each.
std::vector<cxx::CheckUnit> cxx_units(const Session& s, const std::vector<std::string>& selected,
                                      const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<cxx::CheckUnit> out;
  for (const auto& [path, text] : files) {
    if (!cxx::is_cxx(path)) continue;
    for (const auto& name : selected) {
      const Manifest& m = s.set.get(name);
      const FileSpec* spec = m.find_file(path);
      if (!spec) continue;
      cxx::CheckUnit u{path, text, spec, {}};
      for (const auto& nf : m.new_files)
        for (const auto& [p2, t2] : files)
          if (p2 == nf.path && cxx::is_cxx(p2)) u.new_files[p2] = t2;
      out.push_back(std::move(u));
      break;
    }
  }
  return out;
}

Status compile_all(const Session& s, const Request& r, const std::vector<std::string>& selected,
                   const std::vector<std::pair<std::string, std::string>>& files, int* count,
                   std::vector<std::string>* notes = nullptr) {
  auto cunits = cxx_units(s, selected, files);
  if (!cunits.empty()) {
    if (auto st = cxx::check(cunits, notes, nullptr); !st) return st.error();
    *count += static_cast<int>(cunits.size());
  }
  std::vector<CompileUnit> units;
  for (const auto& [path, text] : files)
    if (is_python(path)) units.push_back(CompileUnit{path, text, false});
  for (const auto& name : selected) {
    const Manifest& m = s.set.get(name);
    for (const auto& f : m.files)
      for (const auto& e : f.edits)
        if (is_python(f.path) && e.compile_standalone)
          units.push_back(CompileUnit{m.fragments_dir + "/" + e.fragment, join_lines(e.fragment_lines, true), true});
    for (const auto& nf : m.new_files)
      if (is_python(nf.path)) units.push_back(CompileUnit{m.fragments_dir + "/" + nf.source, nf.text, false});
  }
  *count += static_cast<int>(units.size());
  if (units.empty()) return ok_status();
  auto errors = compile_units(r.python, units);
  if (!errors) return errors.error();
  if (errors->empty()) return ok_status();
  Error err = make_error(ErrorKind::Compile, "", "");
  for (const auto& ce : *errors) {
    std::string where;
    for (const auto& [path, text] : files)
      if (path == ce.name) {
        std::string reg = region_in_text(text, ce.line, path);
        where = reg.empty() ? " (outside any overlay region)" : " (in region " + reg + ")";
      }
    if (where.empty()) where = " (fragment, compiled standalone)";
    std::string line = fmt::format("{}:{}: {}{}", ce.name, ce.line, ce.message, where);
    if (err.message.empty()) {
      err.file = fmt::format("{}:{}", ce.name, ce.line);
      err.message = "syntax error: " + ce.message + where;
    }
    err.details.push_back(line);
  }
  return err;
}

// A [[built_files]] binary to rebuild after the compile check (built.h).
struct PendingBuild {
  const BuiltFile* bf = nullptr;
  std::string overlay;
  FileData original;
  std::map<std::string, std::string> inputs;  // patched sources and new files
};

struct Prepared {
  Outcome out;
  std::vector<Change> changes;
  std::vector<std::pair<std::string, std::string>> final_texts;  // for the compile check
  std::vector<PendingBuild> builds;
};

// Wheel install: patches the pinned sources (--sources) of `m`'s built files
// in memory with every wanted overlay, as apply would in a source tree.
Status prepare_builds(const Session& s, const Request& r, const TreeState& ts, const Manifest& m,
                      const std::vector<std::string>& wanted, Prepared& p) {
  for (const auto& bf : m.built_files) {
    const FileState* fs = ts.file(bf.path);
    if (!fs || fs->state != FileStatus::Pristine) continue;  // applied: nothing to do; others were refused already
    if (r.sources.empty())
      return make_error(ErrorKind::Usage, bf.path,
                        "overlay " + m.overlay + " rebuilds this binary on a wheel install: pass --sources DIR with "
                        "the pinned C/C++ sources (python3 fixtures/fetch.py --pins PINS --sources)");
    auto src_tree = Tree::open(r.sources);
    if (!src_tree) return src_tree.error();
    PendingBuild pb{&bf, m.overlay, fs->data, {}};
    for (const auto& src : bf.sources) {
      auto data = src_tree->read(src);
      if (!data) return data.error();
      if (!data->has_value()) return make_error(ErrorKind::Drift, r.sources + "/" + src, "pinned source is missing");
      std::string bytes = (**data).bytes;
      std::string pin = m.find_file(src)->sha256;
      if (kvtier::sha256_hex(bytes) != pin)
        return make_error(ErrorKind::Drift, r.sources + "/" + src,
                          "sha256 differs from the pin " + pin.substr(0, 16) + "...: not the pinned source");
      Text pristine = split_lines(bytes);
      Build b = base_build(pristine);
      for (const auto& om : s.set.overlays) {
        const FileSpec* spec = om.find_file(src);
        if (!spec || !contains(wanted, om.overlay)) continue;
        if (auto st = apply_overlay(b, om, *spec, bytes, src); !st) return st.error();
      }
      pb.inputs[src] = b.text();
      p.final_texts.emplace_back(src, b.text());
    }
    for (const auto& om : s.set.overlays) {
      if (!contains(wanted, om.overlay)) continue;
      for (const auto& nf : om.new_files)
        if (cxx::is_cxx(nf.path)) {
          pb.inputs[nf.path] = new_file_text(nf.path, om, nf);
          p.final_texts.emplace_back(nf.path, pb.inputs[nf.path]);
        }
    }
    p.out.changes.push_back(FileChangeReport{bf.path, "rebuild", {"+ rebuilt from patched " + bf.sources.front() +
                                                                  ", original kept in " + built::backup_path(bf.path)},
                                             "", ""});
    p.builds.push_back(std::move(pb));
  }
  return ok_status();
}

// The topmost folder on `path`'s way that does not exist ("" when all do).
Result<std::string> missing_folder(const Tree& tree, const std::string& path) {
  std::string missing;
  for (std::string d = dir_name(path); !d.empty(); d = dir_name(d)) {
    auto t = tree.type(d);
    if (!t) return t.error();
    if (*t == S_IFDIR) break;
    if (*t != 0)
      return make_error(ErrorKind::Usage, path, "\"" + d + "\" is in the way: it is not a folder");
    missing = d;
  }
  return missing;
}

bool planned(const std::vector<Change>& changes, const std::string& dir) {
  for (const auto& c : changes)
    if (c.kind == Change::Mkdir && c.path == dir) return true;
  return false;
}

// After the deletions of a revert: every folder the engine created (it holds
// the marker) that would then hold nothing else is removed, deepest first.
Status plan_rmdirs(const Tree& tree, Prepared& p) {
  std::set<std::string> gone;
  std::vector<std::string> folders;
  for (const auto& c : p.changes) {
    if (c.kind != Change::Delete) continue;
    gone.insert(c.path);
    for (std::string d = dir_name(c.path); !d.empty(); d = dir_name(d))
      if (std::find(folders.begin(), folders.end(), d) == folders.end()) folders.push_back(d);
  }
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
    bool empty = true;
    for (const auto& n : *names) empty &= n == kDirMarker || gone.count(d + "/" + n) > 0;
    if (!empty) continue;
    gone.insert(d);
    p.out.changes.push_back(FileChangeReport{d, "rmdir", {"- folder created by overlay, now empty"}, "", ""});
    p.changes.push_back(rmdir_change(d));
  }
  return ok_status();
}

Result<Prepared> prepare_apply(const Session& s, const Request& r, const TreeState& ts) {
  Prepared p;
  p.out.state = ts;
  auto sel = select_overlays(s.set, r.overlays);
  if (!sel) return sel.error();
  p.out.selected = *sel;
  for (const auto& name : *sel) {
    const Manifest& m = s.set.get(name);
    for (const auto& a : m.after) {
      const OverlayState* dep = ts.overlay(a);
      bool ok = contains(*sel, a) || dep->state == OverlayStatus::Applied || dep->state == OverlayStatus::Superseded;
      if (!ok)
        return make_error(ErrorKind::Usage, m.file,
                          "overlay " + name + " stacks on " + a + " (after), which is not applied; apply " + a +
                              " first or add it to --overlays");
    }
  }
  if (auto st = require_consistent(ts, *sel, s.set, /*allow_stale=*/false, /*rebuilds=*/true); !st)
    return st.error();
  std::vector<std::string> wanted;
  for (const auto& os : ts.overlays) {
    bool want = contains(*sel, os.name);
    if (os.state == OverlayStatus::Absent) {  // nothing of it is in this tree (built.h)
      if (want) p.out.skipped.push_back(os.name);
    } else if (os.state == OverlayStatus::Applied || os.state == OverlayStatus::Superseded) {
      wanted.push_back(os.name);
      if (want) p.out.skipped.push_back(os.name);
    } else if (want) {
      wanted.push_back(os.name);
    }
  }
  auto changes = rebuild(s, ts, wanted, *sel, &p.changes);
  if (!changes) return changes.error();
  p.out.changes = *changes;
  // New files, and parents that must exist.
  for (const auto& name : *sel) {
    const Manifest& m = s.set.get(name);
    for (const auto& nf : m.new_files) {
      const FileState* fs = ts.file(nf.path);
      if (fs->state == FileStatus::BuildInput) continue;
      std::string text = new_file_text(nf.path, m, nf);
      p.final_texts.emplace_back(nf.path, text);
      if (fs->state == FileStatus::Present) continue;
      auto missing = missing_folder(s.tree, nf.path);
      if (!missing) return missing.error();
      if (!missing->empty() && !planned(p.changes, *missing)) {
        auto parent = s.tree.open_parent(*missing);
        if (!parent) return parent.error();
        struct stat st {};
        if (!parent->has_value() || ::fstat((*parent)->get(), &st) != 0)
          return make_error(ErrorKind::Io, *missing, "cannot stat the folder it goes in");
        p.out.changes.push_back(FileChangeReport{*missing, "mkdir", {"+ new folder of " + m.overlay}, "", ""});
        p.changes.push_back(mkdir_change(*missing, st));
      }
      p.out.changes.push_back(FileChangeReport{nf.path, "create", {"+ new file of " + m.overlay}, "", text});
      p.changes.push_back(create_change(nf.path, text));
    }
    for (const auto& f : m.files) {
      if (ts.file(f.path)->state == FileStatus::BuildInput) continue;
      std::string text = ts.file(f.path)->data.bytes;
      for (const auto& ch : p.out.changes)
        if (ch.path == f.path) text = ch.new_text;
      p.final_texts.emplace_back(f.path, text);
    }
    if (auto st = prepare_builds(s, r, ts, m, wanted, p); !st) return st.error();
  }
  std::sort(p.final_texts.begin(), p.final_texts.end());
  p.final_texts.erase(std::unique(p.final_texts.begin(), p.final_texts.end()), p.final_texts.end());
  return p;
}

Result<Prepared> prepare_revert(const Session& s, const Request& r, const TreeState& ts) {
  Prepared p;
  p.out.state = ts;
  auto sel = select_overlays(s.set, r.overlays);
  if (!sel) return sel.error();
  p.out.selected = *sel;
  // Refuse to pull an overlay out from under one that stacks on it.
  for (const auto& name : *sel)
    for (const auto& os : ts.overlays) {
      if (contains(*sel, os.name) || !contains(os.after, name)) continue;
      if (os.state == OverlayStatus::Pristine || os.state == OverlayStatus::Superseded) continue;
      const Manifest& m = s.set.get(os.name);
      return make_error(ErrorKind::Usage, m.file,
                        "cannot revert " + name + ": overlay " + os.name + " is " + overlay_status_name(os.state) +
                            " and stacks on it (after = [\"" + name + "\"]); revert " + os.name +
                            " first or both together");
    }
  if (auto st = require_consistent(ts, *sel, s.set, /*allow_stale=*/true); !st) return st.error();
  for (const auto& os : ts.overlays)
    if (contains(*sel, os.name) && (os.state == OverlayStatus::Pristine || os.state == OverlayStatus::Superseded ||
                                    os.state == OverlayStatus::Absent))
      p.out.skipped.push_back(os.name);
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
      if (contains(*sel, rg.overlay)) notes.push_back(fmt::format("- {}/{} at line {}", rg.overlay, rg.edit, rg.begin + 1));
    if (notes.empty()) continue;
    for (size_t k = s.set.overlays.size(); k-- > 0;) {
      const Manifest& m = s.set.overlays[k];
      const FileSpec* spec = m.find_file(fs.path);
      if (!spec || !contains(*sel, m.overlay)) continue;
      auto stripped = strip_overlay(lines, m, *spec, fs.path, nullptr);
      if (!stripped) return stripped.error();
      lines = std::move(*stripped);
    }
    std::string new_text = join_lines(lines, text.trailing_newline);
    p.out.changes.push_back(FileChangeReport{fs.path, "patch", notes, fs.data.bytes, new_text});
    p.changes.push_back(write_change(fs.path, fs.data, new_text));
  }
  for (const auto& name : *sel) {
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
  if (auto st = plan_rmdirs(s.tree, p); !st) return st.error();
  return p;
}

// One writer per tree (recovery removes temps it believes are orphans, so a
// second concurrent writer must not get that far), and readers never look at
// a tree in the middle of a transaction: writers hold an exclusive flock on
// the root, readers a shared one. A short wait lets a quick transaction end;
// after it the caller hears "busy". The lock dies with the process.
Status lock_tree(const Tree& tree, bool exclusive) {
  constexpr int kTries = 20;  // 20 x 50 ms
  for (int i = 0;; ++i) {
    if (::flock(tree.fd(), (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) return ok_status();
    if (errno != EWOULDBLOCK) {
      if (errno == ENOLCK || errno == EOPNOTSUPP) return ok_status();  // no locks here: go unprotected
      return make_error(ErrorKind::Io, tree.root(), "cannot lock the tree: " + errno_text(errno));
    }
    if (i + 1 == kTries) break;
    ::usleep(50 * 1000);
  }
  return make_error(ErrorKind::Busy, tree.root(),
                    exclusive ? "another overlay apply/revert/recover is running on this tree (or a check is "
                                "reading it); try again"
                              : "a transaction is in progress on this tree (an overlay apply/revert/recover holds "
                                "its lock); try again when it ends");
}

template <class Prepare>
Result<Outcome> run_write(const Session& s, const Request& r, Prepare prepare) {
  if (auto st = lock_tree(s.tree, true); !st) return st.error();
  auto rec = recover(s.tree, all_paths(s.set));
  if (!rec) return rec.error();
  auto ts = analyze(s.tree, s.set, s.pristine_dir);
  if (!ts) return ts.error();
  auto p = prepare(s, r, *ts);
  if (!p) return p.error();
  p->out.recovered = *rec;
  if (r.check_injected) {
    if (auto st = compile_all(s, r, p->out.selected, p->final_texts, &p->out.compiled, &p->out.notes); !st)
      return st.error();
  }
  for (const auto& pb : p->builds) {  // after the check: a broken region fails as exit 5 before any build
    double secs = 0;
    auto bytes = built::build(*pb.bf, pb.inputs, r.python, &secs);
    if (!bytes) return bytes.error();
    p->out.notes.push_back(fmt::format("{}: rebuilt in {:.1f} s", pb.bf->path, secs));
    for (auto& c : built::apply_changes(*pb.bf, pb.overlay, pb.original, *bytes)) p->changes.push_back(std::move(c));
  }
  if (auto st = commit(s.tree, p->changes); !st) return st.error();
  return p->out;
}

}  // namespace

Result<Outcome> status(const Session& s) {
  if (auto st = lock_tree(s.tree, false); !st) return st.error();
  auto ts = analyze(s.tree, s.set, s.pristine_dir);
  if (!ts) return ts.error();
  Outcome o;
  o.state = std::move(*ts);
  for (const auto& m : s.set.overlays) o.selected.push_back(m.overlay);
  return o;
}

Result<Outcome> plan_apply(const Session& s, const Request& r) {
  if (auto st = lock_tree(s.tree, false); !st) return st.error();
  auto ts = analyze(s.tree, s.set, s.pristine_dir);
  if (!ts) return ts.error();
  auto p = prepare_apply(s, r, *ts);
  if (!p) return p.error();
  return p->out;
}

Result<Outcome> plan_revert(const Session& s, const Request& r) {
  if (auto st = lock_tree(s.tree, false); !st) return st.error();
  auto ts = analyze(s.tree, s.set, s.pristine_dir);
  if (!ts) return ts.error();
  auto p = prepare_revert(s, r, *ts);
  if (!p) return p.error();
  return p->out;
}

Result<Outcome> apply(const Session& s, const Request& r) { return run_write(s, r, prepare_apply); }
Result<Outcome> revert(const Session& s, const Request& r) { return run_write(s, r, prepare_revert); }

Result<Outcome> check(const Session& s, const Request& r) {
  if (auto st = lock_tree(s.tree, false); !st) return st.error();
  auto ts = analyze(s.tree, s.set, s.pristine_dir);
  if (!ts) return ts.error();
  auto sel = select_overlays(s.set, r.overlays);
  if (!sel) return sel.error();
  if (auto st = require_consistent(*ts, *sel, s.set); !st) return st.error();
  Outcome o;
  o.state = *ts;
  o.selected = *sel;
  std::vector<std::string> wrong;
  for (const auto& name : *sel) {
    OverlayStatus st = ts->overlay(name)->state;
    bool good = st == OverlayStatus::Superseded || st == OverlayStatus::Absent ||
                st == (r.expect_pristine ? OverlayStatus::Pristine : OverlayStatus::Applied);
    if (!good) wrong.push_back(name + " is " + overlay_status_name(st));
  }
  if (!wrong.empty()) {
    std::string list;
    for (auto& w : wrong) list += (list.empty() ? "" : ", ") + w;
    return make_error(ErrorKind::NotExpected, s.tree.root(),
                      std::string("expected ") + (r.expect_pristine ? "pristine" : "applied") + ", but " + list);
  }
  if (r.check_injected && !r.expect_pristine) {
    std::vector<std::pair<std::string, std::string>> files;
    for (const auto& name : *sel) {
      const Manifest& m = s.set.get(name);
      for (const auto& f : m.files)
        if (ts->file(f.path)->state != FileStatus::BuildInput) files.emplace_back(f.path, ts->file(f.path)->data.bytes);
      for (const auto& nf : m.new_files)
        if (ts->file(nf.path)->state != FileStatus::BuildInput)
          files.emplace_back(nf.path, ts->file(nf.path)->data.bytes);
    }
    std::sort(files.begin(), files.end());
    files.erase(std::unique(files.begin(), files.end()), files.end());
    if (auto st = compile_all(s, r, *sel, files, &o.compiled, &o.notes); !st) return st.error();
  }
  return o;
}

Result<RecoverOutcome> recover_tree(const Session& s, bool discard_it) {
  if (auto st = lock_tree(s.tree, true); !st) return st.error();
  RecoverOutcome out;
  auto before = inspect(s.tree, all_paths(s.set));
  if (!before) return before.error();
  out.had_journal = before->journal;
  out.found = before->leftovers;
  if (discard_it) {
    auto d = discard(s.tree, all_paths(s.set));
    if (!d) return d.error();
    out.discarded = true;
    out.discard = *d;
  } else {
    auto r = recover(s.tree, all_paths(s.set));
    if (!r) return r.error();
  }
  return out;
}

}  // namespace patcher
