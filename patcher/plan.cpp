#include "plan.h"

#include <algorithm>

#include "anchor.h"
#include "cxx_backend.h"
#include "fmt/format.h"
#include "region.h"
#include "scope.h"

namespace patcher {

std::string Build::text() const { return join_lines(texts(), trailing_newline); }

std::vector<std::string> Build::texts() const {
  std::vector<std::string> out;
  out.reserve(lines.size());
  for (const auto& l : lines) out.push_back(l.text);
  return out;
}

std::string Build::region_at(size_t line) const {
  if (line == 0 || line > lines.size()) return "";
  int r = lines[line - 1].region;
  return r < 0 ? "" : regions[static_cast<size_t>(r)].overlay + "/" + regions[static_cast<size_t>(r)].edit;
}

Build base_build(const Text& projection) {
  Build b;
  b.trailing_newline = projection.trailing_newline;
  for (size_t i = 0; i < projection.lines.size(); ++i) b.lines.push_back(BuildLine{projection.lines[i], -1, i + 1, ""});
  return b;
}

bool is_superseded(const Edit& e, const std::string& pristine_text) {
  return e.superseded_by && pristine_text.find(*e.superseded_by) != std::string::npos;
}

namespace {

struct Op {
  size_t start = 0, count = 0;  // matched anchor lines
  const Edit* edit = nullptr;
  size_t order = 0;
};

// Line `index` of the build as a report names it. A line an earlier overlay
// injects is not a line of the file on disk (the build is the projection with
// the earlier overlays applied in memory): it is named by its region instead
// (issue 37: "line 76 (inside an injected region)" was no line of the file).
size_t region_line(const Build& b, size_t index) {  // 1-based, the begin sentinel is 1
  size_t j = index;
  while (j > 0 && b.lines[j - 1].region == b.lines[index].region) --j;
  return index - j + 1;
}

std::string where(const Build& b, size_t index) {
  const BuildLine& l = b.lines[index];
  if (l.origin) return fmt::format("line {}", l.origin);
  return fmt::format("line {} of the region {} injects (not a line of the file on disk)", region_line(b, index),
                     b.region_at(index + 1));
}

// 1-based line in the file, 0 for injected text (see injected_by).
size_t line_no(const Build& b, size_t index) { return b.lines[index].origin; }

DriftItem::Near near_item(const Build& b, size_t index, double score, const std::string& text) {
  DriftItem::Near n{line_no(b, index), score, text, "", 0};
  if (!n.line) {
    n.injected_by = b.region_at(index + 1);
    n.region_line = region_line(b, index);
  }
  return n;
}

// "class X/def f" around 0-based `line` of Python text ("" at module level).
// Only lines that start a logical line count: the closing `) -> T:` of a
// signature spanning several lines is shallower than the body but is not a
// header, and must not hide its `def` (issue 37).
std::string enclosing_scope(const std::vector<std::string>& texts, size_t line) {
  std::vector<std::string> chain;
  std::vector<bool> starts = logical_starts(texts);
  while (line > 0 && !starts[line]) --line;  // a continuation: judge its logical line
  size_t limit = leading_ws(texts[line]).size();
  for (size_t i = line + 1; i-- > 0 && limit > 0;) {
    std::string_view t = trim(texts[i]);
    if (t.empty() || !starts[i] || t[0] == '#') continue;
    size_t ind = leading_ws(texts[i]).size();
    if (ind >= limit) continue;
    limit = ind;
    for (const char* kw : {"def ", "async def ", "class "}) {
      if (t.rfind(kw, 0) != 0) continue;
      std::string_view rest = t.substr(std::string_view(kw).size());
      size_t stop = rest.find_first_of("(:[ ");
      std::string head = std::string(kw == std::string("async def ") ? "def " : kw) + std::string(rest.substr(0, stop));
      chain.insert(chain.begin(), head);
      break;
    }
  }
  std::string out;
  for (auto& c : chain) out += (out.empty() ? "" : "/") + c;
  return out;
}

DriftItem base_item(const Manifest& m, const Edit& e, const std::string& file, const std::string& kind) {
  DriftItem it;
  it.file = file;
  it.overlay = m.overlay;
  it.edit = e.id;
  it.manifest = m.file;
  it.kind = kind;
  it.scope = e.scope;
  it.expected = e.occurrences;
  return it;
}

// An edit whose superseded_by text is gone: a porter must decide whether
// upstream still does what the edit does, not only fix its anchor.
void superseded_note(std::vector<std::string>& out, DriftItem& it, const Edit& e) {
  if (!e.superseded_by) return;
  it.superseded_by = *e.superseded_by;
  std::string first = e.superseded_by->substr(0, e.superseded_by->find('\n'));
  out.push_back("  this edit is superseded_by upstream text that is no longer in the file: \"" + first +
                (first.size() < e.superseded_by->size() ? " ..." : "") +
                "\"; where that text was upstream the edit was never applied. Decide whether upstream still does "
                "what the edit does (then update superseded_by) before fixing the anchor, or the fragment gets "
                "injected");
}

void drift_report(std::vector<std::string>& out, std::vector<DriftItem>& items, const std::vector<std::string>& texts,
                  const Build& b, const Manifest& m, const Edit& e, const std::string& file, LineRange range,
                  const std::vector<size_t>& found) {
  DriftItem it = base_item(m, e, file, "anchor");
  it.found = static_cast<int>(found.size());
  std::string scope = e.scope.empty() ? "" : " in scope \"" + e.scope + "\"";
  out.push_back(fmt::format("edit {}/{}: anchor{} found {} times, expected {}", m.overlay, e.id, scope,
                            found.size(), e.occurrences));
  superseded_note(out, it, e);
  if (!found.empty()) {
    std::string at;
    for (size_t f : found) {
      at += (at.empty() ? "" : ", ") + where(b, f);
      it.found_at.push_back(line_no(b, f));
    }
    out.push_back("  found at " + at);
    items.push_back(std::move(it));
    return;
  }
  auto near = nearest(texts, range.begin, range.end, e.anchor_lines);
  if (near.empty()) {
    out.push_back("  no candidate lines in the searched range");
    items.push_back(std::move(it));
    return;
  }
  out.push_back("  nearest lines (similarity):");
  for (const auto& n : near) {
    out.push_back(fmt::format("    {} {:.2f}: {}", where(b, n.line), n.score, texts[n.line]));
    it.nearest.push_back(near_item(b, n.line, n.score, texts[n.line]));
  }
  const NearMatch& best = near.front();
  size_t len = std::min(e.anchor_lines.size(), range.end - best.line);
  if (e.anchor_lines.size() * len > 250'000) {
    out.push_back("  (anchor too long to diff)");
  } else {
    std::vector<std::string> cand(texts.begin() + static_cast<long>(best.line),
                                  texts.begin() + static_cast<long>(best.line + len));
    it.diff = unified_diff(e.anchor_lines, cand, "anchor " + m.overlay + "/" + e.id + " (" + m.file + ")",
                           line_no(b, best.line) ? fmt::format("{} line {}", file, line_no(b, best.line))
                                                         : fmt::format("{} {}", file, where(b, best.line)),
                           1, line_no(b, best.line) ? line_no(b, best.line) : region_line(b, best.line));
    for (auto& d : it.diff) out.push_back("    " + d);
  }
  items.push_back(std::move(it));
}

void scope_report(std::vector<std::string>& out, std::vector<DriftItem>& items, const std::vector<std::string>& texts,
                  const Build& b, const Manifest& m, const Edit& e, const std::string& file, const ScopeMatch& sm) {
  DriftItem it = base_item(m, e, file, sm.refusal.empty() ? "scope" : "scope-refused");
  if (!sm.refusal.empty()) {
    out.push_back(fmt::format("edit {}/{}: scope \"{}\": {}", m.overlay, e.id, e.scope, sm.refusal));
    items.push_back(std::move(it));
    return;
  }
  it.expected = 1;
  it.found = static_cast<int>(sm.found.size());
  out.push_back(fmt::format("edit {}/{}: scope \"{}\": \"{}\" found {} times, expected 1", m.overlay, e.id, e.scope,
                            sm.segment, sm.found.size()));
  superseded_note(out, it, e);
  // The anchor text itself may still be there, moved out of its scope.
  auto anywhere = find_anchor(texts, 0, texts.size(), e.anchor_lines);
  for (size_t f : anywhere) {
    std::string in = cxx::is_cxx(file) ? "" : enclosing_scope(texts, f);
    it.elsewhere.push_back(fmt::format("{}{}", where(b, f), in.empty() ? " (module level)" : " (in " + in + ")"));
  }
  if (!it.elsewhere.empty()) {
    std::string list;
    for (auto& x : it.elsewhere) list += (list.empty() ? "" : ", ") + x;
    out.push_back("  the anchor text itself is in the file, outside the scope: " + list +
                  "; update `scope` if the code moved there");
  }
  if (!sm.found.empty()) {
    std::string at;
    for (size_t f : sm.found) {
      at += (at.empty() ? "" : ", ") + where(b, f);
      it.found_at.push_back(line_no(b, f));
    }
    out.push_back("  found at " + at);
    items.push_back(std::move(it));
    return;
  }
  std::vector<NearMatch> scored;
  for (size_t h : sm.headers) scored.push_back({h, similarity(sm.segment, trim(texts[h]).substr(0, sm.segment.size() + 8))});
  std::stable_sort(scored.begin(), scored.end(), [](auto& x, auto& y) { return x.score > y.score; });
  if (scored.size() > 3) scored.resize(3);
  if (scored.empty()) out.push_back(cxx::is_cxx(file) ? "  no C/C++ definitions in the searched range"
                                                      : "  no def/class headers in the searched range");
  else out.push_back("  nearest headers (similarity):");
  for (const auto& sc : scored) {
    out.push_back(fmt::format("    {} {:.2f}: {}", where(b, sc.line), sc.score, texts[sc.line]));
    it.nearest.push_back(near_item(b, sc.line, sc.score, texts[sc.line]));
  }
  items.push_back(std::move(it));
}

}  // namespace

Status apply_overlay(Build& b, const Manifest& m, const FileSpec& spec, const std::string& pristine_text,
                     const std::string& file) {
  std::vector<std::string> texts = b.texts();
  std::vector<Op> ops;
  std::vector<std::string> report;
  std::vector<DriftItem> items;
  std::vector<std::string> failed;
  for (const Edit& e : spec.edits) {
    if (is_superseded(e, pristine_text)) continue;
    LineRange range{0, texts.size()};
    if (!e.scope.empty()) {
      ScopeMatch sm;
      if (cxx::is_cxx(file)) {  // C/C++: the Clang AST decides (cxx_backend.h)
        auto r = cxx::find_scope(texts, e.scope, spec);
        if (!r) return r.error();
        sm = std::move(*r);
      } else {
        sm = find_scope(texts, e.scope);
      }
      if (!sm.ok) {
        scope_report(report, items, texts, b, m, e, file, sm);
        failed.push_back(e.id + (sm.refusal.empty() ? " (scope)" : " (scope refused)"));
        continue;
      }
      range = sm.range;
    }
    auto found = find_anchor(texts, range.begin, range.end, e.anchor_lines);
    if (found.size() != static_cast<size_t>(e.occurrences)) {
      drift_report(report, items, texts, b, m, e, file, range, found);
      failed.push_back(fmt::format("{} (anchor found {} times, expected {})", e.id, found.size(), e.occurrences));
      continue;
    }
    if (cxx::is_cxx(file))  // never edit lines the preprocessor drops or a #define continues
      for (size_t f : found) {
        auto why = cxx::anchor_refusal(texts, f, e.anchor_lines.size(), spec);
        if (!why) return why.error();
        if (!why->empty())
          return make_error(ErrorKind::Usage, file,
                            fmt::format("edit {}/{}: anchor at {} refused: {}", m.overlay, e.id, where(b, f), *why));
      }
    for (size_t f : found) {
      for (size_t j = f; j < f + e.anchor_lines.size(); ++j) {
        if (!b.lines[j].claim.empty())
          return make_error(ErrorKind::Usage, file,
                            fmt::format("edits {} and {}/{} both anchor on {}; overlapping edits are not allowed",
                                        b.lines[j].claim, m.overlay, e.id, where(b, j)));
      }
      for (size_t j = f; j < f + e.anchor_lines.size(); ++j) b.lines[j].claim = m.overlay + "/" + e.id;
      ops.push_back(Op{f, e.anchor_lines.size(), &e, ops.size()});
    }
  }
  if (!failed.empty()) {
    std::string list;
    for (auto& f : failed) list += (list.empty() ? "" : ", ") + f;
    Error err = make_error(ErrorKind::Drift, file, "overlay " + m.overlay + ": anchors do not match: " + list);
    err.details = std::move(report);
    err.drift = std::move(items);
    return err;
  }
  std::string prefix = comment_prefix(file);
  std::vector<BuildLine> out;
  auto emit_region = [&](const Op& op, const BuildLine& anchor_first) {
    std::string indent = leading_ws(anchor_first.text) + std::string(static_cast<size_t>(op.edit->indent), ' ');
    std::vector<std::string> body = reindent(op.edit->fragment_lines, indent);
    int r = static_cast<int>(b.regions.size());
    b.regions.push_back(BuildRegion{m.overlay, op.edit->id});
    out.push_back(BuildLine{begin_sentinel(prefix, indent, m.overlay, op.edit->id, region_hash(body)), r, 0, ""});
    for (auto& l : body) out.push_back(BuildLine{l, r, 0, ""});
    out.push_back(BuildLine{end_sentinel(prefix, indent, m.overlay, op.edit->id), r, 0, ""});
  };
  std::sort(ops.begin(), ops.end(), [](const Op& x, const Op& y) { return x.order < y.order; });
  for (size_t i = 0; i < b.lines.size();) {
    for (const Op& op : ops)
      if (op.start == i && op.edit->action == Action::InsertBefore) emit_region(op, b.lines[i]);
    const Op* rep = nullptr;
    for (const Op& op : ops)
      if (op.start == i && op.edit->action == Action::Replace) rep = &op;
    size_t last = i;
    if (rep) {
      emit_region(*rep, b.lines[i]);
      last = i + rep->count - 1;
    } else {
      out.push_back(b.lines[i]);
    }
    for (const Op& op : ops)
      if (op.start + op.count - 1 == last && op.edit->action == Action::InsertAfter) emit_region(op, b.lines[op.start]);
    i = last + 1;
  }
  b.lines = std::move(out);
  return ok_status();
}

}  // namespace patcher
