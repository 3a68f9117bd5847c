// Test-only fault hook. OVERLAY_FAULT selects one named step of a write:
//   OVERLAY_FAULT=<step>[:<n>]          _exit(kFaultExitCode) the n-th time (default 1st)
//                                       <step> is reached, as a kill would.
//   OVERLAY_FAULT=<ERRNO>@<step>[:<n>]  the I/O at that step fails with ERRNO
//                                       (ENOSPC, EACCES, EROFS, EIO, EDQUOT).
//   OVERLAY_FAULT=list                  write "overlay-fault-step <step>" to stderr
//                                       at every step, so tests can kill at each.
#pragma once

namespace patcher {

inline constexpr int kFaultExitCode = 99;

// Marks a step. Returns 0, or the errno the I/O at this step must fail with.
int fault(const char* step);

// Re-reads the environment (tests run several scenarios in one process).
void fault_reset();

}  // namespace patcher
