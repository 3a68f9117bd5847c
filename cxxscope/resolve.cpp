#include "resolve.h"

#include <algorithm>

namespace cxxscope {
namespace {

struct Segment {
  std::string kind, name;
};

bool ident(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string segment_error(std::string_view seg, Segment* out) {
  size_t sp = seg.find(' ');
  if (sp == std::string_view::npos) return "segment \"" + std::string(seg) + "\" has no kind and name";
  std::string kind(seg.substr(0, sp));
  std::string name(seg.substr(sp + 1));
  if (kind != "namespace" && kind != "class" && kind != "struct" && kind != "union" && kind != "fn")
    return "segment \"" + std::string(seg) + "\": kind must be namespace, class, struct, union or fn";
  bool name_ok = ident(name) || (kind == "namespace" && name == "(anonymous)");
  if (!name_ok && kind == "fn") {
    // A qualified name: A::B::f.
    name_ok = true;
    size_t pos = 0;
    while (true) {
      size_t sep = name.find("::", pos);
      if (!ident(std::string_view(name).substr(pos, sep == std::string::npos ? std::string::npos : sep - pos))) {
        name_ok = false;
        break;
      }
      if (sep == std::string::npos) break;
      pos = sep + 2;
    }
  }
  if (!name_ok) return "segment \"" + std::string(seg) + "\": \"" + name + "\" is not a C/C++ name";
  if (out) *out = Segment{kind, name};
  return "";
}

bool kind_matches(const std::string& seg_kind, const std::string& def_kind) {
  if (seg_kind == "fn") return def_kind == "function" || def_kind == "method";
  return seg_kind == def_kind;
}

bool name_matches(const Segment& s, const Definition& d) {
  if (s.name.find("::") == std::string::npos) return d.name == s.name;
  const std::string& q = d.qualified;
  return q == s.name || (q.size() > s.name.size() + 2 && q.compare(q.size() - s.name.size(), s.name.size(), s.name) == 0 &&
                         q.compare(q.size() - s.name.size() - 2, 2, "::") == 0);
}

struct Area {
  size_t begin, end;  // 0-based [begin, end)
  const Definition* owner;
};

}  // namespace

std::string scope_syntax_error(std::string_view scope) {
  if (scope.empty()) return "scope is empty";
  size_t pos = 0;
  while (true) {
    size_t slash = scope.find('/', pos);
    std::string_view seg = scope.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos);
    if (auto e = segment_error(seg, nullptr); !e.empty()) return e;
    if (slash == std::string_view::npos) return "";
    pos = slash + 1;
  }
}

ScopeResolution resolve_scope(const std::vector<Definition>& defs, std::string_view scope, size_t line_count) {
  ScopeResolution r;
  std::vector<Area> areas = {{0, line_count, nullptr}};
  size_t pos = 0;
  while (true) {
    size_t slash = scope.find('/', pos);
    std::string_view text = scope.substr(pos, slash == std::string_view::npos ? std::string_view::npos : slash - pos);
    r.segment = std::string(text);
    Segment seg;
    if (auto e = segment_error(text, &seg); !e.empty()) {
      r.refusal = e;
      return r;
    }
    bool last = slash == std::string_view::npos;
    std::vector<const Definition*> hits;
    r.found.clear();
    r.headers.clear();
    r.header_names.clear();
    for (const auto& d : defs) {
      if (d.begin == 0 || d.end < d.begin || d.end > line_count) continue;
      size_t b = d.begin - 1, e = d.end;
      bool inside = false;
      for (const auto& a : areas)
        if (&d != a.owner && a.begin <= b && e <= a.end) inside = true;
      if (!inside) continue;
      r.headers.push_back(d.name_line - 1);
      r.header_names.push_back(d.kind + " " + d.name);
      if (kind_matches(seg.kind, d.kind) && name_matches(seg, d)) hits.push_back(&d);
    }
    for (const auto* h : hits) r.found.push_back(h->name_line - 1);
    for (const auto* h : hits)
      if (!h->valid) {
        r.refusal = "\"" + r.segment + "\" at line " + std::to_string(h->name_line) +
                    ": Clang gives no trustworthy range for it (" + (h->why.empty() ? "invalid" : h->why) +
                    "); refusing to guess";
        return r;
      }
    bool reopenable = seg.kind == "namespace" && !last;
    if (hits.empty() || (hits.size() > 1 && !reopenable)) return r;
    areas.clear();
    for (const auto* h : hits) areas.push_back({h->begin - 1, h->end, h});
    if (last) break;
    pos = slash + 1;
  }
  r.ok = true;
  r.begin = areas.front().begin;
  r.end = areas.front().end;
  return r;
}

std::string anchor_refusal(const FileReport& report, size_t first, size_t count) {
  size_t a = first + 1, b = first + count;  // 1-based inclusive
  for (const auto& [x, y] : report.inactive)
    if (a <= y && x <= b)
      return "lines " + std::to_string(x) + "-" + std::to_string(y) +
             " are in a preprocessor branch that is inactive under this file's flags: an edit there would never be "
             "compiled";
  for (const auto& [x, y] : report.macros)
    if (a <= y && x <= b)
      return "lines " + std::to_string(x) + "-" + std::to_string(y) +
             " are one multi-line #define (continuation lines): an edit there would break or silently join the macro";
  return "";
}

}  // namespace cxxscope
