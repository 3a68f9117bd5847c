// The verbs of engine.h, each one sequence: lock the tree, finish an
// interrupted transaction (writers), analyze (state.h), prepare the changes
// (prepare_apply.cpp, prepare_revert.cpp), refuse a bad tree
// (consistency.cpp), compile (check_injected.cpp), rebuild binaries
// (built.h), commit (txn.h).
#include "engine.h"

#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>

#include "api_check.h"
#include "built.h"
#include "engine_steps.h"
#include "fmt/format.h"
#include "txn.h"

namespace patcher {

using engine_steps::compile_all;
using engine_steps::require_consistent;

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

// Readers (status, plan, check) take the shared lock, then the tree's state.
Result<TreeState> read_state(const Session& s) {
  if (auto st = lock_tree(s.tree, false); !st) return st.error();
  return analyze(s.tree, s.set, s.pristine_dir);
}

// The interface pins of the selected overlays (api_check.h) against the tree,
// joined to what an apply found: one drift report names every anchor and
// every engine name that moved, so a port starts from the whole list.
Status with_interface(const Session& s, const std::vector<std::string>& selected, Status found) {
  ApiReport all;
  for (const auto& name : selected) {
    const Manifest& m = s.set.get(name);
    if (m.api.file.empty()) continue;
    auto rep = check_api(s.tree, m.api);
    if (!rep) return rep.error();
    all.items.insert(all.items.end(), rep->items.begin(), rep->items.end());
    all.lines.insert(all.lines.end(), rep->lines.begin(), rep->lines.end());
  }
  if (all.items.empty()) return found;
  std::string what = fmt::format("{} engine name{} the overlays' code uses {} gone or changed (interface pins)",
                                 all.items.size(), all.items.size() == 1 ? "" : "s",
                                 all.items.size() == 1 ? "is" : "are");
  if (!found) {
    Error e = found.error();
    if (e.kind != ErrorKind::Drift) return e;
    e.message += "; and " + what;
    e.details.insert(e.details.end(), all.lines.begin(), all.lines.end());
    e.drift.insert(e.drift.end(), all.items.begin(), all.items.end());
    return e;
  }
  Error e = make_error(ErrorKind::Drift, s.tree.root(), what);
  e.details = std::move(all.lines);
  e.drift = std::move(all.items);
  return e;
}

using PrepareFn = Status (*)(const Session&, const Request&, engine_steps::Prepared&);

// The changes `prepare` plans for the overlays the request selects.
Result<engine_steps::Prepared> prepare_changes(const Session& s, const Request& r, TreeState ts, PrepareFn prepare) {
  engine_steps::Prepared p;
  p.out.state = std::move(ts);
  auto sel = select_overlays(s.set, r.overlays);
  if (!sel) return sel.error();
  p.out.selected = std::move(*sel);
  Status st = prepare(s, r, p);
  if (prepare == engine_steps::prepare_apply) st = with_interface(s, p.out.selected, std::move(st));
  if (!st) return st.error();
  return p;
}

Result<OverlayReport> run_plan(const Session& s, const Request& r, PrepareFn prepare) {
  auto ts = read_state(s);
  if (!ts) return ts.error();
  auto p = prepare_changes(s, r, std::move(*ts), prepare);
  if (!p) return p.error();
  return p->out;
}

Result<OverlayReport> run_write(const Session& s, const Request& r, PrepareFn prepare) {
  if (auto st = lock_tree(s.tree, true); !st) return st.error();
  auto rec = recover(s.tree, all_paths(s.set));
  if (!rec) return rec.error();
  auto ts = analyze(s.tree, s.set, s.pristine_dir);
  if (!ts) return ts.error();
  auto p = prepare_changes(s, r, std::move(*ts), prepare);
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

Result<OverlayReport> status(const Session& s) {
  auto ts = read_state(s);
  if (!ts) return ts.error();
  OverlayReport o;
  o.state = std::move(*ts);
  for (const auto& m : s.set.overlays) o.selected.push_back(m.overlay);
  return o;
}

Result<OverlayReport> plan_apply(const Session& s, const Request& r) { return run_plan(s, r, engine_steps::prepare_apply); }
Result<OverlayReport> plan_revert(const Session& s, const Request& r) { return run_plan(s, r, engine_steps::prepare_revert); }
Result<OverlayReport> apply(const Session& s, const Request& r) { return run_write(s, r, engine_steps::prepare_apply); }
Result<OverlayReport> revert(const Session& s, const Request& r) { return run_write(s, r, engine_steps::prepare_revert); }

Result<OverlayReport> check(const Session& s, const Request& r) {
  auto ts = read_state(s);
  if (!ts) return ts.error();
  auto sel = select_overlays(s.set, r.overlays);
  if (!sel) return sel.error();
  if (auto st = require_consistent(*ts, *sel, s.set); !st) return st.error();
  if (auto st = with_interface(s, *sel, ok_status()); !st) return st.error();
  OverlayReport o;
  o.selected = *sel;
  std::vector<std::string> wrong;
  for (const auto& name : *sel) {
    OverlayStatus st = ts->overlay(name)->state;
    bool good = st == OverlayStatus::Superseded || st == OverlayStatus::Absent ||
                st == (r.expect_pristine ? OverlayStatus::Pristine : OverlayStatus::Applied);
    if (!good) wrong.push_back(name + " is " + overlay_status_name(st));
  }
  // A pristine or applied tree holds no file an overlay made that no manifest names.
  for (const auto& l : ts->strays) wrong.push_back(l.path + " is a " + l.what + " (" + l.fate + ")");
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
  o.state = std::move(*ts);  // last: the checks above read it
  return o;
}

Result<RecoverReport> recover_tree(const Session& s, bool discard_it) {
  if (auto st = lock_tree(s.tree, true); !st) return st.error();
  RecoverReport out;
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
