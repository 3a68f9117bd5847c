#include "run.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

extern char** environ;

namespace cxxscope {
namespace {

bool executable(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

}  // namespace

std::string find_tool(const std::string& exe_path) {
  if (const char* env = std::getenv("KVTIER_CXXSCOPE"); env && *env) return env;
  std::string dir = exe_path.substr(0, exe_path.rfind('/') == std::string::npos ? 0 : exe_path.rfind('/'));
  if (dir.empty()) dir = ".";
  for (const std::string& c : {dir + "/kvtier-cxxscope", dir + "/../cxxscope/kvtier-cxxscope"})
    if (executable(c)) return c;
  return "";
}

Result<std::vector<FileReport>> run_tool(const std::string& tool, const std::vector<Request>& requests) {
  if (tool.empty())
    return std::string(
        "kvtier-cxxscope is not built or installed (it needs Clang 14 LibTooling: libclang-14-dev "
        "libclang-cpp14-dev); set KVTIER_CXXSCOPE to its path");
  nlohmann::json in = nlohmann::json::array();
  for (const auto& r : requests) {
    nlohmann::json files = nlohmann::json::object();
    for (const auto& [p, t] : r.files) files[p] = t;
    in.push_back({{"root", r.root}, {"file", r.file}, {"args", r.args}, {"files", files}});
  }
  std::string input = in.dump();
  int to_child[2], from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) return "cannot create a pipe: " + std::string(std::strerror(errno));
  if (::pipe2(from_child, O_CLOEXEC) != 0) {
    ::close(to_child[0]);
    ::close(to_child[1]);
    return "cannot create a pipe: " + std::string(std::strerror(errno));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  std::vector<char*> argv = {const_cast<char*>(tool.c_str()), nullptr};
  pid_t pid = 0;
  int rc = posix_spawn(&pid, tool.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (rc != 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    return "cannot run " + tool + ": " + std::strerror(rc);
  }
  // Write on a thread while reading here: both pipes may fill.
  std::thread writer([&] {
    size_t done = 0;
    while (done < input.size()) {
      ssize_t n = ::write(to_child[1], input.data() + done, input.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(to_child[1]);
  });
  std::string output;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(from_child[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buf, static_cast<size_t>(n));
  }
  ::close(from_child[0]);
  writer.join();
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return tool + " failed (" +
           (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                              : "signal " + std::to_string(WTERMSIG(status))) +
           ")";
  auto reports = parse_reports(output);
  if (!reports) return reports.error();
  if (reports->size() != requests.size()) return tool + " answered " + std::to_string(reports->size()) +
                                                 " results for " + std::to_string(requests.size()) + " files";
  return reports;
}

}  // namespace cxxscope
