#include "conventions.h"

#include <set>
#include <vector>

#include "kvtier_build_info.h"
#include "suggest.h"

namespace kvtier::cli {

std::string version_text(std::string_view tool) {
  return std::string(tool) + " " + KVTIER_VERSION + "\n" + KVTIER_BUILD_LINES;
}

const char* exit_code_help() {
  return "Exit codes (the same in overlay, kvstore and the docker/ scripts):\n"
         "  0  ok\n"
         "  1  not as expected: check found another state; verify found problems; gc found damage (a dry\n"
         "     run) or left some (a sweep); invalid chunk\n"
         "  2  usage error or bad input; nothing was written\n"
         "  3  drift: a pin or anchor does not match the tree, or its engine release has no manifests here\n"
         "  4  refused for safety: tampered, stale or half-applied tree; sweep refused\n"
         "  5  an injected source does not compile (--check-injected)\n"
         "  6  I/O error\n"
         "  7  busy: another process holds the tree's or the store's lock\n"
         "  8  no store here: ROOT holds no kvtier store (an empty folder included)\n";
}

const char* exit_code_name(int code) {
  switch (code) {
    case exit_code::kOk: return "ok";
    case exit_code::kNotExpected: return "not_expected";
    case exit_code::kUsage: return "usage";
    case exit_code::kDrift: return "drift";
    case exit_code::kUnsafe: return "unsafe";
    case exit_code::kCompile: return "compile";
    case exit_code::kIo: return "io";
    case exit_code::kBusy: return "busy";
    case exit_code::kNoStore: return "no_store";
    default: return "error";
  }
}

namespace {

struct Scope {
  std::vector<std::string> names;  // "--json", "-q"
  std::set<std::string> takes_value;
};

void add_options(const CLI::App& app, Scope& s) {
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_positional() && o->get_lnames().empty() && o->get_snames().empty()) continue;
    bool value = o->get_type_size() != 0;
    for (const auto& n : o->get_lnames()) {
      s.names.push_back("--" + n);
      if (value) s.takes_value.insert("--" + n);
    }
    for (const auto& n : o->get_snames()) {
      s.names.push_back("-" + n);
      if (value) s.takes_value.insert("-" + n);
    }
  }
}

}  // namespace

std::string precheck(const CLI::App& app, int argc, const char* const* argv) {
  std::vector<std::string> subs;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) subs.push_back(sub->get_name());
  Scope scope;
  add_options(app, scope);
  scope.names.insert(scope.names.end(), {"--version", "-h", "--help"});
  const CLI::App* current = nullptr;
  for (int i = 1; i < argc; ++i) {
    std::string tok = argv[i];
    if (tok == "--") break;
    if (tok.size() > 1 && tok[0] == '-') {
      std::string name = tok.substr(0, tok.find('='));
      bool known = false;
      for (const auto& n : scope.names) known = known || n == name;
      if (!known) {
        std::string where = current ? " for '" + current->get_name() + "'" : "";
        // An option of another subcommand is named as such: "did you mean
        // '--help'?" for `kvstore verify --keep` sent the user the wrong way.
        std::string owners;
        for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
          if (sub == current) continue;
          Scope other;
          add_options(*sub, other);
          for (const auto& n : other.names)
            if (n == name) owners += (owners.empty() ? "'" : ", '") + sub->get_name() + "'";
        }
        if (!owners.empty()) return "unknown option '" + name + "'" + where + "; it belongs to " + owners;
        std::string hint = nearest(name, scope.names);
        return "unknown option '" + name + "'" + where + (hint.empty() ? "" : "; did you mean '" + hint + "'?");
      }
      if (tok.find('=') == std::string::npos && scope.takes_value.count(name)) ++i;
      continue;
    }
    if (current == nullptr) {
      bool is_sub = false;
      for (const auto& s : subs) is_sub = is_sub || s == tok;
      if (!is_sub) {
        std::string hint = nearest(tok, subs);
        return "unknown command '" + tok + "'" + (hint.empty() ? "" : "; did you mean '" + hint + "'?");
      }
      current = app.get_subcommand(tok);
      add_options(*current, scope);
    }
  }
  return "";
}

bool wants_json(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--json") return true;
  }
  return false;
}

nlohmann::json error_json(std::string_view tool, std::string_view command, int code, std::string_view message) {
  return {{"schema_version", kSchemaVersion},
          {"tool", tool},
          {"command", command},
          {"ok", false},
          {"exit_code", code},
          {"error", {{"kind", exit_code_name(code)}, {"message", message}}}};
}

}  // namespace kvtier::cli
