// Fault injection for crash tests, through an interface the tests provide
// (ninja's DiskInterface is the model). The library marks each named step of
// a write with fault("step"); a production binary installs no hook, so every
// step is a no-op there. The test-only binary `overlay-faults` links
// fault_env.cpp, which installs the OVERLAY_FAULT hook tests drive (kill or
// fail the I/O at any step; see docs/OVERLAYS.md).
#pragma once

namespace patcher {

class FaultHook {
 public:
  virtual ~FaultHook() = default;
  // Called at every step. Returns 0, or the errno the I/O at this step must
  // fail with; may end the process to simulate a kill.
  virtual int at(const char* step) = 0;
};

// Installs `hook` for the whole process (nullptr removes it).
void set_fault_hook(FaultHook* hook);

// Marks a step. Returns 0, or the errno the I/O at this step must fail with.
int fault(const char* step);

}  // namespace patcher
