#include "run.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "pipe_run.h"

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
  auto run = kvtier::run_with_input({tool}, input, /*search_path=*/false);
  if (!run) return run.error();
  if (!run->exited_ok()) return tool + " failed (" + run->how_it_ended() + ")";
  const std::string& output = run->output;
  auto reports = parse_reports(output);
  if (!reports) return reports.error();
  if (reports->size() != requests.size()) return tool + " answered " + std::to_string(reports->size()) +
                                                 " results for " + std::to_string(requests.size()) + " files";
  return reports;
}

}  // namespace cxxscope
