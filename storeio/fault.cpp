#include "fault.h"

#include <atomic>
#include <mutex>

#include "kvtier/store_abi.h"

namespace storeio {
namespace {

struct Plan {
  std::int32_t op = KVTIER_FAULT_NONE;
  std::int32_t err = 0;
  std::uint32_t skip = 0;
  std::uint32_t count = 0;
};

std::mutex g_mutex;
Plan g_plan;
// Read without the lock on every system call: the common case (no plan)
// then costs one relaxed load.
std::atomic<bool> g_armed{false};

}  // namespace

int injected_fault(std::int32_t op) {
  if (!g_armed.load(std::memory_order_relaxed)) return 0;
  std::lock_guard lock(g_mutex);
  if (g_plan.op != op || g_plan.count == 0) return 0;
  if (g_plan.skip > 0) {
    --g_plan.skip;
    return 0;
  }
  --g_plan.count;
  return g_plan.err;
}

void set_fault(std::int32_t op, std::int32_t err, std::uint32_t skip, std::uint32_t count) {
  std::lock_guard lock(g_mutex);
  g_plan = Plan{op, err, skip, count};
  g_armed.store(op != KVTIER_FAULT_NONE && count > 0, std::memory_order_relaxed);
}

}  // namespace storeio
