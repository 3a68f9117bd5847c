// Built files: a binary of the installed engine that an overlay's C/C++
// sources are compiled into (vLLM's vllm/fs_io_C.abi3.so comes from
// csrc/fs_io.cpp). A wheel install has the binary but not the sources, so the
// engine patches a pinned copy of the sources (--sources DIR), rebuilds the
// binary with the manifest's build command, and replaces it in the same
// transaction as everything else, keeping the original bytes beside it:
//
//   vllm/.fs_io_C.abi3.so.overlay-orig    the original binary (its sha256 is the pin)
//   vllm/.fs_io_C.abi3.so.overlay-built   a record: overlay, original and built sha256
//
// A binary that differs from its pin is never replaced (drift), and revert
// puts the original bytes back.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "error.h"
#include "manifest.h"
#include "paths.h"
#include "state.h"
#include "txn.h"

namespace patcher::built {

std::string backup_path(const std::string& path);
std::string record_path(const std::string& path);

struct Record {
  std::string overlay, original, built;
};
std::string format_record(const Record& r);
std::optional<Record> parse_record(std::string_view text);

// True when `m` must rebuild its built files here: it has some, and none of
// their sources is in the tree (a wheel install, not a source checkout).
Result<bool> wheel_mode(const Tree& tree, const Manifest& m);

// The state of one built file: pristine | applied | drift | missing | tampered,
// with a FileOverlay entry for the per-overlay summary.
Status analyze(const Tree& tree, const Manifest& m, const BuiltFile& bf, FileState& fs);

// The C include folder of `python` (sysconfig's "include"): {python_include}
// in build commands and compile_flags. Asked once per interpreter.
Result<std::string> python_include(const std::string& python);

// Runs the build command in a scratch folder holding `inputs` (relative path ->
// text). {python_include} comes from `python`. Returns the built bytes; a
// failing build is a Compile error carrying the compiler's last lines.
Result<std::string> build(const BuiltFile& bf, const std::map<std::string, std::string>& inputs,
                          const std::string& python, double* seconds);

// The three changes of an apply (backup, new binary, record) and of a revert.
std::vector<Change> apply_changes(const BuiltFile& bf, const std::string& overlay, const FileData& original,
                                  const std::string& new_bytes);
Result<std::vector<Change>> revert_changes(const Tree& tree, const BuiltFile& bf, const FileState& fs);

}  // namespace patcher::built
