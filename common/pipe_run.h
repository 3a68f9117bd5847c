// Run a child process with bytes on its stdin and collect its stdout: how the
// overlay engine talks to the target's interpreter (compile check) and to the
// Clang scope tool. One implementation, so both get the same pipe handling.
#pragma once

#include <string>
#include <vector>

#include "result.h"

namespace kvtier {

// What a child printed on stdout, and how it ended.
struct PipeRun {
  std::string output;
  int wait_status = 0;  // as waitpid() reports it

  bool exited_ok() const;         // exited, with status 0
  std::string how_it_ended() const;  // "exit N" or "signal N"
};

// Runs argv (argv[0] looked up on PATH when search_path) with `input` on its
// stdin. The input is written on a thread while stdout is read here, so a child
// that answers before it has read everything cannot stall on a full pipe. The
// error names what failed (a pipe, the spawn) with errno's text; a child that
// runs and fails is a PipeRun whose exited_ok() is false.
Result<PipeRun, std::string> run_with_input(const std::vector<std::string>& argv, const std::string& input,
                                            bool search_path);

}  // namespace kvtier
