// CLI output: human text and --json documents for outcomes and errors.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine.h"

namespace patcher {

nlohmann::json state_json(const TreeState& ts);
nlohmann::json outcome_json(const std::string& command, const Outcome& o);
nlohmann::json error_json(const Error& e);
nlohmann::json drift_json(const DriftItem& d);
// `s` with control characters (newline, tab, ...) and backslashes escaped, so
// that a hostile file name cannot break a one-line message.
std::string escape_controls(const std::string& s);
nlohmann::json recover_json(const RecoverOutcome& r);
std::string recover_text(const RecoverOutcome& r);

std::string state_text(const TreeState& ts);
std::string outcome_text(const std::string& command, const Outcome& o, bool with_diff = false);

}  // namespace patcher
