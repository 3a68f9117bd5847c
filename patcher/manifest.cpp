// One overlay manifest: TOML in, a validated Manifest out. Every key is
// checked here, so a manifest error always comes from one place with one
// message style. A folder of manifests and their order: manifest_set.cpp.
#include "manifest.h"

#include <algorithm>
#include <set>
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
  auto it = std::ranges::find(files, path, &FileSpec::path);
  return it == files.end() ? nullptr : &*it;
}

const BuiltFile* Manifest::find_built(const std::string& path) const {
  auto it = std::ranges::find(built_files, path, &BuiltFile::path);
  return it == built_files.end() ? nullptr : &*it;
}

const Edit* Manifest::find_edit(const std::string& id) const {
  for (const auto& f : files)
    for (const auto& e : f.edits)
      if (e.id == id) return &e;
  return nullptr;
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

// Checks text the engine injects or matches: UTF-8, LF, no NUL byte, no sentinel lines.
Status check_text(const std::string& text, const std::string& display, const char* what) {
  // Valid UTF-8, but no Python or C source may hold it: injected, it breaks the file.
  if (size_t nul = text.find('\0'); nul != std::string::npos)
    return make_error(ErrorKind::Usage, display,
                      std::string(what) + " contains a NUL byte (line " + std::to_string(line_of_offset(text, nul)) +
                          "); no source file may hold one");
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

// The tables of a top-level array of tables ([[files]], ...); none when absent.
Result<std::vector<const toml::table*>> tables(const Ctx& c, const toml::table& root, const char* key,
                                               const std::string& not_tables) {
  std::vector<const toml::table*> out;
  const toml::node* n = root.get(key);
  if (!n) return out;
  const toml::array* arr = n->as_array();
  if (!arr || !arr->is_array_of_tables()) return c.err(*n, not_tables);
  for (const toml::node& x : *arr) out.push_back(x.as_table());
  return out;
}

// The "path" of a [[files]], [[new_files]] or [[built_files]] table: required,
// relative, and listed once across all three.
Result<std::string> table_path(const Ctx& c, const toml::table& t, const std::string& where,
                               std::set<std::string>& paths) {
  auto p = get_string(c, t, "path", where, true);
  if (!p) return p.error();
  if (auto s = validate_rel_path(*p, c.file, "path"); !s) return c.err(*t.get("path"), s.error().message);
  if (!paths.insert(*p).second) return c.err(t, "file \"" + *p + "\" is listed twice");
  return *p;
}

// One [[files]] table and its [[files.edits]]; edit ids are unique across the manifest.
Result<FileSpec> parse_file(const Ctx& c, const toml::table& ft, const std::string& fragments_dir,
                            std::set<std::string>& paths, std::set<std::string>& ids) {
  if (auto s = check_keys(c, ft, {"path", "sha256", "edits", "compile_flags", "compile_commands", "must_compile"},
                          "[[files]]");
      !s)
    return s.error();
  FileSpec f;
  auto p = table_path(c, ft, "[[files]]", paths);
  if (!p) return p.error();
  f.path = *p;
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
    if (auto s = validate_rel_path(f.compile_commands, c.file, "compile_commands"); !s)
      return c.err(*ft.get("compile_commands"), s.error().message);
  if (const toml::node* mc = ft.get("must_compile")) {
    if (!mc->is_boolean()) return c.err(*mc, "\"must_compile\" of \"" + f.path + "\" must be true or false");
    f.must_compile = *mc->value<bool>();
  }
  const toml::node* en = ft.get("edits");
  if (!en) return c.err(ft, "file \"" + f.path + "\" has no [[files.edits]]");
  const toml::array* earr = en->as_array();
  if (!earr || !earr->is_array_of_tables() || earr->empty())
    return c.err(*en, "\"edits\" of \"" + f.path + "\" must be a non-empty array of tables");
  for (const toml::node& enode : *earr) {
    auto e = parse_edit(c, *enode.as_table(), fragments_dir, cxx);
    if (!e) return e.error();
    if (!ids.insert(e->id).second) return c.err(enode, "duplicate edit id \"" + e->id + "\"");
    f.edits.push_back(std::move(*e));
  }
  return f;
}

// One [[built_files]] table; its sources must be C/C++ [[files]] of `m`.
Result<BuiltFile> parse_built_file(const Ctx& c, const toml::table& bt, const Manifest& m,
                                   std::set<std::string>& paths) {
  if (auto s = check_keys(c, bt, {"path", "sha256", "sources", "build"}, "[[built_files]]"); !s) return s.error();
  BuiltFile bf;
  auto p = table_path(c, bt, "[[built_files]]", paths);
  if (!p) return p.error();
  bf.path = *p;
  std::string where = "built file \"" + bf.path + "\"";
  auto sha = get_string(c, bt, "sha256", where, true);
  if (!sha) return sha.error();
  bf.sha256 = *sha;
  if (!valid_sha(bf.sha256)) return c.err(*bt.get("sha256"), "sha256 of " + where + " must be 64 lowercase hex digits");
  auto srcs = get_strings(c, bt, "sources", where);
  if (!srcs) return srcs.error();
  bf.sources = *srcs;
  if (bf.sources.empty()) return c.err(bt, where + " needs \"sources\": the [[files]] it is built from");
  for (const auto& src : bf.sources)
    if (!m.find_file(src) || !cxxscope::is_cxx_path(src))
      return c.err(*bt.get("sources"), where + ": source \"" + src + "\" is not a C/C++ [[files]] path of this overlay");
  auto build = get_strings(c, bt, "build", where);
  if (!build) return build.error();
  bf.build = *build;
  if (bf.build.empty() || bf.build[0].empty()) return c.err(bt, where + " needs a \"build\" command (argv)");
  return bf;
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
  const toml::node& overlay_node = *root.get("overlay");
  m.overlay_line = static_cast<int>(overlay_node.source().begin.line);
  if (!valid_name(m.overlay))
    return c.err(overlay_node, "overlay name \"" + m.overlay + "\" must be 1-64 of [A-Za-z0-9._-]");
  if (!valid_name(m.engine) || !valid_name(m.engine_version))
    return c.err("engine and engine_version must be 1-64 of [A-Za-z0-9._-]");
  if (const toml::node* n = root.get("after")) {
    m.after_line = static_cast<int>(n->source().begin.line);
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
  auto files = tables(c, root, "files", "\"files\" must be an array of tables ([[files]])");
  if (!files) return files.error();
  for (const toml::table* ft : *files) {
    auto f = parse_file(c, *ft, fragments_dir, paths, ids);
    if (!f) return f.error();
    m.files.push_back(std::move(*f));
  }
  auto new_files = tables(c, root, "new_files", "\"new_files\" must be an array of tables");
  if (!new_files) return new_files.error();
  for (const toml::table* nt : *new_files) {
    if (auto st = check_keys(c, *nt, {"path", "source"}, "[[new_files]]"); !st) return st.error();
    NewFile nf;
    auto p = table_path(c, *nt, "[[new_files]]", paths);
    if (!p) return p.error();
    nf.path = *p;
    auto src = get_string(c, *nt, "source", "new file \"" + nf.path + "\"", true);
    if (!src) return src.error();
    nf.source = *src;
    auto text = load_fragment(fragments_dir, nf.source, c, "source");
    if (!text) return text.error();
    nf.text = *text;
    m.new_files.push_back(std::move(nf));
  }
  auto built_files = tables(c, root, "built_files", "\"built_files\" must be an array of tables");
  if (!built_files) return built_files.error();
  for (const toml::table* bt : *built_files) {
    auto bf = parse_built_file(c, *bt, m, paths);
    if (!bf) return bf.error();
    m.built_files.push_back(std::move(*bf));
  }
  if (m.files.empty() && m.new_files.empty()) return c.err("manifest has neither [[files]] nor [[new_files]]");
  return m;
}


}  // namespace patcher
