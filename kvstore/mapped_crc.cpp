#include "kvtier/kvstore/mapped_crc.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <span>

#include "kvtier/format/crc32.h"
#include "kvtier/kvstore/walk.h"

namespace kvstore {

namespace {

// Mapped in windows so a huge chunk never needs one huge mapping.
constexpr uint64_t kWindow = uint64_t{64} << 20;

thread_local sigjmp_buf* tl_recover = nullptr;
struct sigaction previous_sigbus;

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  if (tl_recover != nullptr) siglongjmp(*tl_recover, 1);
  // Not raised inside crc_mapped: behave as before we were installed.
  if (previous_sigbus.sa_flags & SA_SIGINFO) {
    if (previous_sigbus.sa_sigaction) return previous_sigbus.sa_sigaction(sig, info, ctx);
  } else if (previous_sigbus.sa_handler != SIG_DFL && previous_sigbus.sa_handler != SIG_IGN) {
    return previous_sigbus.sa_handler(sig);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &previous_sigbus);
  });
}

}  // namespace

Result<uint32_t> crc_mapped(int fd, uint64_t size, uint64_t from, uint32_t crc) {
  install_handler();
  for (uint64_t base = from - from % kWindow; base < size; base += kWindow) {
    size_t len = static_cast<size_t>(std::min(kWindow, size - base));
    void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, static_cast<off_t>(base));
    if (p == MAP_FAILED) return io_error("", errno, "mmap");
    const auto* bytes = static_cast<const uint8_t*>(p);
    size_t skip = base < from ? static_cast<size_t>(from - base) : 0;
    sigjmp_buf recover;
    volatile bool shrank = false;
    // No signal mask to save (a syscall per window): SA_NODEFER leaves SIGBUS
    // unblocked inside the handler, so jumping out of it needs no restore.
    if (sigsetjmp(recover, 0) == 0) {
      tl_recover = &recover;
      crc = kvformat::crc32(std::span<const uint8_t>(bytes + skip, len - skip), crc);
    } else {
      shrank = true;
    }
    tl_recover = nullptr;
    ::munmap(p, len);
    if (shrank) {
      Error e;
      e.kind = ErrorKind::kInvalid;
      e.message = "file shrank while being read";
      return e;
    }
  }
  return crc;
}

}  // namespace kvstore
