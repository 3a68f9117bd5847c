// CLI output: human text and --json documents for reports and errors.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine.h"

namespace patcher {

nlohmann::json state_json(const TreeState& ts);
nlohmann::json report_json(const std::string& command, const OverlayReport& o);
nlohmann::json error_json(const Error& e);
nlohmann::json drift_json(const DriftItem& d);
// `s` with control characters (newline, tab, ...) and backslashes escaped, so
// that a hostile file name cannot break a one-line message.
std::string escape_controls(const std::string& s);
nlohmann::json recover_json(const RecoverReport& r);
std::string recover_text(const RecoverReport& r);

std::string state_text(const TreeState& ts);
std::string report_text(const std::string& command, const OverlayReport& o, bool with_diff = false);

}  // namespace patcher
