// Overlay manifests: anchors/<engine>-<version>/<overlay>.toml, parsed and
// validated completely (fragments loaded too) before anything looks at a tree.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "api_pins.h"
#include "error.h"

namespace patcher {

// Input limits, so that any input is answered quickly (exit 2 beyond them).
inline constexpr size_t kMaxManifestBytes = 4 << 20;
inline constexpr size_t kMaxAnchorBytes = 64 << 10;
inline constexpr size_t kMaxFragmentBytes = 4 << 20;

enum class Action { InsertBefore, InsertAfter, Replace };
const char* action_name(Action a);

struct Edit {
  std::string id;
  std::string scope;                      // "" = whole file; "class X/def f" nests
  std::vector<std::string> anchor_lines;  // exact lines, indentation included
  int occurrences = 1;                    // the edit applies at every occurrence
  Action action = Action::InsertAfter;
  int indent = 0;                         // extra spaces on top of the anchor's indentation
  std::string fragment;                   // path under the overlay's fragment folder
  std::vector<std::string> fragment_lines;  // loaded fragment, column 0
  std::optional<std::string> superseded_by;
  std::string why;
  bool compile_standalone = true;  // optional: false skips the standalone fragment compile
};

struct FileSpec {
  std::string path;
  std::string sha256;
  std::vector<Edit> edits;
  // C/C++ targets only (docs/OVERLAYS.md, "C and C++ targets"): flags for the
  // Clang parse that resolves scopes and checks injected code, or a
  // compile_commands.json (relative to the tree) holding the file's entry.
  std::vector<std::string> compile_flags;
  std::string compile_commands;
  bool must_compile = false;  // --check-injected: errors outside regions count too
};

// A binary of the engine built from C/C++ [[files]] of the same overlay: on a
// wheel install (no sources in the tree) the engine rebuilds and replaces it.
struct BuiltFile {
  std::string path;
  std::string sha256;                // the original binary (pin)
  std::vector<std::string> sources;  // [[files]] paths compiled into it
  std::vector<std::string> build;    // argv; {sources} {output} {python_include}
};

struct NewFile {
  std::string path;
  std::string source;  // path under the overlay's fragment folder
  std::string text;    // loaded source
};

struct Manifest {
  std::string file;           // manifest path, for messages
  std::string fragments_dir;  // overlays/<overlay>/
  int format = 1;
  std::string overlay, engine, engine_version, summary;
  std::vector<std::string> after;
  // TOML lines of `overlay =` and `after =`, for the set's checks (0: absent).
  int overlay_line = 0, after_line = 0;
  std::vector<FileSpec> files;
  std::vector<NewFile> new_files;
  std::vector<BuiltFile> built_files;
  ApiPins api;  // <manifests>/api/<overlay>.toml, when there is one (api_check.h)

  const FileSpec* find_file(const std::string& path) const;
  const BuiltFile* find_built(const std::string& path) const;
  const Edit* find_edit(const std::string& id) const;
};

// Overlays of one engine version, in stacking (apply) order.
struct ManifestSet {
  std::string dir;
  std::vector<Manifest> overlays;
  // The overlay called `name`, or nullptr.
  const Manifest* find(const std::string& name) const;
  // The overlay called `name`; the name must be known (a name from this set,
  // or one select_overlays validated). An unknown name is a programming error.
  const Manifest& get(const std::string& name) const;
};

// Parses one manifest text; fragments are read from fragments_dir.
Result<Manifest> parse_manifest(const std::string& toml_text, const std::string& display_path,
                                const std::string& fragments_dir);

// Loads every *.toml in dir. Fragments come from <fragments_root>/<overlay>/.
// The order follows dir/ORDER when present (checked against `after`),
// otherwise a topological sort of `after` with ties broken by name.
Result<ManifestSet> load_manifests(const std::string& dir, const std::string& fragments_root);

}  // namespace patcher
