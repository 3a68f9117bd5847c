#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace storeio {

unsigned thread_count(std::uint32_t asked, std::size_t count) {
  std::size_t n = asked ? asked : std::max(1u, std::thread::hardware_concurrency());
  n = std::min(n, count);
  return static_cast<unsigned>(std::max<std::size_t>(n, 1));
}

void parallel_for(std::size_t count, unsigned threads, const std::function<void(std::size_t)>& fn) {
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(threads > 0 ? threads - 1 : 0);
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

}  // namespace storeio
