// --check-injected: every patched file and every fragment compiled before
// the first byte is written (Python with one interpreter, C/C++ syntax-only
// with Clang), each error placed in the overlay region it falls in.
#include <cstdint>
#include <string>
#include <vector>

#include "cxx_backend.h"
#include "engine_steps.h"
#include "fmt/format.h"
#include "region.h"
#include "text.h"

namespace patcher::engine_steps {

namespace {

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

}  // namespace

Status compile_all(const Session& s, const Request& r, const std::vector<std::string>& selected,
                   const std::vector<std::pair<std::string, std::string>>& files, int* count,
                   std::vector<std::string>* notes) {
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

}  // namespace patcher::engine_steps
