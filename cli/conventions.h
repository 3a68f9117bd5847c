// The command-line conventions `overlay` and `kvstore` share (issue 19):
// one exit-code table, --version with the build id of the artifact list,
// "did you mean" for a mistyped subcommand or option, an unknown option
// reported before a missing required one, and one JSON error object.
// CLI layer only: the libraries never print or exit.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "exit_codes.h"

namespace kvtier::cli {

// Every --json document carries it; docs/JSON.md describes each version.
constexpr int kSchemaVersion = 1;

// `TOOL VERSION` then one `<engine>-<version> build kvtier-<16 hex>` line per
// anchors folder: the ids docker/lib.sh's build_id computes from the same
// artifacts (the baked ARTIFACTS.sha256 hashes to the same id).
std::string version_text(std::string_view tool);

// The exit-code table for --help footers (the README's, word for word).
const char* exit_code_help();

// Reads argv the way `app` will, before CLI11 does, and returns the first
// problem CLI11 would report later or worse: an unknown subcommand or
// option, with the nearest known name. Empty when there is none.
std::string precheck(const CLI::App& app, int argc, const char* const* argv);

// True when --json is among the arguments (before any "--").
bool wants_json(int argc, const char* const* argv);

// {"schema_version", "tool", "command", "ok": false, "error": {"exit_code",
// "kind", "message"}}: what a --json run prints on stdout when it fails.
nlohmann::json error_json(std::string_view tool, std::string_view command, int code, std::string_view message);

// The name of an exit code as the JSON "kind" field spells it.
const char* exit_code_name(int code);

}  // namespace kvtier::cli
