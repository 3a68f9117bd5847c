#include "fault.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

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

using Clock = std::chrono::steady_clock;
std::atomic<std::uint64_t> g_pace{0};  // bytes/s, 0: none
std::mutex g_pace_mutex;
Clock::time_point g_pace_free;  // when the reads so far are paid for

std::mutex g_hold_mutex;
std::condition_variable g_hold_changed;
std::optional<std::string> g_hold;  // the prefix held, if any

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

void pace_read(std::uint64_t bytes) {
  const std::uint64_t pace = g_pace.load(std::memory_order_relaxed);
  if (pace == 0) return;
  Clock::time_point until;
  {
    std::lock_guard lock(g_pace_mutex);
    const auto cost = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(static_cast<double>(bytes) / static_cast<double>(pace)));
    g_pace_free = std::max(g_pace_free, Clock::now()) + cost;
    until = g_pace_free;
  }
  std::this_thread::sleep_until(until);
}

void set_read_pace(std::uint64_t bytes_per_second) {
  std::lock_guard lock(g_pace_mutex);
  g_pace_free = Clock::now();
  g_pace.store(bytes_per_second, std::memory_order_relaxed);
}

void wait_while_held(const char* path) {
  if (!path) return;
  std::unique_lock lock(g_hold_mutex);
  g_hold_changed.wait(lock, [&] { return !g_hold || !std::string_view(path).starts_with(*g_hold); });
}

void set_read_hold(const char* prefix) {
  {
    std::lock_guard lock(g_hold_mutex);
    g_hold = prefix ? std::optional<std::string>(prefix) : std::nullopt;
  }
  g_hold_changed.notify_all();
}

}  // namespace storeio
