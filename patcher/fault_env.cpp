// The OVERLAY_FAULT hook, linked only into the test-only `overlay-faults`
// binary (never into `overlay`). It installs itself when the program starts.
//   OVERLAY_FAULT=<step>[:<n>]          _exit(kFaultExitCode) the n-th time (default 1st)
//                                       <step> is reached, as a kill would.
//   OVERLAY_FAULT=<ERRNO>@<step>[:<n>]  the I/O at that step fails with ERRNO
//                                       (ENOSPC, EACCES, EROFS, EIO, EDQUOT).
//   OVERLAY_FAULT=pause@<step>[:<n>]    stop the process (SIGSTOP) there, after
//                                       writing "overlay-fault-paused <step>" to
//                                       stderr: a test changes the tree, then
//                                       sends SIGCONT (another process racing it).
//   OVERLAY_FAULT=list                  write "overlay-fault-step <step>" to stderr
//                                       at every step, so tests can kill at each.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <string>

#include "fault.h"

namespace patcher {
namespace {

constexpr int kFaultExitCode = 99;

class EnvFaultHook : public FaultHook {
 public:
  EnvFaultHook() {
    const char* env = std::getenv("OVERLAY_FAULT");
    if (!env || !*env) return;
    std::string s = env;
    if (s == "list") {
      list_ = true;
      return;
    }
    if (auto at = s.find('@'); at != std::string::npos && s.substr(0, at) == "pause") {
      pause_ = true;
      s = s.substr(at + 1);
    } else if (at != std::string::npos) {
      static const std::map<std::string, int> names = {
          {"ENOSPC", ENOSPC}, {"EACCES", EACCES}, {"EROFS", EROFS}, {"EIO", EIO}, {"EDQUOT", EDQUOT}};
      auto it = names.find(s.substr(0, at));
      err_ = it == names.end() ? EIO : it->second;
      s = s.substr(at + 1);
    }
    if (auto colon = s.rfind(':'); colon != std::string::npos) {
      nth_ = std::atoi(s.c_str() + colon + 1);
      s = s.substr(0, colon);
    }
    step_ = s;
  }

  int at(const char* step) override {
    if (list_) {
      std::string line = std::string("overlay-fault-step ") + step + "\n";
      (void)!::write(2, line.data(), line.size());
      return 0;
    }
    if (step_.empty() || step_ != step) return 0;
    if (++seen_[step_] != nth_) return 0;
    if (pause_) {
      std::string line = std::string("overlay-fault-paused ") + step + "\n";
      (void)!::write(2, line.data(), line.size());
      ::raise(SIGSTOP);
      return 0;
    }
    if (err_) return err_;
    _exit(kFaultExitCode);
  }

 private:
  bool list_ = false;
  bool pause_ = false;
  std::string step_;
  int nth_ = 1;
  int err_ = 0;  // 0: kill; else inject this errno
  std::map<std::string, int> seen_;
};

const bool installed = [] {
  static EnvFaultHook hook;
  set_fault_hook(&hook);
  return true;
}();

}  // namespace
}  // namespace patcher
