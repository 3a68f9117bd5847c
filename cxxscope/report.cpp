#include "report.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace cxxscope {
namespace {

using nlohmann::json;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Lines must be positive and fit a file; a span must not run backwards.
bool line_ok(const json& v) { return v.is_number_unsigned() && v.get<uint64_t>() >= 1 && v.get<uint64_t>() < (1u << 30); }

Result<std::vector<LineSpan>> spans(const json& arr, const char* what) {
  std::vector<LineSpan> out;
  if (!arr.is_array()) return std::string(what) + " is not an array";
  for (const auto& s : arr) {
    if (!s.is_array() || s.size() != 2 || !line_ok(s[0]) || !line_ok(s[1]) || s[0].get<size_t>() > s[1].get<size_t>())
      return std::string(what) + " holds a span that is not [first, last] lines";
    out.emplace_back(s[0].get<size_t>(), s[1].get<size_t>());
  }
  return out;
}

Result<FileReport> one(const json& r) {
  FileReport f;
  if (!r.is_object()) return std::string("a result is not an object");
  f.file = r.value("file", "");
  f.ok = r.value("ok", false);
  f.error = r.value("error", "");
  if (!f.ok) return f;
  static const std::vector<std::string> kinds = {"namespace", "class", "struct", "union", "function", "method"};
  const json& defs = r.at("definitions");
  if (!defs.is_array()) return std::string("definitions is not an array");
  for (const auto& d : defs) {
    if (!d.is_object()) return std::string("a definition is not an object");
    Definition x;
    x.kind = d.at("kind").get<std::string>();
    if (std::find(kinds.begin(), kinds.end(), x.kind) == kinds.end()) return "unknown definition kind \"" + x.kind + "\"";
    x.name = d.at("name").get<std::string>();
    x.qualified = d.value("qualified", x.name);
    if (!line_ok(d.at("begin")) || !line_ok(d.at("end")) || !line_ok(d.at("name_line")))
      return "definition " + x.name + " has a bad line number";
    x.begin = d["begin"].get<size_t>();
    x.end = d["end"].get<size_t>();
    x.name_line = d["name_line"].get<size_t>();
    x.valid = d.at("valid").get<bool>();
    x.why = d.value("why", "");
    // The tool promises begin <= name <= end; a report breaking that is not
    // trusted, and its name line is pinned inside the range so no reader
    // indexes a line outside the definition (found by fuzz_cxx_scope).
    if (!(x.begin <= x.name_line && x.name_line <= x.end)) {
      x.valid = false;
      x.why = "range does not hold its name";
      x.name_line = x.begin;
    }
    f.definitions.push_back(std::move(x));
  }
  auto ina = spans(r.at("inactive"), "inactive");
  if (!ina) return ina.error();
  f.inactive = *ina;
  auto mac = spans(r.at("macros"), "macros");
  if (!mac) return mac.error();
  f.macros = *mac;
  for (const auto& d : r.at("diagnostics")) {
    Diagnostic x;
    x.severity = d.at("severity").get<std::string>();
    x.file = d.value("file", "");
    if (d.contains("line")) {
      if (!line_ok(d["line"])) return std::string("a diagnostic has a bad line number");
      x.line = d["line"].get<size_t>();
    }
    x.message = d.at("message").get<std::string>();
    f.diagnostics.push_back(std::move(x));
  }
  for (const auto& m : r.at("missing_headers")) f.missing_headers.push_back(m.get<std::string>());
  f.seconds = r.value("seconds", 0.0);
  return f;
}

}  // namespace

Result<std::vector<FileReport>> parse_reports(std::string_view json_text) {
  std::vector<FileReport> out;
  try {
    json j = json::parse(json_text);
    if (!j.is_array()) return std::string("the scope tool's output is not a JSON array");
    for (const auto& r : j) {
      auto f = one(r);
      if (!f) return "the scope tool's output is malformed: " + f.error();
      out.push_back(std::move(*f));
    }
  } catch (const json::exception& e) {
    return std::string("the scope tool's output is malformed: ") + e.what();
  }
  return out;
}

bool is_cxx_path(std::string_view path) {
  for (const char* e : {".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx", ".cu", ".cuh"})
    if (ends_with(path, e)) return true;
  return false;
}

}  // namespace cxxscope
