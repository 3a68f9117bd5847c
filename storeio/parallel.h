// Runs fn(i) for i in [0, count) on `threads` threads (the caller's one
// among them). Items are taken in order from a shared counter, so the first
// items start first (a promotion's files are read front to back).
#pragma once

#include <cstddef>
#include <cstdint>

#include <functional>

namespace storeio {

// 0 threads: one per online core. Never more than count.
unsigned thread_count(std::uint32_t asked, std::size_t count);

void parallel_for(std::size_t count, unsigned threads, const std::function<void(std::size_t)>& fn);

}  // namespace storeio
