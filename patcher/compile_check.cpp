#include "compile_check.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "paths.h"

extern char** environ;

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
  int to_child[2], from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0)
    return make_error(ErrorKind::Io, python, "cannot create pipes: " + errno_text(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  std::string dash_c = "-c";
  std::vector<char*> argv = {const_cast<char*>(python.c_str()), dash_c.data(), const_cast<char*>(kScript), nullptr};
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, python.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (rc != 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    return make_error(ErrorKind::Usage, python, "cannot run the interpreter (--python): " + errno_text(rc));
  }
  size_t done = 0;
  while (done < input.size()) {
    ssize_t n = ::write(to_child[1], input.data() + done, input.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;  // the child died; its status says why
    }
    done += static_cast<size_t>(n);
  }
  ::close(to_child[1]);
  std::string output;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(from_child[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buf, static_cast<size_t>(n));
  }
  ::close(from_child[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return make_error(ErrorKind::Usage, python, "the interpreter failed to run the compile check (is it Python 3.8+?)");
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
