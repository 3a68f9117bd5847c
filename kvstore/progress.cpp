#include "kvtier/kvstore/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

namespace kvstore {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

bool Progress::stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(bool enabled, std::string label) : enabled_(enabled), label_(std::move(label)) {
  if (!enabled_) return;
  start_ns_ = now_ns();
  thread_ = std::thread([this] { loop(); });
}

Progress::~Progress() { finish(); }

void Progress::loop() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, std::chrono::milliseconds(250));
    if (!stop_) draw();
  }
}

void Progress::draw() {
  double secs = static_cast<double>(now_ns() - start_ns_) / 1e9;
  uint64_t b = bytes_.load(std::memory_order_relaxed);
  double gbps = secs > 0 ? static_cast<double>(b) / secs / 1e9 : 0.0;
  std::string line = fmt::format("\r{}: {}/{} files, {:.2f}/{:.2f} GiB, {:.2f} GB/s\x1b[K", label_,
                                 files_.load(), total_files_.load(),
                                 static_cast<double>(b) / (1ULL << 30),
                                 static_cast<double>(total_bytes_.load()) / (1ULL << 30), gbps);
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_) return;
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::fputs("\r\x1b[K", stderr);
  std::fflush(stderr);
  enabled_ = false;
}

}  // namespace kvstore
