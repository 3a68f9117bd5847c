// Why one file over 500 lines: every key of an overlay manifest is validated here in one pass,
// so a manifest error always comes from one place with one message style.
#include "manifest.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <toml++/toml.h>

#include "paths.h"
#include "sentinel.h"
#include "resolve.h"
#include "report.h"
#include "text.h"

namespace patcher {

const char* action_name(Action a) {
  switch (a) {
    case Action::InsertBefore: return "insert_before";
    case Action::InsertAfter: return "insert_after";
    case Action::Replace: return "replace";
  }
  return "?";
}

const FileSpec* Manifest::find_file(const std::string& path) const {
  for (const auto& f : files)
    if (f.path == path) return &f;
  return nullptr;
}

const BuiltFile* Manifest::find_built(const std::string& path) const {
  for (const auto& b : built_files)
    if (b.path == path) return &b;
  return nullptr;
}

const Edit* Manifest::find_edit(const std::string& id) const {
  for (const auto& f : files)
    for (const auto& e : f.edits)
      if (e.id == id) return &e;
  return nullptr;
}

const Manifest* ManifestSet::find(const std::string& name) const {
  for (const auto& m : overlays)
    if (m.overlay == name) return &m;
  return nullptr;
}

const Manifest& ManifestSet::get(const std::string& name) const {
  const Manifest* m = find(name);
  if (!m) throw std::logic_error("ManifestSet::get: unknown overlay " + name);
  return *m;
}

namespace {

// Carries the manifest path and turns a node position into "line N: ".
struct Ctx {
  std::string file;
  Error err(const toml::node& n, const std::string& msg) const {
    return make_error(ErrorKind::Usage, file, "line " + std::to_string(n.source().begin.line) + ": " + msg);
  }
  Error err(const std::string& msg) const { return make_error(ErrorKind::Usage, file, msg); }
};

Status check_keys(const Ctx& c, const toml::table& t, const std::set<std::string>& allowed, const std::string& where) {
  for (auto&& [k, v] : t) {
    std::string key(k.str());
    if (!allowed.count(key)) return c.err(v, "unknown key \"" + key + "\" in " + where);
  }
  return ok_status();
}

Result<std::string> get_string(const Ctx& c, const toml::table& t, const std::string& key, const std::string& where,
                               bool required) {
  const toml::node* n = t.get(key);
  if (!n) {
    if (required) return c.err("missing required key \"" + key + "\" in " + where);
    return std::string();
  }
  if (!n->is_string()) return c.err(*n, "\"" + key + "\" in " + where + " must be a string");
  return std::string(*n->value<std::string>());
}

Result<int64_t> get_int(const Ctx& c, const toml::table& t, const std::string& key, const std::string& where,
                        int64_t dflt) {
  const toml::node* n = t.get(key);
  if (!n) return dflt;
  if (!n->is_integer()) return c.err(*n, "\"" + key + "\" in " + where + " must be an integer");
  return *n->value<int64_t>();
}

Result<std::vector<std::string>> get_strings(const Ctx& c, const toml::table& t, const std::string& key,
                                             const std::string& where) {
  std::vector<std::string> out;
  const toml::node* n = t.get(key);
  if (!n) return out;
  const toml::array* arr = n->as_array();
  if (!arr) return c.err(*n, "\"" + key + "\" in " + where + " must be an array of strings");
  for (const toml::node& x : *arr) {
    if (!x.is_string()) return c.err(x, "\"" + key + "\" in " + where + " must be an array of strings");
    out.push_back(std::string(*x.value<std::string>()));
  }
  return out;
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char ch : s)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
          ch == '_' || ch == '.'))
      return false;
  return true;
}

bool valid_scope(const std::string& scope) {
  size_t pos = 0;
  while (true) {
    size_t slash = scope.find('/', pos);
    std::string seg = scope.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
    size_t kw = 0;
    for (const char* k : {"class ", "def ", "async def "})
      if (seg.rfind(k, 0) == 0) kw = std::string(k).size();
    if (kw == 0 || kw == seg.size()) return false;
    for (size_t i = kw; i < seg.size(); ++i) {
      char ch = seg[i];
      bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || (i > kw && ch >= '0' && ch <= '9');
      if (!ok) return false;
    }
    if (slash == std::string::npos) return true;
    pos = slash + 1;
  }
}

bool valid_sha(const std::string& s) {
  if (s.size() != 64) return false;
  for (char ch : s)
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  return true;
}

// Checks text the engine injects or matches: UTF-8, LF, no sentinel lines.
Status check_text(const std::string& text, const std::string& display, const char* what) {
  if (auto off = find_invalid_utf8(text))
    return make_error(ErrorKind::Usage, display,
                      std::string(what) + " is not valid UTF-8 (line " + std::to_string(line_of_offset(text, *off)) +
                          ")");
  if (auto l = find_cr_line(text))
    return make_error(ErrorKind::Usage, display,
                      std::string(what) + " has CRLF/CR line endings (line " + std::to_string(*l) +
                          "); the engine handles LF text only");
  Text t = split_lines(text);
  for (size_t i = 0; i < t.lines.size(); ++i)
    if (looks_like_sentinel(t.lines[i]))
      return make_error(ErrorKind::Usage, display,
                        std::string(what) + " line " + std::to_string(i + 1) +
                            " looks like an overlay sentinel; the engine could not tell it from its own");
  return ok_status();
}

Result<std::string> load_fragment(const std::string& fragments_dir, const std::string& rel, const Ctx& c,
                                  const char* what) {
  if (auto s = validate_rel_path(rel, c.file, what); !s) return s.error();
  std::string display = fragments_dir + "/" + rel;
  auto tree = Tree::open(fragments_dir);
  if (!tree) return make_error(ErrorKind::Usage, display, std::string(what) + " folder is missing or unreadable");
  auto data = tree->read(rel);
  if (!data) {
    Error e = data.error();
    e.file = display;
    return e;
  }
  if (!data->has_value()) return make_error(ErrorKind::Usage, display, std::string(what) + " file does not exist");
  std::string text = std::move((*data)->bytes);
  if (text.size() > kMaxFragmentBytes)
    return make_error(ErrorKind::Usage, display,
                      std::string(what) + " is " + std::to_string(text.size()) + " bytes; at most " +
                          std::to_string(kMaxFragmentBytes));
  if (auto s = check_text(text, display, what); !s) return s.error();
  return text;
}

Result<Edit> parse_edit(const Ctx& c, const toml::table& t, const std::string& fragments_dir, bool cxx) {
  static const std::set<std::string> keys = {"id", "scope", "anchor", "occurrences", "action", "indent",
                                             "fragment", "superseded_by", "why", "compile_standalone"};
  if (auto s = check_keys(c, t, keys, "[[files.edits]]"); !s) return s.error();
  Edit e;
  auto id = get_string(c, t, "id", "[[files.edits]]", true);
  if (!id) return id.error();
  e.id = *id;
  if (!valid_name(e.id)) return c.err(*t.get("id"), "edit id \"" + e.id + "\" must be 1-64 of [A-Za-z0-9._-]");
  std::string where = "edit \"" + e.id + "\"";
  auto scope = get_string(c, t, "scope", where, false);
  if (!scope) return scope.error();
  e.scope = *scope;
  if (cxx && !e.scope.empty()) {
    if (std::string why = cxxscope::scope_syntax_error(e.scope); !why.empty())
      return c.err(*t.get("scope"), "C/C++ scope \"" + e.scope + "\" of " + where + ": " + why +
                                        " (segments like \"namespace vllm/fn swap_blocks_batch\")");
  } else if (!e.scope.empty() && !valid_scope(e.scope))
    return c.err(*t.get("scope"), "scope \"" + e.scope + "\" of " + where +
                                      " must be \"class X\", \"def f\" or \"async def f\" segments joined by \"/\"");
  auto anchor = get_string(c, t, "anchor", where, true);
  if (!anchor) return anchor.error();
  std::string a = strip_one_trailing_newline(*anchor);
  if (trim(a).empty()) return c.err(*t.get("anchor"), "anchor of " + where + " is empty");
  if (a.size() > kMaxAnchorBytes)
    return c.err(*t.get("anchor"), "anchor of " + where + " is " + std::to_string(a.size()) + " bytes; at most " +
                                       std::to_string(kMaxAnchorBytes) + " (an anchor is a few distinctive lines)");
  if (auto s = check_text(a, c.file, ("anchor of " + where).c_str()); !s) return s.error();
  e.anchor_lines = split_lines(a).lines;
  auto occ = get_int(c, t, "occurrences", where, 1);
  if (!occ) return occ.error();
  if (*occ < 1 || *occ > 1000) return c.err(*t.get("occurrences"), "occurrences of " + where + " must be 1..1000");
  e.occurrences = static_cast<int>(*occ);
  auto action = get_string(c, t, "action", where, true);
  if (!action) return action.error();
  if (*action == "insert_before")
    e.action = Action::InsertBefore;
  else if (*action == "insert_after")
    e.action = Action::InsertAfter;
  else if (*action == "replace")
    e.action = Action::Replace;
  else
    return c.err(*t.get("action"),
                 "action \"" + *action + "\" of " + where + " must be insert_before, insert_after or replace");
  auto indent = get_int(c, t, "indent", where, 0);
  if (!indent) return indent.error();
  if (*indent < 0 || *indent > 64) return c.err(*t.get("indent"), "indent of " + where + " must be 0..64");
  e.indent = static_cast<int>(*indent);
  auto frag = get_string(c, t, "fragment", where, true);
  if (!frag) return frag.error();
  e.fragment = *frag;
  auto text = load_fragment(fragments_dir, e.fragment, c, "fragment");
  if (!text) return text.error();
  e.fragment_lines = split_lines(*text).lines;
  if (e.fragment_lines.empty() && e.action != Action::Replace)
    return make_error(ErrorKind::Usage, fragments_dir + "/" + e.fragment,
                      "fragment is empty (only a replace edit may inject nothing)");
  for (const auto& l : e.fragment_lines) {
    if (is_blank(l)) continue;
    if (l[0] == ' ' || l[0] == '\t')
      return make_error(ErrorKind::Usage, fragments_dir + "/" + e.fragment,
                        "fragment must be written at column 0 (the engine indents it to the anchor)");
    break;
  }
  if (const toml::node* n = t.get("superseded_by")) {
    if (!n->is_string()) return c.err(*n, "\"superseded_by\" of " + where + " must be a string");
    std::string sb = strip_one_trailing_newline(*n->value<std::string>());
    if (trim(sb).empty()) return c.err(*n, "\"superseded_by\" of " + where + " is empty");
    e.superseded_by = sb;
  }
  auto why = get_string(c, t, "why", where, false);
  if (!why) return why.error();
  e.why = *why;
  if (const toml::node* n = t.get("compile_standalone")) {
    if (!n->is_boolean()) return c.err(*n, "\"compile_standalone\" of " + where + " must be true or false");
    e.compile_standalone = *n->value<bool>();
  }
  return e;
}

}  // namespace

Result<Manifest> parse_manifest(const std::string& toml_text, const std::string& display_path,
                                const std::string& fragments_dir) {
  Ctx c{display_path};
  if (find_invalid_utf8(toml_text)) return c.err("manifest is not valid UTF-8");
  toml::table root;
  try {
    root = toml::parse(toml_text, display_path);
  } catch (const toml::parse_error& e) {
    std::string desc(e.description());
    return c.err("line " + std::to_string(e.source().begin.line) + ": malformed TOML: " + desc);
  }
  static const std::set<std::string> top = {"format", "overlay", "engine", "engine_version", "after",
                                            "summary", "files", "new_files", "built_files"};
  if (auto s = check_keys(c, root, top, "the manifest"); !s) return s.error();
  Manifest m;
  m.file = display_path;
  m.fragments_dir = fragments_dir;
  const toml::node* fmt = root.get("format");
  if (!fmt) return c.err("missing required key \"format\"");
  if (!fmt->is_integer() || *fmt->value<int64_t>() != 1)
    return c.err(*fmt, "unsupported format (this engine reads format = 1)");
  for (auto [key, dst] : {std::pair{"overlay", &m.overlay}, std::pair{"engine", &m.engine},
                          std::pair{"engine_version", &m.engine_version}, std::pair{"summary", &m.summary}}) {
    auto v = get_string(c, root, key, "the manifest", std::string(key) != "summary");
    if (!v) return v.error();
    *dst = *v;
  }
  if (!valid_name(m.overlay)) return c.err("overlay name \"" + m.overlay + "\" must be 1-64 of [A-Za-z0-9._-]");
  if (!valid_name(m.engine) || !valid_name(m.engine_version))
    return c.err("engine and engine_version must be 1-64 of [A-Za-z0-9._-]");
  if (const toml::node* n = root.get("after")) {
    const toml::array* arr = n->as_array();
    if (!arr) return c.err(*n, "\"after\" must be an array of overlay names");
    for (const toml::node& x : *arr) {
      if (!x.is_string()) return c.err(x, "\"after\" must be an array of overlay names");
      std::string name = *x.value<std::string>();
      if (name == m.overlay) return c.err(x, "overlay lists itself in \"after\"");
      m.after.push_back(name);
    }
  }
  std::set<std::string> ids, paths;
  if (const toml::node* n = root.get("files")) {
    const toml::array* arr = n->as_array();
    if (!arr || !arr->is_array_of_tables()) return c.err(*n, "\"files\" must be an array of tables ([[files]])");
    for (const toml::node& fnode : *arr) {
      const toml::table& ft = *fnode.as_table();
      if (auto s = check_keys(c, ft, {"path", "sha256", "edits", "compile_flags", "compile_commands", "must_compile"},
                              "[[files]]");
          !s)
        return s.error();
      FileSpec f;
      auto p = get_string(c, ft, "path", "[[files]]", true);
      if (!p) return p.error();
      f.path = *p;
      if (auto s = validate_rel_path(f.path, c.file, "path"); !s) return s.error();
      if (!paths.insert(f.path).second) return c.err(fnode, "file \"" + f.path + "\" is listed twice");
      auto sha = get_string(c, ft, "sha256", "file \"" + f.path + "\"", true);
      if (!sha) return sha.error();
      f.sha256 = *sha;
      if (!valid_sha(f.sha256))
        return c.err(*ft.get("sha256"), "sha256 of \"" + f.path + "\" must be 64 lowercase hex digits");
      const bool cxx = cxxscope::is_cxx_path(f.path);
      for (const char* key : {"compile_flags", "compile_commands", "must_compile"})
        if (ft.get(key) && !cxx)
          return c.err(*ft.get(key), std::string("\"") + key + "\" is for C/C++ targets; \"" + f.path + "\" is not one");
      auto flags = get_strings(c, ft, "compile_flags", "file \"" + f.path + "\"");
      if (!flags) return flags.error();
      f.compile_flags = *flags;
      auto db = get_string(c, ft, "compile_commands", "file \"" + f.path + "\"", false);
      if (!db) return db.error();
      f.compile_commands = *db;
      if (!f.compile_commands.empty())
        if (auto s = validate_rel_path(f.compile_commands, c.file, "compile_commands"); !s) return s.error();
      if (const toml::node* mc = ft.get("must_compile")) {
        if (!mc->is_boolean()) return c.err(*mc, "\"must_compile\" of \"" + f.path + "\" must be true or false");
        f.must_compile = *mc->value<bool>();
      }
      const toml::node* en = ft.get("edits");
      if (!en) return c.err(fnode, "file \"" + f.path + "\" has no [[files.edits]]");
      const toml::array* earr = en->as_array();
      if (!earr || !earr->is_array_of_tables() || earr->empty())
        return c.err(*en, "\"edits\" of \"" + f.path + "\" must be a non-empty array of tables");
      for (const toml::node& enode : *earr) {
        auto e = parse_edit(c, *enode.as_table(), fragments_dir, cxx);
        if (!e) return e.error();
        if (!ids.insert(e->id).second) return c.err(enode, "duplicate edit id \"" + e->id + "\"");
        f.edits.push_back(std::move(*e));
      }
      m.files.push_back(std::move(f));
    }
  }
  if (const toml::node* n = root.get("new_files")) {
    const toml::array* arr = n->as_array();
    if (!arr || !arr->is_array_of_tables()) return c.err(*n, "\"new_files\" must be an array of tables");
    for (const toml::node& nnode : *arr) {
      const toml::table& nt = *nnode.as_table();
      if (auto s = check_keys(c, nt, {"path", "source"}, "[[new_files]]"); !s) return s.error();
      NewFile nf;
      auto p = get_string(c, nt, "path", "[[new_files]]", true);
      if (!p) return p.error();
      nf.path = *p;
      if (auto s = validate_rel_path(nf.path, c.file, "path"); !s) return s.error();
      if (!paths.insert(nf.path).second) return c.err(nnode, "file \"" + nf.path + "\" is listed twice");
      auto src = get_string(c, nt, "source", "new file \"" + nf.path + "\"", true);
      if (!src) return src.error();
      nf.source = *src;
      auto text = load_fragment(fragments_dir, nf.source, c, "source");
      if (!text) return text.error();
      nf.text = *text;
      m.new_files.push_back(std::move(nf));
    }
  }
  if (const toml::node* n = root.get("built_files")) {
    const toml::array* arr = n->as_array();
    if (!arr || !arr->is_array_of_tables()) return c.err(*n, "\"built_files\" must be an array of tables");
    for (const toml::node& bnode : *arr) {
      const toml::table& bt = *bnode.as_table();
      if (auto s = check_keys(c, bt, {"path", "sha256", "sources", "build"}, "[[built_files]]"); !s) return s.error();
      BuiltFile bf;
      auto p = get_string(c, bt, "path", "[[built_files]]", true);
      if (!p) return p.error();
      bf.path = *p;
      if (auto s = validate_rel_path(bf.path, c.file, "path"); !s) return s.error();
      if (!paths.insert(bf.path).second) return c.err(bnode, "file \"" + bf.path + "\" is listed twice");
      std::string where = "built file \"" + bf.path + "\"";
      auto sha = get_string(c, bt, "sha256", where, true);
      if (!sha) return sha.error();
      bf.sha256 = *sha;
      if (!valid_sha(bf.sha256)) return c.err(*bt.get("sha256"), "sha256 of " + where + " must be 64 lowercase hex digits");
      auto srcs = get_strings(c, bt, "sources", where);
      if (!srcs) return srcs.error();
      bf.sources = *srcs;
      if (bf.sources.empty()) return c.err(bnode, where + " needs \"sources\": the [[files]] it is built from");
      for (const auto& src : bf.sources)
        if (!m.find_file(src) || !cxxscope::is_cxx_path(src))
          return c.err(*bt.get("sources"), where + ": source \"" + src + "\" is not a C/C++ [[files]] path of this overlay");
      auto build = get_strings(c, bt, "build", where);
      if (!build) return build.error();
      bf.build = *build;
      if (bf.build.empty() || bf.build[0].empty()) return c.err(bnode, where + " needs a \"build\" command (argv)");
      m.built_files.push_back(std::move(bf));
    }
  }
  if (m.files.empty() && m.new_files.empty()) return c.err("manifest has neither [[files]] nor [[new_files]]");
  return m;
}

namespace {

Result<std::string> read_small_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && st.st_size > static_cast<off_t>(kMaxManifestBytes))
    return make_error(ErrorKind::Usage, path,
                      "manifest is " + std::to_string(st.st_size) + " bytes; at most " +
                          std::to_string(kMaxManifestBytes) + " are read");
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorKind::Io, path, "cannot read: " + errno_text(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Result<ManifestSet> load_manifests(const std::string& dir, const std::string& fragments_root) {
  ManifestSet set;
  set.dir = dir;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return make_error(ErrorKind::Usage, dir, "manifests folder cannot be opened: " + errno_text(errno));
  std::vector<std::string> names;
  while (dirent* ent = ::readdir(d)) {
    std::string n = ent->d_name;
    if (n.size() > 5 && n.substr(n.size() - 5) == ".toml") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  if (names.empty()) return make_error(ErrorKind::Usage, dir, "no *.toml manifests in this folder");
  std::vector<Manifest> loaded;
  for (const auto& n : names) {
    std::string path = dir + "/" + n;
    auto text = read_small_file(path);
    if (!text) return text.error();
    std::string stem = n.substr(0, n.size() - 5);
    auto m = parse_manifest(*text, path, fragments_root + "/" + stem);
    if (!m) return m.error();
    if (m->overlay != stem)
      return make_error(ErrorKind::Usage, path,
                        "overlay = \"" + m->overlay + "\" does not match the file name \"" + n + "\"");
    loaded.push_back(std::move(*m));
  }
  std::map<std::string, const Manifest*> by_name;
  for (const auto& m : loaded) by_name[m.overlay] = &m;
  for (const auto& m : loaded) {
    if (m.engine != loaded[0].engine || m.engine_version != loaded[0].engine_version)
      return make_error(ErrorKind::Usage, m.file,
                        "engine " + m.engine + " " + m.engine_version + " differs from " + loaded[0].file + " (" +
                            loaded[0].engine + " " + loaded[0].engine_version + ")");
    for (const auto& a : m.after)
      if (!by_name.count(a))
        return make_error(ErrorKind::Usage, m.file, "\"after\" names unknown overlay \"" + a + "\"");
  }
  // Same target in two overlays: the pins must agree; a new file may not be
  // another overlay's target or new file.
  std::map<std::string, std::pair<std::string, const Manifest*>> pins;
  std::map<std::string, const Manifest*> news;
  for (const auto& m : loaded) {
    for (const auto& f : m.files) {
      auto it = pins.find(f.path);
      if (it != pins.end() && it->second.first != f.sha256)
        return make_error(ErrorKind::Usage, m.file,
                          "sha256 pin of \"" + f.path + "\" differs from the one in " + it->second.second->file);
      pins.emplace(f.path, std::pair{f.sha256, &m});
    }
    for (const auto& nf : m.new_files) {
      if (news.count(nf.path))
        return make_error(ErrorKind::Usage, m.file,
                          "new file \"" + nf.path + "\" is also a new file of " + news[nf.path]->file);
      news[nf.path] = &m;
    }
  }
  for (const auto& [p, m] : news)
    if (pins.count(p))
      return make_error(ErrorKind::Usage, m->file,
                        "new file \"" + p + "\" is an edited target of " + pins[p].second->file);
  // Stacking order.
  std::vector<std::string> order;
  std::string order_path = dir + "/ORDER";
  struct stat st {};
  if (::stat(order_path.c_str(), &st) == 0) {
    auto text = read_small_file(order_path);
    if (!text) return text.error();
    std::set<std::string> seen;
    for (const auto& raw : split_lines(*text).lines) {
      std::string_view l = trim(raw);
      if (l.empty() || l[0] == '#') continue;
      std::string name(l);
      if (!by_name.count(name))
        return make_error(ErrorKind::Usage, order_path, "names overlay \"" + name + "\" that has no manifest");
      if (!seen.insert(name).second)
        return make_error(ErrorKind::Usage, order_path, "lists overlay \"" + name + "\" twice");
      for (const auto& a : by_name[name]->after)
        if (!seen.count(a))
          return make_error(ErrorKind::Usage, order_path,
                            "puts \"" + name + "\" before \"" + a + "\", but " + name + " has after = [\"" + a + "\"]");
      order.push_back(name);
    }
    for (const auto& [name, m] : by_name)
      if (!seen.count(name))
        return make_error(ErrorKind::Usage, order_path, "does not list overlay \"" + name + "\"");
  } else {
    std::set<std::string> done;
    while (order.size() < loaded.size()) {
      bool progressed = false;
      for (const auto& [name, m] : by_name) {  // map: ties broken by name
        if (done.count(name)) continue;
        bool ready = std::all_of(m->after.begin(), m->after.end(), [&](auto& a) { return done.count(a) > 0; });
        if (!ready) continue;
        order.push_back(name);
        done.insert(name);
        progressed = true;
        break;
      }
      if (!progressed) {
        for (const auto& [name, m] : by_name)
          if (!done.count(name))
            return make_error(ErrorKind::Usage, m->file, "\"after\" forms a cycle through \"" + name + "\"");
      }
    }
  }
  for (const auto& name : order)
    for (auto& m : loaded)
      if (m.overlay == name) set.overlays.push_back(std::move(m));
  return set;
}

}  // namespace patcher
