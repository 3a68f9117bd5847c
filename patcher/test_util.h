// Helpers for the engine's tests: a scratch copy of the example engine tree
// and its manifests, running the `overlay` binary as a subprocess, and
// snapshots (bytes + mtime + mode of every entry) to prove "nothing written".
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace patcher::testing {

struct RunResult {
  int code = -1;
  std::string out, err;
};

struct Entry {
  std::string bytes;  // file contents or link target; "" for directories
  long long mtime_ns = 0;
  unsigned mode = 0;
  bool operator==(const Entry&) const = default;
};
using Snapshot = std::map<std::string, Entry>;

Snapshot snapshot(const std::string& dir);
// "" when equal, else the first difference. dir_mtimes=false ignores directory
// mtimes (a failed write that created and removed a temp file moves them).
std::string diff_snapshots(const Snapshot& a, const Snapshot& b, bool dir_mtimes = true);
// Same file names and bytes (mtimes ignored).
std::string diff_bytes(const Snapshot& a, const Snapshot& b);

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& text);
std::string sha256_file(const std::string& path);

// A scratch workspace: <dir>/tree (copy of fixtures/example), <dir>/anchors/example-1.0,
// <dir>/overlays/<overlay>/ (copies of the example overlays).
struct Workspace {
  Workspace();
  ~Workspace();
  std::string dir, tree, manifests, overlays;
  // Runs build/patcher/overlay with --root and --manifests filled in.
  RunResult run(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {}) const;
  std::string tree_file(const std::string& rel) const { return tree + "/" + rel; }
};

// One step of a write the fault hook can stop at: the nth time `name` is reached.
struct FaultStep {
  std::string name;
  int nth;
  std::string spec() const { return name + ":" + std::to_string(nth); }
};
// Every step `overlay <args>` passes through on `w` (a dry run with OVERLAY_FAULT=list).
std::vector<FaultStep> fault_steps(const Workspace& w, const std::vector<std::string>& args);

RunResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);

// The tree state of `status --json` output, whether it is the document
// itself or sits under "state" in the shared JSON envelope (docs/JSON.md).
inline nlohmann::json status_state(const std::string& out) {
  auto j = nlohmann::json::parse(out);
  return j.contains("state") && j["state"].is_object() ? j["state"] : j;
}

std::string overlay_bin();
std::string source_dir();

}  // namespace patcher::testing
