// What `overlay apply` (and `overlay plan`) would write: every file's text
// with the wanted overlays in place, the new files and the folders they need,
// and on a wheel install the binaries to rebuild from the patched sources.
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cxx_backend.h"
#include "engine_steps.h"
#include "fmt/format.h"
#include "plan.h"
#include "region.h"
#include "sha256.h"
#include "text.h"

namespace patcher::engine_steps {

namespace {

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
    if (changes) changes->push_back(write_change(fs.path, fs.data, text));
    out.push_back(FileChangeReport{fs.path, "patch", std::move(notes), fs.data.bytes, std::move(text)});
  }
  return out;
}

std::string new_file_text(const std::string& path, const Manifest& m, const NewFile& nf) {
  return new_file_header(comment_prefix(path), m.overlay, text_hash(nf.text)) + "\n" + nf.text;
}

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
      const std::string& bytes = (**data).bytes;
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
      std::string text = b.text();
      p.final_texts.emplace_back(src, text);
      pb.inputs[src] = std::move(text);
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

}  // namespace

Status prepare_apply(const Session& s, const Request& r, Prepared& p) {
  const TreeState& ts = p.out.state;
  const std::vector<std::string>& sel = p.out.selected;
  for (const auto& name : sel) {
    const Manifest& m = s.set.get(name);
    for (const auto& a : m.after) {
      const OverlayState* dep = ts.overlay(a);
      bool ok = contains(sel, a) || dep->state == OverlayStatus::Applied || dep->state == OverlayStatus::Superseded;
      if (!ok)
        return make_error(ErrorKind::Usage, m.file,
                          "overlay " + name + " stacks on " + a + " (after), which is not applied; apply " + a +
                              " first or add it to --overlays");
    }
  }
  if (auto st = require_consistent(ts, sel, s.set, /*allow_stale=*/false, /*rebuilds=*/true); !st)
    return st.error();
  std::vector<std::string> wanted;
  for (const auto& os : ts.overlays) {
    bool want = contains(sel, os.name);
    if (os.state == OverlayStatus::Absent) {  // nothing of it is in this tree (built.h)
      if (want) p.out.absent.push_back(os.name);
    } else if (os.state == OverlayStatus::Applied || os.state == OverlayStatus::Superseded) {
      wanted.push_back(os.name);
      if (want) p.out.skipped.push_back(os.name);
    } else if (want) {
      wanted.push_back(os.name);
    }
  }
  auto changes = rebuild(s, ts, wanted, sel, &p.changes);
  if (!changes) return changes.error();
  p.out.changes = std::move(*changes);
  // New files, and parents that must exist.
  for (const auto& name : sel) {
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
  return ok_status();
}

}  // namespace patcher::engine_steps
