#include "fault.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

namespace patcher {
namespace {

struct FaultConfig {
  bool loaded = false;
  bool list = false;
  std::string step;
  int nth = 1;
  int err = 0;  // 0: kill; else inject this errno
  std::map<std::string, int> seen;
};

FaultConfig& config() {
  static FaultConfig c;
  if (c.loaded) return c;
  c.loaded = true;
  const char* env = std::getenv("OVERLAY_FAULT");
  if (!env || !*env) return c;
  std::string s = env;
  if (s == "list") {
    c.list = true;
    return c;
  }
  if (auto at = s.find('@'); at != std::string::npos) {
    std::string name = s.substr(0, at);
    s = s.substr(at + 1);
    static const std::map<std::string, int> names = {
        {"ENOSPC", ENOSPC}, {"EACCES", EACCES}, {"EROFS", EROFS}, {"EIO", EIO}, {"EDQUOT", EDQUOT}};
    auto it = names.find(name);
    c.err = it == names.end() ? EIO : it->second;
  }
  if (auto colon = s.rfind(':'); colon != std::string::npos) {
    c.nth = std::atoi(s.c_str() + colon + 1);
    s = s.substr(0, colon);
  }
  c.step = s;
  return c;
}

}  // namespace

void fault_reset() { config() = FaultConfig{}; }

int fault(const char* step) {
  FaultConfig& c = config();
  if (c.list) {
    std::string line = std::string("overlay-fault-step ") + step + "\n";
    (void)!write(2, line.data(), line.size());
    return 0;
  }
  if (c.step.empty() || c.step != step) return 0;
  int n = ++c.seen[step];
  if (n != c.nth) return 0;
  if (c.err) return c.err;
  _exit(kFaultExitCode);
}

}  // namespace patcher
