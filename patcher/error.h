// Typed errors of the overlay engine. The library never prints and never
// throws: it returns Result<T> / Status (kvtier::Result from common/result.h
// with this Error); the CLI maps ErrorKind to an exit code.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "result.h"

namespace patcher {

// Values are the CLI exit codes (docs/OVERLAYS.md lists them).
enum class ErrorKind {
  NotExpected = 1,  // consistent tree, but not in the state `check` expected
  Usage = 2,        // usage, manifest or bad-input error
  Drift = 3,        // tree does not match the pins / anchors
  Tampered = 4,     // tampered or half-applied
  Compile = 5,      // --check-injected found a syntax error
  Io = 6,           // the OS refused a read or write
  Busy = 7,         // another apply/revert/recover holds the tree (a transaction is in progress)
};

const char* kind_name(ErrorKind k);

// One edit (or file) that does not fit the tree: the structured form of a
// drift report, for --json and for callers that act on it.
struct DriftItem {
  struct Near {
    size_t line = 0;  // 1-based; 0: text an earlier overlay injects, not on disk
    double score = 0;
    std::string text;
    std::string injected_by;  // line 0: the region's "overlay/edit"
    size_t region_line = 0;   // line 0: 1-based line in that region (its begin sentinel is 1)
  };
  std::string file, overlay, edit, manifest;
  std::string kind;  // anchor | scope | scope-refused | pin | api
  std::string scope;
  int expected = 0, found = 0;
  std::vector<size_t> found_at;  // 1-based lines (0: inside an earlier overlay's injected text)
  std::vector<Near> nearest;     // best first
  std::vector<std::string> diff;  // unified diff from the anchor (or the pinned file) to the tree
  std::string superseded_by;      // the edit's superseded_by text, when that text is gone upstream
  std::vector<std::string> elsewhere;  // "line N (in class X/def f)": the anchor outside its scope
  std::string pin_line;           // kind pin: the manifest line to update
  // kind api (api_check.h): the engine name, what is wrong with it, what the
  // tree has now, and the overlay sources that use it.
  std::string symbol, problem, now;
  std::vector<std::string> used_by;
};

struct Error {
  ErrorKind kind = ErrorKind::Usage;
  std::string file;     // the file the problem is in ("" when none)
  std::string message;  // the problem, one line, without the file name
  std::vector<std::string> details;  // extra lines (drift report, diff, ...)
  std::vector<DriftItem> drift;      // drift errors: the same report, structured

  // "<file>: <message>" — the one-line form every error is printed as.
  std::string line() const { return file.empty() ? message : file + ": " + message; }
};

inline Error make_error(ErrorKind k, std::string file, std::string msg) {
  return Error{k, std::move(file), std::move(msg), {}, {}};
}

template <class T>
using Result = kvtier::Result<T, Error>;
using Status = kvtier::Result<void, Error>;
inline Status ok_status() { return {}; }

}  // namespace patcher
