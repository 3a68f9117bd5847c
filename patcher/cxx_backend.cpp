#include "cxx_backend.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "built.h"
#include "check.h"
#include "flags.h"
#include "fmt/format.h"
#include "region.h"
#include "report.h"
#include "resolve.h"
#include "run.h"
#include "sha256.h"
#include "text.h"

namespace patcher::cxx {
namespace {

struct Context {
  std::string tool, root = ".", python = "python3";
  std::map<std::string, cxxscope::FileReport> cache;  // key: path + flags + text hash
  std::mutex mu;
};

Context& ctx() {
  static Context c;
  return c;
}

// Until configure() names one, the tool is found beside this executable.
const std::string& the_tool() {
  Context& c = ctx();
  std::lock_guard<std::mutex> g(c.mu);
  if (c.tool.empty()) {
    char buf[4096];
    ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    c.tool = cxxscope::find_tool(n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string());
  }
  return c.tool;
}

std::string join_flags(const std::vector<std::string>& f) {
  std::string out;
  for (const auto& a : f) out += a + '\x1f';
  return out;
}

// One parse of `text` as `path`, cached: apply resolves every edit of every
// overlay against the same text, and a parse costs a Clang run.
Result<cxxscope::FileReport> parse(const std::string& path, const std::string& text, const FileSpec& spec) {
  auto flags = flags_for(spec);
  if (!flags) return flags.error();
  Context& c = ctx();
  std::string key = path + '\x1e' + join_flags(*flags) + kvtier::sha256_hex(text);
  {
    std::lock_guard<std::mutex> g(c.mu);
    if (auto it = c.cache.find(key); it != c.cache.end()) return it->second;
  }
  cxxscope::Request req{c.root, path, *flags, {{path, text}}};
  auto reps = cxxscope::run_tool(the_tool(), {req});
  if (!reps) return make_error(ErrorKind::Usage, path, "cannot resolve C/C++ scopes: " + reps.error());
  cxxscope::FileReport rep = std::move(reps->front());
  if (!rep.ok) return make_error(ErrorKind::Drift, path, "Clang could not parse the file: " + rep.error);
  std::lock_guard<std::mutex> g(c.mu);
  c.cache[key] = rep;
  return rep;
}

}  // namespace

bool is_cxx(std::string_view path) { return cxxscope::is_cxx_path(path); }

namespace {

// The tool reads files from its own working directory: a relative root
// (`--root src`) named nothing there, and every C/C++ anchor looked drifted.
std::string absolute_root(const std::string& root) {
  std::error_code ec;
  auto p = std::filesystem::absolute(root, ec);
  if (ec) return root;
  std::string out = p.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

}  // namespace

void configure(const std::string& tool, const std::string& root) {
  std::lock_guard<std::mutex> g(ctx().mu);
  ctx().tool = tool;
  ctx().root = absolute_root(root);
}

void configure_root(const std::string& root) {
  std::lock_guard<std::mutex> g(ctx().mu);
  ctx().root = absolute_root(root);
}

void configure_python(const std::string& python) {
  std::lock_guard<std::mutex> g(ctx().mu);
  ctx().python = python;
}

const std::string& tool() { return the_tool(); }

// {python_include} in a flag is the include folder of --python's interpreter.
Result<std::vector<std::string>> expand(std::vector<std::string> flags) {
  const std::string key = "{python_include}";
  for (auto& f : flags)
    for (size_t p = f.find(key); p != std::string::npos; p = f.find(key, p)) {
      auto inc = built::python_include(ctx().python);
      if (!inc) return inc.error();
      f.replace(p, key.size(), *inc);
      p += inc->size();
    }
  return flags;
}

Result<std::vector<std::string>> flags_for(const FileSpec& spec) {
  if (spec.compile_commands.empty()) return expand(spec.compile_flags);
  std::string db = ctx().root + "/" + spec.compile_commands;
  std::ifstream in(db, std::ios::binary);
  if (!in) return make_error(ErrorKind::Usage, db, "cannot read the compile_commands.json named by " + spec.path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto f = cxxscope::flags_from_compile_commands(ss.str(), ctx().root + "/" + spec.path);
  if (!f) return make_error(ErrorKind::Usage, db, f.error());
  std::vector<std::string> out = spec.compile_flags;  // manifest flags add to the entry's
  out.insert(out.end(), f->begin(), f->end());
  return expand(out);
}

Result<ScopeMatch> find_scope(const std::vector<std::string>& lines, const std::string& scope, const FileSpec& spec) {
  auto rep = parse(spec.path, join_lines(lines, true), spec);
  if (!rep) return rep.error();
  cxxscope::ScopeResolution r = cxxscope::resolve_scope(rep->definitions, scope, lines.size());
  ScopeMatch m;
  m.ok = r.ok;
  m.range = LineRange{r.begin, r.end};
  m.segment = r.segment;
  m.found = r.found;
  m.headers = r.headers;
  m.searched = LineRange{0, lines.size()};
  m.refusal = r.refusal;
  return m;
}

Result<std::string> anchor_refusal(const std::vector<std::string>& lines, size_t first, size_t count,
                                   const FileSpec& spec) {
  auto rep = parse(spec.path, join_lines(lines, true), spec);
  if (!rep) return rep.error();
  return cxxscope::anchor_refusal(*rep, first, count);
}

Status check(const std::vector<CheckUnit>& units, std::vector<std::string>* notes,
             std::vector<CheckTiming>* timings) {
  if (units.empty()) return ok_status();
  Context& c = ctx();
  std::vector<cxxscope::Request> reqs;
  for (const auto& u : units) {
    auto flags = flags_for(*u.spec);
    if (!flags) return flags.error();
    cxxscope::Request r{c.root, u.path, *flags, {{u.path, u.text}}};
    for (const auto& [p, t] : u.new_files) r.files[p] = t;
    reqs.push_back(std::move(r));
  }
  auto reps = cxxscope::run_tool(the_tool(), reqs);
  if (!reps) return make_error(ErrorKind::Usage, "", "cannot run the C/C++ compile check: " + reps.error());
  Error err = make_error(ErrorKind::Compile, "", "");
  for (size_t i = 0; i < units.size(); ++i) {
    const CheckUnit& u = units[i];
    const cxxscope::FileReport& rep = (*reps)[i];
    if (timings) timings->push_back(CheckTiming{u.path, rep.seconds});
    if (!rep.ok) return make_error(ErrorKind::Compile, u.path, "Clang could not parse the file: " + rep.error);
    std::vector<cxxscope::InjectedRegion> regions;
    auto parsed = parse_regions(split_lines(u.text).lines, u.path);
    if (!parsed) return parsed.error();
    std::vector<std::string> lines = split_lines(u.text).lines;
    for (const auto& r : *parsed) {
      cxxscope::InjectedRegion ir{r.overlay + "/" + r.edit, r.begin + 1, r.end + 1, {}};
      for (size_t i = r.begin + 1; i < r.end; ++i) {
        std::string_view t = trim(lines[i]);
        if (!t.empty() && t[0] != '#' && t.substr(0, 2) != "//") ir.code_lines.push_back(i + 1);
      }
      regions.push_back(std::move(ir));
    }
    std::string abs = c.root + "/" + u.path;
    std::set<std::string> new_abs;
    for (const auto& [p, t] : u.new_files) new_abs.insert(c.root + "/" + p);
    cxxscope::Verdict v = cxxscope::judge(rep, abs, regions, new_abs, u.spec->must_compile);
    auto rel = [&](const std::string& f) {
      return f.rfind(c.root + "/", 0) == 0 ? f.substr(c.root.size() + 1) : f;
    };
    for (const auto& f : v.in_regions) {
      std::string where = f.region == "new file" ? " (in a new file)" : " (in region " + f.region + ")";
      err.details.push_back(fmt::format("{}:{}: {}{}", rel(f.file), f.line, f.message, where));
    }
    for (const auto& f : v.dropped)
      err.details.push_back(fmt::format("{}:{}: region {}: {}", rel(f.file), f.line, f.region, f.message));
    for (const auto& f : v.outside) {
      std::string line = fmt::format("{}:{}: {} (outside any overlay region)", rel(f.file), f.line, f.message);
      if (u.spec->must_compile) err.details.push_back(line);
    }
    if (notes && !v.outside.empty() && !u.spec->must_compile)
      notes->push_back(fmt::format("{}: {} error(s) outside the overlay regions ignored ({} header(s) not found "
                                   "here); set must_compile = true to count them",
                                   u.path, v.outside.size(), rep.missing_headers.size()));
    if (v.failed && err.message.empty()) {
      err.file = u.path;
      err.message = !v.in_regions.empty() ? "compile error in injected C/C++ code"
                    : !v.dropped.empty()  ? "injected C/C++ code is dropped by the preprocessor"
                                          : "the file must compile cleanly (must_compile) and does not";
    }
  }
  if (!err.message.empty()) return err;
  return ok_status();
}

}  // namespace patcher::cxx
