#include "flags.h"

#include <nlohmann/json.hpp>

namespace cxxscope {
namespace {

std::string absolute(const std::string& p, const std::string& dir) {
  if (p.empty() || p[0] == '/' || dir.empty()) return p;
  return dir + "/" + p;
}

bool starts(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

std::vector<std::string> filter_flags(const std::vector<std::string>& argv, const std::string& directory) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    bool has_next = i + 1 < argv.size();
    if (a == "-I" || a == "-isystem" || a == "-include") {
      if (has_next) {
        out.push_back(a);
        out.push_back(absolute(argv[++i], directory));
      }
    } else if (a == "-D" || a == "-U") {
      if (has_next) {
        out.push_back(a);
        out.push_back(argv[++i]);
      }
    } else if (starts(a, "-isystem")) {
      out.push_back("-isystem");
      out.push_back(absolute(a.substr(8), directory));
    } else if (starts(a, "-include") && a.size() > 8) {
      out.push_back("-include");
      out.push_back(absolute(a.substr(8), directory));
    } else if (starts(a, "-I")) {
      out.push_back("-I" + absolute(a.substr(2), directory));
    } else if (starts(a, "-D") || starts(a, "-U") || starts(a, "-std=")) {
      out.push_back(a);
    }
  }
  return out;
}

std::vector<std::string> split_command(std::string_view command) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < command.size(); ++i) {
    char c = command[i];
    if (quote) {
      if (c == quote) quote = 0;
      else if (c == '\\' && quote == '"' && i + 1 < command.size()) cur += command[++i];
      else cur += c;
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\' && i + 1 < command.size()) {
      cur += command[++i];
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) out.push_back(cur);
      cur.clear();
      in_word = false;
    } else {
      cur += c;
      in_word = true;
    }
  }
  if (in_word) out.push_back(cur);
  return out;
}

Result<std::vector<std::string>> flags_from_compile_commands(std::string_view json_text, const std::string& file) {
  try {
    auto j = nlohmann::json::parse(json_text);
    if (!j.is_array()) return std::string("compile_commands.json is not a JSON array");
    for (const auto& e : j) {
      if (!e.is_object() || !e.contains("file") || !e["file"].is_string()) continue;
      std::string dir = e.contains("directory") && e["directory"].is_string() ? e["directory"].get<std::string>() : "";
      if (absolute(e["file"].get<std::string>(), dir) != file) continue;
      std::vector<std::string> argv;
      if (e.contains("arguments") && e["arguments"].is_array()) {
        for (const auto& a : e["arguments"])
          if (a.is_string()) argv.push_back(a.get<std::string>());
      } else if (e.contains("command") && e["command"].is_string()) {
        argv = split_command(e["command"].get<std::string>());
      } else {
        return "compile_commands.json: the entry for " + file + " has neither \"arguments\" nor \"command\"";
      }
      return filter_flags(argv, dir);
    }
  } catch (const nlohmann::json::exception& e) {
    return std::string("compile_commands.json is malformed: ") + e.what();
  }
  return "compile_commands.json has no entry for " + file;
}

}  // namespace cxxscope
