#include "api_check.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "anchor.h"
#include "fmt/format.h"
#include "py_outline.h"
#include "sentinel.h"
#include "text.h"

namespace patcher {

namespace {

using py::Def;
using py::DefKind;
using py::Outline;

struct Module {
  std::string name, path;
  Outline outline;
};

// Where a name of a module leads: a definition, or a module.
struct Found {
  const Module* mod = nullptr;
  const Def* def = nullptr;  // nullptr with mod set: the name is the module itself
};

class TreeIndex {
 public:
  explicit TreeIndex(const Tree& tree) : tree_(tree) {}

  // The module's file (a.b -> a/b.py or a/b/__init__.py), regions blanked
  // out: the check is about the engine's names, never ours. nullptr if absent.
  Result<const Module*> module(const std::string& dotted) {
    auto it = cache_.find(dotted);
    if (it != cache_.end()) return it->second.get();
    std::string base = dotted;
    std::replace(base.begin(), base.end(), '.', '/');
    std::unique_ptr<Module> mod;
    for (const std::string& path : {base + ".py", base + "/__init__.py"}) {
      auto data = tree_.read(path);
      if (!data) return data.error();
      if (!*data) continue;
      mod = std::make_unique<Module>();
      mod->name = dotted;
      mod->path = path;
      mod->outline = py::outline(engine_text((*data)->bytes), dotted, path.ends_with("__init__.py"));
      break;
    }
    const Module* out = mod.get();
    cache_[dotted] = std::move(mod);
    return out;
  }

  // `name` of `module`, re-exports followed (at most 8 hops).
  Result<Found> resolve(const std::string& module, const std::string& name, int depth = 0) {
    auto mod = this->module(module);
    if (!mod) return mod.error();
    if (!*mod || depth > 8) return Found{};
    const Def* d = py::find_def((*mod)->outline, name);
    if (d && d->kind == DefKind::Import) {
      if (d->imported.empty()) return as_module(d->from);  // import a.b as name
      auto sub = as_module(d->from + "." + d->imported);
      if (!sub) return sub.error();
      if (sub->mod) return sub;
      return resolve(d->from, d->imported, depth + 1);
    }
    if (d) return Found{*mod, d};
    return as_module(module + "." + name);
  }

  Result<Found> as_module(const std::string& dotted) {
    auto mod = module(dotted);
    if (!mod) return mod.error();
    return Found{*mod, nullptr};
  }

  // A class member, bases followed; `owner` is set to the class defining it.
  Result<const Def*> member(const Found& cls, const std::string& name, Found* owner, int depth = 0) {
    if (!cls.def || cls.def->kind != DefKind::Class || depth > 12) return nullptr;
    const auto& list = members_of(cls);
    for (const auto& d : list)
      if (d.name == name) {
        if (owner) *owner = cls;
        return &d;
      }
    for (const auto& b : cls.def->bases) {
      auto base = base_class(*cls.mod, b);
      if (!base) return base.error();
      auto found = member(*base, name, owner, depth + 1);
      if (!found) return found.error();
      if (*found) return *found;
    }
    return nullptr;
  }

  const std::vector<Def>& members_of(const Found& cls) {
    auto key = std::pair{cls.mod, cls.def};
    auto it = members_.find(key);
    if (it == members_.end()) it = members_.emplace(key, py::members(cls.mod->outline, *cls.def)).first;
    return it->second;
  }

  // Every member name of a class and its bases (for nearest-match reports).
  Result<std::vector<std::pair<std::string, const Def*>>> all_members(const Found& cls, int depth = 0) {
    std::vector<std::pair<std::string, const Def*>> out;
    if (!cls.def || depth > 12) return out;
    for (const auto& d : members_of(cls)) out.emplace_back(d.name, &d);
    for (const auto& b : cls.def->bases) {
      auto base = base_class(*cls.mod, b);
      if (!base) return base.error();
      auto more = all_members(*base, depth + 1);
      if (!more) return more.error();
      out.insert(out.end(), more->begin(), more->end());
    }
    return out;
  }

  Result<Found> base_class(const Module& mod, std::string expr) {
    expr = expr.substr(0, expr.find('['));
    if (expr.find('=') != std::string::npos) return Found{};  // metaclass=...
    size_t dot = expr.rfind('.');
    if (dot == std::string::npos) return resolve(mod.name, std::string(trim(expr)));
    auto head = resolve(mod.name, expr.substr(0, expr.find('.')));
    if (!head) return head.error();
    if (!head->mod || head->def) return Found{};
    return resolve(head->mod->name, expr.substr(dot + 1));  // a.b.C, a and b modules
  }

  // Abstract methods of a class and its bases.
  Result<std::set<std::string>> abstract(const Found& cls, int depth = 0) {
    std::set<std::string> out;
    if (!cls.def || depth > 12) return out;
    for (const auto& d : members_of(cls))
      if (d.kind == DefKind::Function &&
          std::any_of(d.decorators.begin(), d.decorators.end(), [](auto& x) { return x.ends_with("abstractmethod"); }))
        out.insert(d.name);
    for (const auto& b : cls.def->bases) {
      auto base = base_class(*cls.mod, b);
      if (!base) return base.error();
      auto more = abstract(*base, depth + 1);
      if (!more) return more.error();
      out.insert(more->begin(), more->end());
    }
    return out;
  }

  // A generated constructor's parameters: the annotated fields of a
  // dataclass or NamedTuple, its bases' first.
  Result<std::vector<std::string>> fields(const Found& cls, int depth = 0) {
    std::vector<std::string> out;
    if (!cls.def || depth > 12) return out;
    for (auto it = cls.def->bases.rbegin(); it != cls.def->bases.rend(); ++it) {
      auto base = base_class(*cls.mod, *it);
      if (!base) return base.error();
      auto more = fields(*base, depth + 1);
      if (!more) return more.error();
      out.insert(out.end(), more->begin(), more->end());
    }
    for (const auto& d : members_of(cls))
      if (d.kind == DefKind::Value && d.annotated && d.text.find("  # in ") == std::string::npos &&
          d.text.find("ClassVar") == std::string::npos && d.text.find("init=False") == std::string::npos &&
          std::find(out.begin(), out.end(), d.name) == out.end())
        out.push_back(d.name);
    return out;
  }

  // The sibling files of a missing module's folder (for nearest matches).
  std::vector<std::string> siblings(const std::string& dotted) {
    std::string folder = dotted.substr(0, dotted.rfind('.'));
    std::replace(folder.begin(), folder.end(), '.', '/');
    std::vector<std::string> out;
    auto dir = tree_.open_parent(folder + "/x");
    if (!dir || !*dir) return out;
    auto names = list_dir((*dir)->get(), folder);
    if (!names) return out;
    for (const auto& n : *names) {
      if (n.ends_with(".py")) out.push_back(folder + "/" + n);
      else if (n.find('.') == std::string::npos) out.push_back(folder + "/" + n + "/");
    }
    return out;
  }

 private:
  static std::string engine_text(const std::string& bytes) {
    Text t = split_lines(bytes);
    int depth = 0;
    for (auto& l : t.lines) {
      Sentinel s = parse_sentinel(l);
      bool inside = depth > 0 || s.kind == SentinelKind::Begin;
      if (s.kind == SentinelKind::Begin) ++depth;
      if (s.kind == SentinelKind::End && depth > 0) --depth;
      if (inside || s.kind == SentinelKind::End) l.clear();
    }
    return join_lines(t);
  }

  const Tree& tree_;
  std::map<std::string, std::unique_ptr<Module>> cache_;
  std::map<std::pair<const Module*, const Def*>, std::vector<Def>> members_;
};

std::string join(const std::vector<std::string>& xs) {
  std::string out;
  for (const auto& x : xs) out += (out.empty() ? "" : ", ") + x;
  return out;
}

bool is_static(const Def& d) {
  return std::any_of(d.decorators.begin(), d.decorators.end(),
                     [](auto& x) { return x == "staticmethod" || x.ends_with(".staticmethod"); });
}

bool is_property(const Def& d) {
  return std::any_of(d.decorators.begin(), d.decorators.end(),
                     [](auto& x) { return x.ends_with("property") || x.ends_with(".setter"); });
}

// What a member definition is, in the pins' words.
std::string member_kind(const Def& d) {
  if (d.kind == DefKind::Class) return "class";
  if (d.kind == DefKind::Function) return is_property(d) ? "property" : "method";
  return "attribute";
}

// Whether code written for `pinned` still works on `now` (reading a
// property or an attribute is the same; calling a method is not).
bool same_family(const std::string& pinned, const std::string& now) {
  auto family = [](const std::string& k) {
    if (k == "method" || k == "function") return 1;
    if (k == "class") return 2;
    return 3;  // attribute, property, enum-member, value
  };
  return pinned.empty() || family(pinned) == family(now);
}

// Parameters as callers see them: self/cls dropped from a method.
std::vector<std::string> call_params(const Def& d, bool method) {
  std::vector<std::string> p = d.params;
  if (method && !is_static(d) && !p.empty()) p.erase(p.begin());
  return p;
}

std::string params_problem(const ApiUse& u, const std::vector<std::string>& now) {
  if (u.signature) {
    if (now != *u.signature)
      return fmt::format("signature changed: we override ({}), it is now ({})", join(*u.signature), join(now));
    return "";
  }
  bool varargs = false, varkw = false;
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i].starts_with("**")) varkw = true;
    else if (now[i].starts_with("*")) varargs = true;
  }
  for (size_t i = 0; i < u.params.size(); ++i) {
    if (i >= now.size() || now[i].starts_with("*")) {
      if (varargs) break;
      return fmt::format("parameters changed: we pass ({}) by position, it now takes ({})", join(u.params), join(now));
    }
    if (now[i] != u.params[i])
      return fmt::format("parameters changed: we pass ({}) by position, it now takes ({})", join(u.params), join(now));
  }
  for (const auto& k : u.keywords)
    if (!varkw && std::find(now.begin(), now.end(), k) == now.end())
      return fmt::format("keyword {}= we pass is no longer accepted: it now takes ({})", k, join(now));
  return "";
}

struct Ranked {
  std::string name;
  double score;
  std::string where;
};

std::vector<Ranked> nearest_names(const std::string& want,
                                  const std::vector<std::pair<std::string, std::string>>& candidates) {
  std::vector<Ranked> out;
  std::set<std::string> seen;
  for (const auto& [n, where] : candidates)
    if (seen.insert(n).second) out.push_back({n, similarity(want, n), where});
  std::stable_sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.score > b.score; });
  if (out.size() > 3) out.resize(3);
  return out;
}

class Checker {
 public:
  Checker(const Tree& tree, const ApiPins& pins) : index_(tree), pins_(pins) {}

  Result<ApiReport> run() {
    for (const auto& u : pins_.uses) {
      Status st = check(u);
      if (!st) return st.error();
    }
    return std::move(report_);
  }

 private:
  // One finding: the report's lines and the structured item.
  void finding(const ApiUse& u, const std::string& file, const std::string& problem, const std::string& now,
               const std::vector<Ranked>& near = {}) {
    DriftItem it;
    it.kind = "api";
    it.file = file;
    it.overlay = pins_.overlay;
    it.manifest = pins_.file;
    it.symbol = u.symbol();
    it.problem = problem;
    it.now = now;
    it.used_by = u.used_by;
    std::string what = u.is.empty() ? u.kind : u.is;
    report_.lines.push_back(fmt::format("api {}: {} ({}): {}", pins_.overlay, it.symbol, what, problem));
    report_.lines.push_back(fmt::format("  pinned at {}:{}", pins_.file, u.line));
    if (!now.empty()) report_.lines.push_back("  now: " + now);
    if (!near.empty()) {
      report_.lines.push_back("  nearest names (similarity):");
      for (const auto& n : near) {
        report_.lines.push_back(fmt::format("    {} {:.2f}{}", n.name, n.score, n.where.empty() ? "" : ": " + n.where));
        it.nearest.push_back(DriftItem::Near{0, n.score, n.name + (n.where.empty() ? "" : ": " + n.where), "", 0});
      }
    }
    report_.lines.push_back("  used by " + join(u.used_by));
    report_.items.push_back(std::move(it));
  }

  static std::string module_path(const std::string& dotted) {
    std::string p = dotted;
    std::replace(p.begin(), p.end(), '.', '/');
    return p + ".py";
  }

  std::string at(const Module& m, const Def& d) const {
    std::string head = d.text.substr(0, d.text.find("  # in "));
    if (head.size() > 120) head = head.substr(0, 117) + "...";
    return fmt::format("{}:{}: {}", m.path, d.line + 1, head);
  }

  Status check(const ApiUse& u) {
    if (u.kind == "module") return check_module(u);
    if (u.kind == "name") return check_name(u);
    if (u.kind == "member") return check_member(u);
    if (u.kind == "abstract") return check_abstract(u);
    return check_local(u);
  }

  Status check_module(const ApiUse& u) {
    auto mod = index_.module(u.module);
    if (!mod) return mod.error();
    if (*mod) return ok_status();
    std::vector<std::pair<std::string, std::string>> c;
    for (const auto& s : index_.siblings(u.module)) c.emplace_back(s, "");
    finding(u, module_path(u.module), "module gone", "", nearest_names(module_path(u.module), c));
    return ok_status();
  }

  // The module holding a name, or a finding when it is gone.
  Result<const Module*> need_module(const ApiUse& u) {
    auto mod = index_.module(u.module);
    if (!mod) return mod.error();
    if (!*mod) {
      std::vector<std::pair<std::string, std::string>> c;
      for (const auto& s : index_.siblings(u.module)) c.emplace_back(s, "");
      finding(u, module_path(u.module), "its module " + u.module + " is gone", "",
              nearest_names(module_path(u.module), c));
    }
    return *mod;
  }

  std::vector<Ranked> near_top_level(const Module& m, const std::string& want) {
    std::vector<std::pair<std::string, std::string>> c;
    for (const auto& d : m.outline.defs) c.emplace_back(d.name, at(m, d));
    return nearest_names(want, c);
  }

  Status check_name(const ApiUse& u) {
    auto mod = need_module(u);
    if (!mod) return mod.error();
    if (!*mod) return ok_status();
    auto found = index_.resolve(u.module, u.name);
    if (!found) return found.error();
    bool exists = found->mod != nullptr;
    if (!u.present) {
      if (exists)
        finding(u, (*mod)->path, "now defined (our code relies on its absence)",
                found->def ? at(*found->mod, *found->def) : found->mod->path);
      return ok_status();
    }
    if (!exists) {
      finding(u, (*mod)->path, "gone", "", near_top_level(**mod, u.name));
      return ok_status();
    }
    if (!found->def) {
      if (!u.is.empty() && u.is != "module") finding(u, (*mod)->path, "now a module, was a " + u.is, found->mod->path);
      return ok_status();
    }
    const Def& d = *found->def;
    std::string now = d.kind == DefKind::Class ? "class" : d.kind == DefKind::Function ? "function" : "value";
    if (!u.is.empty() && u.is != now && !(u.is == "value" && d.kind == DefKind::Value)) {
      finding(u, (*mod)->path, "now a " + now + ", was a " + u.is, at(*found->mod, d));
      return ok_status();
    }
    if (d.kind == DefKind::Function && (!u.params.empty() || !u.keywords.empty())) {
      std::string p = params_problem(u, d.params);
      if (!p.empty()) finding(u, (*mod)->path, p, at(*found->mod, d));
    }
    if (d.kind == DefKind::Function && !u.annotation.empty() &&
        py::normal_annotation(d.annotation) != py::normal_annotation(u.annotation))
      finding(u, (*mod)->path,
              fmt::format("its return type changed: was {}, now {}", u.annotation,
                          d.annotation.empty() ? "(none)" : d.annotation),
              at(*found->mod, d));
    return ok_status();
  }

  Status check_member(const ApiUse& u) {
    auto mod = need_module(u);
    if (!mod) return mod.error();
    if (!*mod) return ok_status();
    auto cls = index_.resolve(u.module, u.name);
    if (!cls) return cls.error();
    if (!cls->def || cls->def->kind != DefKind::Class) {
      finding(u, (*mod)->path, "its class " + u.name + " is gone", "", near_top_level(**mod, u.name));
      return ok_status();
    }
    Found owner;
    auto m = index_.member(*cls, u.member, &owner);
    if (!m) return m.error();
    if (!u.present) {
      if (*m) finding(u, (*mod)->path, "now defined (our code relies on its absence)", at(*owner.mod, **m));
      return ok_status();
    }
    if (!*m) {
      if (u.member == "__init__") {  // no __init__ of its own: a dataclass's fields, or none
        auto f = index_.fields(*cls);
        if (!f) return f.error();
        std::string p = u.params.empty() && u.keywords.empty() ? "" : params_problem(u, *f);
        if (!p.empty()) finding(u, (*mod)->path, p, at(*cls->mod, *cls->def));
        return ok_status();
      }
      auto all = index_.all_members(*cls);
      if (!all) return all.error();
      std::vector<std::pair<std::string, std::string>> c;
      const Module* where = cls->mod;
      for (const auto& [n, d] : *all) c.emplace_back(n, fmt::format("line {}: {}", d->line + 1, d->text.substr(0, d->text.find("  # in "))));
      finding(u, where->path, "gone from class " + u.name, "", nearest_names(u.member, c));
      return ok_status();
    }
    const Def& d = **m;
    std::string now = member_kind(d);
    if (!same_family(u.is, now)) {
      finding(u, owner.mod->path, "now a " + now + ", was a " + u.is, at(*owner.mod, d));
      return ok_status();
    }
    if (d.kind == DefKind::Function && (u.signature || !u.params.empty() || !u.keywords.empty())) {
      std::string p = params_problem(u, call_params(d, true));
      if (!p.empty()) finding(u, owner.mod->path, p, at(*owner.mod, d));
    }
    if (!u.type.empty() && !py::has_word(d.text, u.type))
      finding(u, owner.mod->path, "its type changed: the definition no longer names " + u.type, at(*owner.mod, d));
    else if (!u.annotation.empty() && py::normal_annotation(d.annotation) != py::normal_annotation(u.annotation))
      finding(u, owner.mod->path,
              fmt::format("its {} changed: was {}, now {}", d.kind == DefKind::Function && member_kind(d) == "method"
                                                                ? "return type"
                                                                : "type",
                          u.annotation, d.annotation.empty() ? "(none)" : d.annotation),
              at(*owner.mod, d));
    return ok_status();
  }

  Status check_abstract(const ApiUse& u) {
    auto mod = need_module(u);
    if (!mod) return mod.error();
    if (!*mod) return ok_status();
    auto cls = index_.resolve(u.module, u.name);
    if (!cls) return cls.error();
    if (!cls->def || cls->def->kind != DefKind::Class) {
      finding(u, (*mod)->path, "its class " + u.name + " is gone", "", near_top_level(**mod, u.name));
      return ok_status();
    }
    auto now = index_.abstract(*cls);
    if (!now) return now.error();
    std::set<std::string> pinned(u.methods.begin(), u.methods.end());
    std::vector<std::string> added, removed;
    for (const auto& n : *now)
      if (!pinned.count(n)) added.push_back(n);
    for (const auto& n : pinned)
      if (!now->count(n)) removed.push_back(n);
    if (added.empty() && removed.empty()) return ok_status();
    std::string p = "abstract methods changed:";
    if (!added.empty()) p += " new " + join(added) + " (our subclass may not implement them)";
    if (!removed.empty()) p += std::string(added.empty() ? "" : ";") + " no longer abstract " + join(removed);
    finding(u, cls->mod->path, p, at(*cls->mod, *cls->def));
    return ok_status();
  }

  Status check_local(const ApiUse& u) {
    std::string dotted = u.file.substr(0, u.file.size() - (u.file.ends_with("/__init__.py") ? 12 : 3));
    std::replace(dotted.begin(), dotted.end(), '/', '.');
    auto mod = index_.module(dotted);
    if (!mod) return mod.error();
    if (!*mod) {
      finding(u, u.file, "file gone", "");
      return ok_status();
    }
    const Outline& o = (*mod)->outline;
    if (u.scope.empty()) {
      if (!py::find_def(o, u.name)) finding(u, u.file, "no longer defined at module level", "", near_top_level(**mod, u.name));
      return ok_status();
    }
    // Walk "class X/def f" down the outline.
    const std::vector<Def>* level = &o.defs;
    const Def* fn = nullptr;
    Found cls{*mod, nullptr};
    size_t from = 0;
    while (from < u.scope.size()) {
      size_t slash = u.scope.find('/', from);
      std::string seg = u.scope.substr(from, slash == std::string::npos ? std::string::npos : slash - from);
      from = slash == std::string::npos ? u.scope.size() : slash + 1;
      bool want_class = seg.starts_with("class ");
      std::string name = seg.substr(seg.find(' ') + 1);
      const Def* hit = nullptr;
      for (const auto& d : *level)
        if (d.name == name && (d.kind == (want_class ? DefKind::Class : DefKind::Function))) hit = &d;
      if (!hit) {
        finding(u, u.file, "its scope " + u.scope + " is gone", "");
        return ok_status();
      }
      if (want_class) {
        cls.def = hit;
        level = &index_.members_of(cls);
      } else {
        fn = hit;
      }
      if (!want_class) break;
    }
    if (!fn) return ok_status();
    if (py::binds(o, fn->line, u.name)) return ok_status();
    std::vector<std::pair<std::string, std::string>> c;
    for (const auto& n : py::bound_names(o, fn->line)) c.emplace_back(n, "");
    finding(u, u.file, "no longer bound in " + u.scope, at(**mod, *fn), nearest_names(u.name, c));
    return ok_status();
  }

  TreeIndex index_;
  const ApiPins& pins_;
  ApiReport report_;
};

}  // namespace

Result<ApiReport> check_api(const Tree& tree, const ApiPins& pins) { return Checker(tree, pins).run(); }

}  // namespace patcher
