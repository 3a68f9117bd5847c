#include "compile_check.h"

#include <nlohmann/json.hpp>

#include "paths.h"
#include "pipe_run.h"

namespace patcher {
namespace {

// Fragments are written for a spot inside a function or loop, so a fragment
// that fails as a module is retried inside def/async def + while bodies.
constexpr const char* kScript = R"PY(
import ast, json, sys
units = json.load(sys.stdin)
out = []
def attempt(src, name):
    try:
        compile(src, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        return None
    except SyntaxError as e:
        return [e.lineno or 0, e.msg]
    except ValueError as e:
        return [0, str(e)]
for u in units:
    err = attempt(u["text"], u["name"])
    if err and u["fragment"]:
        body = "".join(("        " + l) if l.strip() else l for l in u["text"].splitlines(True))
        for head in ("def _overlay_fragment():\n    while True:\n",
                     "async def _overlay_fragment():\n    while True:\n"):
            if attempt(head + body + "\n", u["name"]) is None:
                err = None
                break
    if err:
        out.append({"name": u["name"], "line": err[0], "message": err[1]})
json.dump(out, sys.stdout)
)PY";

}  // namespace

Result<std::vector<CompileError>> compile_units(const std::string& python, const std::vector<CompileUnit>& units) {
  nlohmann::json in = nlohmann::json::array();
  for (const auto& u : units) in.push_back({{"name", u.name}, {"text", u.text}, {"fragment", u.fragment}});
  std::string input = in.dump();
  auto run = kvtier::run_with_input({python, "-c", kScript}, input, /*search_path=*/true);
  if (!run) return make_error(ErrorKind::Usage, python, "cannot run the interpreter (--python): " + run.error());
  if (!run->exited_ok())
    return make_error(ErrorKind::Usage, python, "the interpreter failed to run the compile check (is it Python 3.8+?)");
  const std::string& output = run->output;
  std::vector<CompileError> errors;
  try {
    auto j = nlohmann::json::parse(output);
    for (const auto& e : j)
      errors.push_back(CompileError{e.at("name").get<std::string>(), e.at("line").get<int>(),
                                    e.at("message").get<std::string>()});
  } catch (const nlohmann::json::exception&) {
    return make_error(ErrorKind::Usage, python, "the interpreter returned unreadable compile results");
  }
  return errors;
}

}  // namespace patcher
