#include "api_pins.h"

#include <set>
#include <toml++/toml.h>

namespace patcher {

std::string ApiUse::symbol() const {
  if (kind == "local") return file + ": " + (scope.empty() ? "module level" : scope) + ": " + name;
  std::string s = module;
  if (!name.empty()) s += "." + name;
  if (!member.empty()) s += "." + member;
  return s;
}

namespace {

const std::set<std::string> kKinds = {"module", "name", "member", "local", "abstract"};
const std::set<std::string> kKeys = {"kind",     "module",    "name",    "member",  "is",      "defined_in",
                                     "file",     "scope",     "type",    "annotation", "present", "params",  "keywords",
                                     "signature", "methods",  "used_by"};

Error bad(const std::string& file, const toml::node& n, const std::string& msg) {
  return make_error(ErrorKind::Usage, file, "line " + std::to_string(n.source().begin.line) + ": " + msg);
}

Result<std::vector<std::string>> strings(const std::string& file, const toml::table& t, const char* key) {
  std::vector<std::string> out;
  const toml::node* n = t.get(key);
  if (!n) return out;
  const toml::array* a = n->as_array();
  if (!a) return bad(file, *n, std::string("\"") + key + "\" must be an array of strings");
  for (const toml::node& x : *a) {
    if (!x.is_string()) return bad(file, x, std::string("\"") + key + "\" must be an array of strings");
    out.push_back(std::string(*x.value<std::string>()));
  }
  return out;
}

}  // namespace

Result<ApiPins> parse_api_pins(const std::string& toml_text, const std::string& display_path,
                               const std::string& overlay) {
  toml::table root;
  try {
    root = toml::parse(toml_text, display_path);
  } catch (const toml::parse_error& e) {
    return make_error(ErrorKind::Usage, display_path,
                      "line " + std::to_string(e.source().begin.line) + ": " + std::string(e.description()));
  }
  ApiPins pins;
  pins.file = display_path;
  auto o = root["overlay"].value<std::string>();
  if (!o || *o != overlay)
    return make_error(ErrorKind::Usage, display_path,
                      "overlay = \"" + o.value_or("") + "\" does not match the manifest's \"" + overlay + "\"");
  pins.overlay = overlay;
  if (root["format"].value<int64_t>().value_or(0) != 1)
    return make_error(ErrorKind::Usage, display_path, "format must be 1");
  const toml::array* uses = root["uses"].as_array();
  if (!uses) return pins;
  for (const toml::node& n : *uses) {
    const toml::table* t = n.as_table();
    if (!t) return bad(display_path, n, "every [[uses]] entry must be a table");
    ApiUse u;
    u.line = static_cast<int>(n.source().begin.line);
    for (auto&& [k, v] : *t)
      if (!kKeys.count(std::string(k.str())))
        return bad(display_path, v, "unknown key \"" + std::string(k.str()) + "\" in [[uses]]");
    auto str = [&](const char* key) { return std::string((*t)[key].value<std::string>().value_or("")); };
    u.kind = str("kind");
    if (!kKinds.count(u.kind)) return bad(display_path, n, "kind = \"" + u.kind + "\" is not a kind of use");
    u.module = str("module");
    u.name = str("name");
    u.member = str("member");
    u.is = str("is");
    u.file = str("file");
    u.scope = str("scope");
    u.type = str("type");
    u.annotation = str("annotation");
    u.present = (*t)["present"].value<bool>().value_or(true);
    for (auto [key, dest] : {std::pair{"params", &u.params}, std::pair{"keywords", &u.keywords},
                             std::pair{"methods", &u.methods}, std::pair{"used_by", &u.used_by}}) {
      auto list = strings(display_path, *t, key);
      if (!list) return list.error();
      *dest = std::move(*list);
    }
    if (t->contains("signature")) {
      auto sig = strings(display_path, *t, "signature");
      if (!sig) return sig.error();
      u.signature = std::move(*sig);
    }
    bool ok = u.kind == "local" ? !u.file.empty() && !u.name.empty()
                                : !u.module.empty() && (u.kind == "module" || !u.name.empty()) &&
                                      (u.kind != "member" || !u.member.empty());
    if (!ok) return bad(display_path, n, "a \"" + u.kind + "\" use lacks the names it needs");
    pins.uses.push_back(std::move(u));
  }
  return pins;
}

}  // namespace patcher
