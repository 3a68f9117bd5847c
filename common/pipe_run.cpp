#include "pipe_run.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace kvtier {

bool PipeRun::exited_ok() const { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }

std::string PipeRun::how_it_ended() const {
  if (WIFEXITED(wait_status)) return "exit " + std::to_string(WEXITSTATUS(wait_status));
  return "signal " + std::to_string(WTERMSIG(wait_status));
}

Result<PipeRun, std::string> run_with_input(const std::vector<std::string>& argv, const std::string& input,
                                            bool search_path) {
  if (argv.empty()) return std::string("no program to run");
  int to_child[2], from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) return "cannot create a pipe: " + std::string(std::strerror(errno));
  if (::pipe2(from_child, O_CLOEXEC) != 0) {
    int err = errno;
    ::close(to_child[0]);
    ::close(to_child[1]);
    return "cannot create a pipe: " + std::string(std::strerror(err));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = search_path ? posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ)
                       : posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (rc != 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    return "cannot run " + argv[0] + ": " + std::strerror(rc);
  }
  std::thread writer([&] {
    size_t done = 0;
    while (done < input.size()) {
      ssize_t n = ::write(to_child[1], input.data() + done, input.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the child died or closed stdin; its status says why
      done += static_cast<size_t>(n);
    }
    ::close(to_child[1]);
  });
  PipeRun run;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(from_child[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    run.output.append(buf, static_cast<size_t>(n));
  }
  ::close(from_child[0]);
  writer.join();
  while (::waitpid(pid, &run.wait_status, 0) < 0 && errno == EINTR) {
  }
  return run;
}

}  // namespace kvtier
