#include "engine.h"

#include <sys/file.h>

#include <cerrno>

#include <algorithm>
#include <set>

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
    if (set.index_of(n) < 0)
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
  }
  return out;
}

// Turns bad overlay states into the error apply/revert/check must stop on.
Status require_consistent(const TreeState& ts, const std::vector<std::string>& selected, const ManifestSet& set,
                          bool allow_stale = false) {
  if (ts.journal)
    return make_error(ErrorKind::Tampered, kJournalName,
                      "an interrupted transaction is pending; run apply or revert to complete it");
  Error drift = make_error(ErrorKind::Drift, "", "");
  for (const auto& name : selected) {
    const OverlayState* os = ts.overlay(name);
    if (os->state == "drift") {
      for (const auto& fs : ts.files) {
        const Manifest& m = set.overlays[static_cast<size_t>(set.index_of(name))];
        if (!m.find_file(fs.path) || (fs.state != "drift" && fs.state != "missing")) continue;
        if (drift.message.empty()) {
          drift.file = fs.path;
          drift.message = "drift: " + fs.message;
        }
        drift.details.push_back(fs.path + ": " + fs.message);
        for (const auto& d : fs.details) drift.details.push_back("  " + d);
      }
    }
  }
  if (!drift.message.empty()) return drift;
  for (const auto& name : selected) {
    const OverlayState* os = ts.overlay(name);
    if (os->state == "tampered" || os->state == "half-applied" || (os->state == "stale" && !allow_stale)) {
      std::string first = os->problems.empty() ? "" : os->problems.front();
      size_t colon = first.find(": ");
      std::string file = colon == std::string::npos ? "" : first.substr(0, colon);
      std::string msg = colon == std::string::npos ? first : first.substr(colon + 2);
      Error e = make_error(ErrorKind::Tampered, file,
                           "overlay " + name + " is " + os->state + ": " + msg + "; refusing to touch the tree");
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
    if (fs.is_new) continue;
    bool relevant = false;
    for (const auto& name : touched)
      if (s.set.overlays[static_cast<size_t>(s.set.index_of(name))].find_file(fs.path)) relevant = true;
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
    if (changes) {
      Change c;
      c.path = fs.path;
      c.kind = Change::Write;
      c.old_sha = fs.sha;
      c.new_bytes = text;
      c.mode = fs.data.st.st_mode;
      c.keep_owner = true;
      c.uid = fs.data.st.st_uid;
      c.gid = fs.data.st.st_gid;
      changes->push_back(std::move(c));
    }
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
Status compile_all(const Session& s, const Request& r, const std::vector<std::string>& selected,
                   const std::vector<std::pair<std::string, std::string>>& files, int* count) {
  std::vector<CompileUnit> units;
  for (const auto& [path, text] : files)
    if (is_python(path)) units.push_back(CompileUnit{path, text, false});
  for (const auto& name : selected) {
    const Manifest& m = s.set.overlays[static_cast<size_t>(s.set.index_of(name))];
    for (const auto& f : m.files)
      for (const auto& e : f.edits)
        if (is_python(f.path) && e.compile_standalone)
          units.push_back(CompileUnit{m.fragments_dir + "/" + e.fragment, join_lines(e.fragment_lines, true), true});
    for (const auto& nf : m.new_files)
      if (is_python(nf.path)) units.push_back(CompileUnit{m.fragments_dir + "/" + nf.source, nf.text, false});
  }
  *count = static_cast<int>(units.size());
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

struct Prepared {
  Outcome out;
  std::vector<Change> changes;
  std::vector<std::pair<std::string, std::string>> final_texts;  // for the compile check
};

Result<Prepared> prepare_apply(const Session& s, const Request& r, const TreeState& ts) {
  Prepared p;
  p.out.state = ts;
  auto sel = select_overlays(s.set, r.overlays);
  if (!sel) return sel.error();
  p.out.selected = *sel;
  for (const auto& name : *sel) {
    const Manifest& m = s.set.overlays[static_cast<size_t>(s.set.index_of(name))];
    for (const auto& a : m.after) {
      const OverlayState* dep = ts.overlay(a);
      bool ok = contains(*sel, a) || dep->state == "applied" || dep->state == "superseded";
      if (!ok)
        return make_error(ErrorKind::Usage, m.file,
                          "overlay " + name + " stacks on " + a + " (after), which is not applied; apply " + a +
                              " first or add it to --overlays");
    }
  }
  if (auto st = require_consistent(ts, *sel, s.set); !st) return st.error();
  std::vector<std::string> wanted;
  for (const auto& os : ts.overlays) {
    bool want = contains(*sel, os.name);
    if (os.state == "applied" || os.state == "superseded") {
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
    const Manifest& m = s.set.overlays[static_cast<size_t>(s.set.index_of(name))];
    for (const auto& nf : m.new_files) {
      const FileState* fs = ts.file(nf.path);
      std::string text = new_file_text(nf.path, m, nf);
      p.final_texts.emplace_back(nf.path, text);
      if (fs->state == "present") continue;
      auto parent = s.tree.open_parent(nf.path);
      if (!parent) return parent.error();
      if (!parent->has_value())
        return make_error(ErrorKind::Drift, nf.path, "cannot create the new file: its directory does not exist");
      p.out.changes.push_back(FileChangeReport{nf.path, "create", {"+ new file of " + m.overlay}, "", text});
      Change c;
      c.path = nf.path;
      c.kind = Change::Create;
      c.new_bytes = text;
      c.mode = 0644;
      p.changes.push_back(std::move(c));
    }
    for (const auto& f : m.files) {
      std::string text = ts.file(f.path)->data.bytes;
      for (const auto& ch : p.out.changes)
        if (ch.path == f.path) text = ch.new_text;
      p.final_texts.emplace_back(f.path, text);
    }
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
      if (os.state == "pristine" || os.state == "superseded") continue;
      const Manifest& m = s.set.overlays[static_cast<size_t>(s.set.index_of(os.name))];
      return make_error(ErrorKind::Usage, m.file,
                        "cannot revert " + name + ": overlay " + os.name + " is " + os.state +
                            " and stacks on it (after = [\"" + name + "\"]); revert " + os.name +
                            " first or both together");
    }
  if (auto st = require_consistent(ts, *sel, s.set, /*allow_stale=*/true); !st) return st.error();
  for (const auto& os : ts.overlays)
    if (contains(*sel, os.name) && (os.state == "pristine" || os.state == "superseded"))
      p.out.skipped.push_back(os.name);
  // Revert strips the selected overlays' verified regions (later overlays
  // first), so it also works when fragments changed since the apply.
  for (const auto& fs : ts.files) {
    if (fs.is_new || !fs.exists) continue;
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
    Change c;
    c.path = fs.path;
    c.kind = Change::Write;
    c.old_sha = fs.sha;
    c.new_bytes = new_text;
    c.mode = fs.data.st.st_mode;
    c.keep_owner = true;
    c.uid = fs.data.st.st_uid;
    c.gid = fs.data.st.st_gid;
    p.changes.push_back(std::move(c));
  }
  for (const auto& name : *sel) {
    const Manifest& m = s.set.overlays[static_cast<size_t>(s.set.index_of(name))];
    for (const auto& nf : m.new_files) {
      const FileState* fs = ts.file(nf.path);
      if (fs->state != "present" && fs->state != "stale") continue;
      p.out.changes.push_back(FileChangeReport{nf.path, "delete", {"- new file of " + m.overlay}, fs->data.bytes, ""});
      Change c;
      c.path = nf.path;
      c.kind = Change::Delete;
      c.old_sha = fs->sha;
      p.changes.push_back(std::move(c));
    }
  }
  return p;
}

template <class Prepare>
Result<Outcome> run_write(const Session& s, const Request& r, Prepare prepare) {
  // One writer per tree: recovery removes temps it believes are orphans, so
  // a second concurrent writer must not get that far. The lock dies with us.
  if (::flock(s.tree.fd(), LOCK_EX | LOCK_NB) != 0)
    return make_error(ErrorKind::Io, s.tree.root(),
                      errno == EWOULDBLOCK ? "another overlay apply/revert is running on this tree"
                                           : "cannot lock the tree: " + errno_text(errno));
  auto rec = recover(s.tree, all_paths(s.set));
  if (!rec) return rec.error();
  auto ts = analyze(s.tree, s.set);
  if (!ts) return ts.error();
  auto p = prepare(s, r, *ts);
  if (!p) return p.error();
  p->out.recovered = *rec;
  if (r.check_injected) {
    if (auto st = compile_all(s, r, p->out.selected, p->final_texts, &p->out.compiled); !st) return st.error();
  }
  if (auto st = commit(s.tree, p->changes); !st) return st.error();
  return p->out;
}

}  // namespace

Result<Outcome> status(const Session& s) {
  auto ts = analyze(s.tree, s.set);
  if (!ts) return ts.error();
  Outcome o;
  o.state = std::move(*ts);
  for (const auto& m : s.set.overlays) o.selected.push_back(m.overlay);
  return o;
}

Result<Outcome> plan_apply(const Session& s, const Request& r) {
  auto ts = analyze(s.tree, s.set);
  if (!ts) return ts.error();
  auto p = prepare_apply(s, r, *ts);
  if (!p) return p.error();
  return p->out;
}

Result<Outcome> plan_revert(const Session& s, const Request& r) {
  auto ts = analyze(s.tree, s.set);
  if (!ts) return ts.error();
  auto p = prepare_revert(s, r, *ts);
  if (!p) return p.error();
  return p->out;
}

Result<Outcome> apply(const Session& s, const Request& r) { return run_write(s, r, prepare_apply); }
Result<Outcome> revert(const Session& s, const Request& r) { return run_write(s, r, prepare_revert); }

Result<Outcome> check(const Session& s, const Request& r) {
  auto ts = analyze(s.tree, s.set);
  if (!ts) return ts.error();
  auto sel = select_overlays(s.set, r.overlays);
  if (!sel) return sel.error();
  if (auto st = require_consistent(*ts, *sel, s.set); !st) return st.error();
  Outcome o;
  o.state = *ts;
  o.selected = *sel;
  std::vector<std::string> wrong;
  for (const auto& name : *sel) {
    const std::string& st = ts->overlay(name)->state;
    bool good = st == "superseded" || st == (r.expect_pristine ? "pristine" : "applied");
    if (!good) wrong.push_back(name + " is " + st);
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
      const Manifest& m = s.set.overlays[static_cast<size_t>(s.set.index_of(name))];
      for (const auto& f : m.files) files.emplace_back(f.path, ts->file(f.path)->data.bytes);
      for (const auto& nf : m.new_files) files.emplace_back(nf.path, ts->file(nf.path)->data.bytes);
    }
    std::sort(files.begin(), files.end());
    files.erase(std::unique(files.begin(), files.end()), files.end());
    if (auto st = compile_all(s, r, *sel, files, &o.compiled); !st) return st.error();
  }
  return o;
}

}  // namespace patcher
