// Fuzzes the overlay manifest parser (patcher/manifest.h): TOML text in,
// validated Manifest or a one-line error out.
//
// Fragments are read from disk, so LLVMFuzzerInitialize makes a private
// fragment folder holding "a.py" and "b.py" (the seed corpus names these),
// an indented fragment, an empty one, a sub-folder and a symlink that leaves
// the folder; the parser must accept or refuse each without escaping it.
//
// Properties of an accepted manifest (what later stages rely on):
//  - names and edit ids are unique and every path is relative without "..";
//  - every scope segment is "class X", "def f" or "async def f";
//  - every sentinel the engine would write for it parses back to the same
//    overlay and edit (so the engine can always find its own regions again).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <string_view>

#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_check.h"
#include "manifest.h"
#include "region.h"

namespace {

std::string g_fragments;

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

bool safe_rel(const std::string& p) {
  if (p.empty() || p[0] == '/') return false;
  size_t start = 0;
  while (true) {
    size_t slash = p.find('/', start);
    std::string_view part(p.data() + start, (slash == std::string::npos ? p.size() : slash) - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

// Every "/"-separated segment names a class or function ("class X", "def f",
// "async def f"): find_scope matches segments as line prefixes, so an empty
// or keyword-less segment would match unrelated lines.
bool valid_scope(const std::string& scope) {
  size_t start = 0;
  while (true) {
    size_t slash = scope.find('/', start);
    std::string seg = scope.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    bool keyword = false;
    for (std::string_view k : {"class ", "def ", "async def "})
      keyword |= seg.size() > k.size() && seg.compare(0, k.size(), k) == 0;
    if (!keyword) return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

void check_sentinels(const patcher::Manifest& m, const std::string& path, const std::string& edit) {
  const std::string prefix = patcher::comment_prefix(path);
  const std::string hash = patcher::text_hash(edit);
  auto b = patcher::parse_sentinel(patcher::begin_sentinel(prefix, "    ", m.overlay, edit, hash));
  FUZZ_CHECK(b.kind == patcher::SentinelKind::Begin && b.overlay == m.overlay && b.edit == edit &&
             b.hash == hash);
  auto e = patcher::parse_sentinel(patcher::end_sentinel(prefix, "", m.overlay, edit));
  FUZZ_CHECK(e.kind == patcher::SentinelKind::End && e.overlay == m.overlay && e.edit == edit);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char tmpl[] = "/tmp/kvtier-fuzz-fragments-XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (!dir) std::abort();
  g_fragments = dir;
  write(g_fragments + "/a.py", "x = 1\nif x:\n    y = 2\n");
  write(g_fragments + "/b.py", "\"\"\"A new module.\"\"\"\n\nVALUE = 3\n");
  write(g_fragments + "/indented.py", "    x = 1\n");
  write(g_fragments + "/empty.py", "");
  mkdir((g_fragments + "/sub").c_str(), 0755);
  write(g_fragments + "/sub/c.py", "z = 3\n");
  write(g_fragments + "/../kvtier-fuzz-outside.py", "outside = 1\n");
  symlink("../kvtier-fuzz-outside.py", (g_fragments + "/link.py").c_str());
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(g_fragments, ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto m = patcher::parse_manifest(text, "fuzz.toml", g_fragments);
  if (!m) {
    FUZZ_CHECK(!m.error().message.empty());
    FUZZ_CHECK(m.error().kind == patcher::ErrorKind::Usage || m.error().kind == patcher::ErrorKind::Io);
    return 0;
  }
  FUZZ_CHECK(!m->overlay.empty() && !m->engine.empty() && !m->engine_version.empty());
  FUZZ_CHECK(!m->files.empty() || !m->new_files.empty());
  std::set<std::string> ids, paths;
  for (const auto& f : m->files) {
    FUZZ_CHECK(safe_rel(f.path));
    FUZZ_CHECK(paths.insert(f.path).second);
    FUZZ_CHECK(!f.edits.empty());
    for (const auto& e : f.edits) {
      FUZZ_CHECK(ids.insert(e.id).second);
      FUZZ_CHECK(!e.anchor_lines.empty());
      FUZZ_CHECK(e.occurrences >= 1);
      FUZZ_CHECK(e.scope.empty() || valid_scope(e.scope));
      FUZZ_CHECK(safe_rel(e.fragment));
      for (const auto& l : e.anchor_lines) FUZZ_CHECK(!patcher::looks_like_sentinel(l));
      for (const auto& l : e.fragment_lines) FUZZ_CHECK(!patcher::looks_like_sentinel(l));
      check_sentinels(*m, f.path, e.id);
    }
  }
  for (const auto& nf : m->new_files) {
    FUZZ_CHECK(safe_rel(nf.path) && safe_rel(nf.source));
    FUZZ_CHECK(paths.insert(nf.path).second);
    const std::string hash = patcher::text_hash(nf.text);
    auto h = patcher::parse_sentinel(
        patcher::new_file_header(patcher::comment_prefix(nf.path), m->overlay, hash));
    FUZZ_CHECK(h.kind == patcher::SentinelKind::NewFile && h.overlay == m->overlay && h.hash == hash);
  }
  return 0;
}
