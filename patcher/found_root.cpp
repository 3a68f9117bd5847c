#include "found_root.h"

#include <nlohmann/json.hpp>

namespace patcher {
namespace {

nlohmann::json parse(const char* text) {
  if (text == nullptr) return nullptr;
  auto j = nlohmann::json::parse(text, nullptr, false);
  return j.is_object() ? j : nullptr;
}

std::string str(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

PipEnv read_pip_env(const char* json_text) {
  auto j = parse(json_text);
  if (j.is_null()) return {};
  return {true, str(j, "python")};
}

Result<FoundRoot> root_from_pip_env(const char* json_text, const std::string& engine) {
  auto j = parse(json_text);
  if (j.is_null() || str(j, "engine") != engine || !j.contains("found") || !j["found"].is_array())
    return make_error(ErrorKind::Usage, "", "ROOT is required: pass ROOT or --root ROOT");
  std::string python = str(j, "python");
  const auto& found = j["found"];
  std::vector<std::string> skipped;
  if (auto it = j.find("skipped"); it != j.end() && it->is_array())
    for (const auto& s : *it)
      if (s.is_string()) skipped.push_back("skipped " + s.get<std::string>());
  if (found.size() == 1 && found[0].is_object()) {
    const auto& f = found[0];
    return FoundRoot{str(f, "root"), "no ROOT given: using " + str(f, "root") + " (" + engine + " " +
                                         str(f, "version") + ", " + str(f, "dist_info") + ", installed for " +
                                         python + ")"};
  }
  Error e;
  if (found.empty()) {
    e = make_error(ErrorKind::Usage, "",
                   "no ROOT given and no " + engine + " distribution is installed for " + python +
                       " (searched its sys.path); pass ROOT or --root ROOT");
  } else {
    e = make_error(ErrorKind::Usage, "",
                   "no ROOT given and " + std::to_string(found.size()) + " " + engine +
                       " distributions are installed for " + python + "; pass the one to act on as ROOT");
    for (const auto& f : found)
      if (f.is_object()) e.details.push_back(str(f, "root") + " (" + engine + " " + str(f, "version") + ")");
  }
  e.details.insert(e.details.end(), skipped.begin(), skipped.end());
  return e;
}

}  // namespace patcher
