// A tiny parallel loop for the scan and verify passes (private to kvstorelib).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace kvstore {

// Threads for chunk reading: opt.threads, else min(4, cores).
inline unsigned reader_threads(unsigned requested) {
  return requested ? requested : std::min(4u, std::max(1u, std::thread::hardware_concurrency()));
}

// Runs fn(i) for i in [0, n) on up to `threads` threads.
template <class Fn>
void parallel_for(std::size_t n, unsigned threads, Fn fn) {
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  };
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(std::max<std::size_t>(n, 1))));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

}  // namespace kvstore
